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
``b"prefixcache/v1"``; pass ``root_seed`` to change it (changing it invalidates every
stored hash, which later KV tiers rely on). This module reads no environment: the
configuration decides the seed and hands it in.

The page framing is written once, in :meth:`PageHasher.chain`; every page hash of the
project (text or multimodal pages, one page or a whole prompt) goes through it.
"""
from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat

DEFAULT_ROOT_SEED = b"prefixcache/v1"
DIGEST_BYTES = 16  # 128 bits

HashFn = Callable[[bytes], bytes]


def blake2b_128(data: bytes) -> bytes:
    """BLAKE2b with a 16-byte (128-bit) digest."""
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def seed_digest(root_seed: bytes | str) -> str:
    """32 hex digits of BLAKE2b-128 over the framed ``root_seed``: two processes compare
    these to know they hash pages under the same seed without either revealing it (a
    seed meant to stay secret should be random: a short word can be guessed from this)."""
    raw = root_seed.encode() if isinstance(root_seed, str) else bytes(root_seed)
    return blake2b_128(encode_parts("prefixcache-seed-check", raw)).hex()


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


def bytes_to_tokens(raw: bytes) -> list[int]:
    """The inverse of :func:`tokens_to_bytes`.

    Raises:
        ValueError: ``len(raw)`` is not a multiple of 4.
    """
    arr = array(_U32)
    arr.frombytes(raw)
    if _BYTESWAP:
        arr.byteswap()
    return arr.tolist()


class PageHasher:
    """Computes chain roots and page hashes for one model.

    Args:
        model_id: identifies the weights (a path or name); part of every root.
        root_seed: bytes or str; ``None`` means :data:`DEFAULT_ROOT_SEED`.
        hash_fn: ``bytes -> bytes`` with digests of one fixed size; default BLAKE2b-128.
            Tests may inject a weak hash to force collisions; the index never trusts
            the hash alone.

    Raises:
        TypeError: ``root_seed`` is not ``str``, ``bytes`` or ``None``.
    """

    def __init__(self, model_id: str = "", root_seed: bytes | str | None = None,
                 hash_fn: HashFn | None = None):
        if root_seed is None:
            root_seed = DEFAULT_ROOT_SEED
        elif isinstance(root_seed, str):
            root_seed = root_seed.encode()
        elif not isinstance(root_seed, (bytes, bytearray)):
            raise TypeError(f"root_seed must be str, bytes or None, got "
                            f"{type(root_seed).__name__}")
        self.model_id = model_id
        self.root_seed = bytes(root_seed)
        self.hash_fn: HashFn = hash_fn or blake2b_128

    def root_key(self, tenant: str | None = None, cache_salt: str | None = None) -> bytes:
        """The encoded chain-root input for a namespace (kept for exact verification)."""
        return encode_parts("prefixcache-root", self.root_seed, self.model_id,
                            ("tenant", tenant), ("cache_salt", cache_salt))

    def root_hash(self, root_key: bytes) -> bytes:
        return self.hash_fn(root_key)

    def chain(self, prev: bytes, raw: bytes, extras: bytes | Sequence[bytes],
              page_bytes: int) -> list[bytes]:
        """Hashes of consecutive full pages continuing the chain after ``prev``.

        Page ``j`` hashes ``b"P" + >II(len(parent), page_bytes) + parent + tokens_j +
        extra_j``, its parent being ``prev`` for ``j == 0``, else page ``j - 1``'s hash.

        Args:
            prev: the hash before the first page (the root hash for page 0).
            raw: the pages' tokens from :func:`tokens_to_bytes`, ``page_bytes`` each.
            extras: one :meth:`extra_bytes` for every page, or a sequence with one
                per page.
            page_bytes: bytes per page (``4 * block_size``).

        Returns:
            ``len(raw) // page_bytes`` hashes, in page order.

        Raises:
            ValueError: ``page_bytes < 1``, ``raw`` is not whole pages, or ``extras``
                has not one entry per page.
        """
        if page_bytes < 1:
            raise ValueError(f"page_bytes must be >= 1, got {page_bytes}")
        n, rest = divmod(len(raw), page_bytes)
        if rest:
            raise ValueError(f"raw holds {len(raw)} bytes, not whole pages of {page_bytes}")
        if not isinstance(extras, (bytes, bytearray)) and len(extras) != n:
            raise ValueError(f"extras has {len(extras)} entries for {n} pages")
        ex = repeat(extras, n) if isinstance(extras, (bytes, bytearray)) else extras
        # The head depends only on the parent's length: digests have one fixed size.
        head = b"P" + struct.pack(">II", len(prev), page_bytes)
        hash_fn = self.hash_fn
        out: list[bytes] = []
        append = out.append
        for off, extra in zip(range(0, n * page_bytes, page_bytes), ex):
            prev = hash_fn(head + prev + raw[off:off + page_bytes] + extra)
            append(prev)
        return out

    def page_hash(self, parent_hash: bytes, token_bytes: bytes, extra: bytes) -> bytes:
        """Hash of one full page (:meth:`chain` over a single page). ``token_bytes``
        from :func:`tokens_to_bytes`; ``extra`` from :meth:`extra_bytes`."""
        return self.chain(parent_hash, token_bytes, extra, len(token_bytes))[0]

    @staticmethod
    def extra_bytes(extra_keys: tuple = (), mm_hashes: tuple = ()) -> bytes:
        """Encode a page's extra keys: request-level keys (e.g. ``("adapter", id,
        version)``) and the content hashes of multimodal inputs overlapping the page."""
        return encode_parts(("extra", tuple(extra_keys)), ("mm", tuple(mm_hashes)))
