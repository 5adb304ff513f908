"""Page hashes: a chained, collision-resistant hash per full page.

``h_i = H(h_{i-1}, tokens of page i, extra_keys_i)`` with the chain root
``h_{-1} = H(root_seed, model_id, namespace)``; ``namespace`` folds in the tenant and the
request's ``cache_salt``. ``extra_keys`` carry what else changes a page's KV for the same
tokens (an adapter id with its version, multimodal content hashes).

Every key part is encoded typed and length-prefixed (:func:`encode_parts`), so two
different requests can never serialize alike: an adapter named ``"x"`` and a salt ``"x"``
give different inputs, ``("ab", "c")`` and ``("a", "bc")`` too.

``H`` is BLAKE2b with a 128-bit digest (RFC 7693), never Python's ``hash()``: the result
is stable across processes and restarts for the same root seed. The default root seed is
``b"prefixcache/v1"``; set ``PREFIXCACHE_HASH_SEED`` or pass ``root_seed`` to change it
(changing it invalidates every stored hash, which later KV tiers rely on).
"""
from __future__ import annotations

import hashlib
import os
import struct
import sys
from array import array
from typing import Callable, Iterable

DEFAULT_ROOT_SEED = b"prefixcache/v1"
DIGEST_BYTES = 16  # 128 bits

HashFn = Callable[[bytes], bytes]


def blake2b_128(data: bytes) -> bytes:
    """BLAKE2b with a 16-byte (128-bit) digest."""
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def encode_parts(*parts: object) -> bytes:
    """Typed, length-prefixed encoding of key parts.

    Supported types: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, and
    ``tuple``/``list`` of these (nested). Each part is a one-byte type tag, then a
    4-byte big-endian length (or the fixed-size value), then the payload.

    Raises:
        TypeError: a part has an unsupported type.
    """
    out = bytearray()
    for p in parts:
        _encode_one(p, out)
    return bytes(out)


def _encode_one(p: object, out: bytearray) -> None:
    if p is None:
        out += b"N"
    elif isinstance(p, bool):
        out += b"B\x01" if p else b"B\x00"
    elif isinstance(p, int):
        raw = str(int(p)).encode()  # int(): an IntEnum member encodes as its value
        out += b"I" + struct.pack(">I", len(raw)) + raw
    elif isinstance(p, float):
        out += b"F" + struct.pack(">d", p)
    elif isinstance(p, str):
        raw = p.encode("utf-8")
        out += b"S" + struct.pack(">I", len(raw)) + raw
    elif isinstance(p, (bytes, bytearray, memoryview)):
        raw = bytes(p)
        out += b"Y" + struct.pack(">I", len(raw)) + raw
    elif isinstance(p, (tuple, list)):
        out += b"T" + struct.pack(">I", len(p))
        for q in p:
            _encode_one(q, out)
    else:
        raise TypeError(f"cannot encode key part of type {type(p).__name__}")


def tokens_to_bytes(token_ids: Iterable[int]) -> bytes:
    """Token ids as unsigned 32-bit little-endian bytes (4 bytes per token).

    Raises:
        OverflowError: a token id is negative or does not fit in 32 bits.
    """
    arr = array(_U32, token_ids)
    if _BYTESWAP:
        arr.byteswap()
    return arr.tobytes()


# The array type code of a 4-byte unsigned int ("I" on every mainstream platform), and
# whether this machine must swap to little-endian, so hashes agree across machines.
_U32 = next(c for c in "IL" if array(c).itemsize == 4)
_BYTESWAP = sys.byteorder == "big"


def root_seed_from_env() -> bytes:
    seed = os.environ.get("PREFIXCACHE_HASH_SEED")
    return seed.encode() if seed else DEFAULT_ROOT_SEED


class PageHasher:
    """Computes chain roots and page hashes for one model.

    Args:
        model_id: identifies the weights (a path or name); part of every root.
        root_seed: bytes or str; default from ``PREFIXCACHE_HASH_SEED`` or
            ``b"prefixcache/v1"``.
        hash_fn: ``bytes -> bytes``; default BLAKE2b-128. Tests may inject a weak hash
            to force collisions; the index never trusts the hash alone.
    """

    def __init__(self, model_id: str = "", root_seed: bytes | str | None = None,
                 hash_fn: HashFn | None = None):
        if root_seed is None:
            root_seed = root_seed_from_env()
        if isinstance(root_seed, str):
            root_seed = root_seed.encode()
        self.model_id = model_id
        self.root_seed = bytes(root_seed)
        self.hash_fn: HashFn = hash_fn or blake2b_128

    def root_key(self, tenant: str | None = None, cache_salt: str | None = None) -> bytes:
        """The encoded chain-root input for a namespace (kept for exact verification)."""
        return encode_parts("prefixcache-root", self.root_seed, self.model_id,
                            ("tenant", tenant), ("cache_salt", cache_salt))

    def root_hash(self, root_key: bytes) -> bytes:
        return self.hash_fn(root_key)

    def page_hash(self, parent_hash: bytes, token_bytes: bytes, extra: bytes) -> bytes:
        """Hash of one full page. ``token_bytes`` from :func:`tokens_to_bytes`;
        ``extra`` from :meth:`extra_bytes` (already typed and length-prefixed)."""
        return self.hash_fn(b"P" + struct.pack(">II", len(parent_hash), len(token_bytes))
                            + parent_hash + token_bytes + extra)

    @staticmethod
    def extra_bytes(extra_keys: tuple = (), mm_hashes: tuple = ()) -> bytes:
        """Encode a page's extra keys: request-level keys (e.g. ``("adapter", id,
        version)``) and the content hashes of multimodal inputs overlapping the page."""
        return encode_parts(("extra", tuple(extra_keys)), ("mm", tuple(mm_hashes)))
