"""The page-group value format shared by every KV tier (host RAM, disk, a shared store).

DESIGN: "Tier and store data is raw bytes with a fixed header: never pickled", and "a page is
read back only after its header, length and checksum verify". A page group is a few published
pages written together; its bytes are a fixed header followed by the raw payload::

    prefix   >4sHHI   magic b"PCKV", format version, 0 (reserved), header length H
    body     >H fp    fingerprint length, then the model fingerprint
             >IHI     n_pages, hash length, tokens per page (block_size)
             >H dt    dtype name length, then the dtype name (ASCII, e.g. "bfloat16")
             >B dims  ndim, then ndim x >Q: the shape of ONE page's payload
             >Q       payload length in bytes
             hashes   n_pages x hash length bytes, in group order
             tokens   n_pages x block_size x <I (unsigned 32-bit little-endian token ids)
    checksum 16 bytes BLAKE2b-128 of (prefix + body + payload)
    payload  n_pages x prod(page shape) x itemsize bytes, page-major

Bytes in, bytes out: nothing here knows torch. :func:`decode` raises :class:`CorruptEntry` on
any mismatch (magic, version, lengths, checksum, fingerprint, token count), and
:func:`check_pages` on a valid value that holds other pages than its key says (page hashes,
layout, token ids); callers turn either into a miss, remove the entry and count it.
:func:`read_header` parses the header alone (the disk tier rebuilds its index from files'
headers without reading their payloads).
"""
from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prefixcache.cache.hashing import tokens_to_bytes

MAGIC = b"PCKV"
FORMAT_VERSION = 1
CHECKSUM_BYTES = 16
_PREFIX = struct.Struct(">4sHHI")
_COUNTS = struct.Struct(">IHI")
MAX_HEADER_BYTES = 64 << 20  # a header larger than this is corrupt, not a huge group

# Element sizes of the dtypes a payload may hold (names as torch prints them, no prefix).
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1,
            "float8_e4m3fn": 1, "float8_e5m2": 1}


class CorruptEntry(ValueError):
    """A tier value failed verification (bad magic, version, length, checksum, fingerprint).

    ``reason`` is one of ``"magic"``, ``"version"``, ``"length"``, ``"checksum"``,
    ``"fingerprint"``, ``"header"``, ``"hashes"``, ``"layout"``, ``"tokens"``."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"corrupt tier entry ({reason}){': ' + detail if detail else ''}")
        self.reason = reason


@dataclass(frozen=True)
class PageGroup:
    """Published pages stored together.

    Attributes:
        fingerprint: the model fingerprint the KV was computed under (bytes).
        hashes: one page hash per page (the same chain hashes as the pool's index).
        token_ids: per page, its ``block_size`` token ids (the token check on a hit).
        dtype: element type name of the payload (a key of :data:`ITEMSIZE`).
        page_shape: shape of one page's payload (e.g. ``(2, layers, block_size, heads, dim)``).
        payload: ``len(hashes) * page_nbytes`` raw bytes, page-major.

    Raises:
        ValueError: inconsistent counts, unknown dtype, or a payload of the wrong length.
    """

    fingerprint: bytes
    hashes: tuple[bytes, ...]
    token_ids: tuple[tuple[int, ...], ...]
    dtype: str
    page_shape: tuple[int, ...]
    payload: bytes

    def __post_init__(self) -> None:
        n = len(self.hashes)
        if n < 1:
            raise ValueError("hashes must hold at least one page hash")
        if len(self.token_ids) != n:
            raise ValueError(f"token_ids has {len(self.token_ids)} pages for {n} hashes")
        if len({len(h) for h in self.hashes}) != 1 or not self.hashes[0]:
            raise ValueError("hashes must be non-empty and all of one length")
        if len({len(t) for t in self.token_ids}) != 1:
            raise ValueError("token_ids must hold the same number of tokens per page")
        if self.dtype not in ITEMSIZE:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(ITEMSIZE)}")
        if len(self.payload) != n * self.page_nbytes:
            raise ValueError(f"payload holds {len(self.payload)} bytes, expected "
                             f"{n} pages x {self.page_nbytes}")

    @property
    def num_pages(self) -> int:
        return len(self.hashes)

    @property
    def page_nbytes(self) -> int:
        """Bytes of one page's payload."""
        return math.prod(self.page_shape) * ITEMSIZE[self.dtype]

    def page_payload(self, i: int) -> bytes:
        """Payload bytes of page ``i`` (0-based, in group order)."""
        n = self.page_nbytes
        return self.payload[i * n:(i + 1) * n]

    def select(self, hashes: Sequence[bytes]) -> PageGroup:
        """The sub-group holding ``hashes`` in that order.

        Raises:
            KeyError: a hash is not in this group."""
        pos = {h: i for i, h in enumerate(self.hashes)}
        idx = [pos[h] for h in hashes]
        return PageGroup(self.fingerprint, tuple(self.hashes[i] for i in idx),
                         tuple(self.token_ids[i] for i in idx), self.dtype, self.page_shape,
                         b"".join(self.page_payload(i) for i in idx))


@dataclass(frozen=True)
class GroupHeader:
    """What :func:`read_header` parses: everything but the payload (not yet verified)."""

    fingerprint: bytes
    hashes: tuple[bytes, ...]
    token_ids: tuple[tuple[int, ...], ...]
    dtype: str
    page_shape: tuple[int, ...]
    payload_len: int
    header_len: int  # bytes before the payload, checksum included

    @property
    def total_len(self) -> int:
        return self.header_len + self.payload_len


def encode(group: PageGroup) -> bytes:
    """The bytes of ``group``: header, checksum, payload (see the module docstring)."""
    fp, dt = group.fingerprint, group.dtype.encode("ascii")
    n, hlen, bs = group.num_pages, len(group.hashes[0]), len(group.token_ids[0])
    body = bytearray()
    body += struct.pack(">H", len(fp)) + fp
    body += _COUNTS.pack(n, hlen, bs)
    body += struct.pack(">H", len(dt)) + dt
    body += struct.pack(">B", len(group.page_shape))
    body += b"".join(struct.pack(">Q", d) for d in group.page_shape)
    body += struct.pack(">Q", len(group.payload))
    body += b"".join(group.hashes)
    body += b"".join(tokens_to_bytes(t) for t in group.token_ids)
    header_len = _PREFIX.size + len(body) + CHECKSUM_BYTES
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, header_len) + bytes(body)
    digest = _checksum(head, group.payload)
    return head + digest + group.payload


def header_length(prefix: bytes) -> int:
    """Total header length (checksum included) from the first :data:`PREFIX_BYTES` bytes.

    Raises:
        CorruptEntry: bad magic or version, or an impossible length."""
    if len(prefix) < _PREFIX.size:
        raise CorruptEntry("length", f"{len(prefix)} bytes, need {_PREFIX.size}")
    magic, version, _, header_len = _PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise CorruptEntry("magic", repr(magic))
    if version != FORMAT_VERSION:
        raise CorruptEntry("version", f"{version}, this build reads {FORMAT_VERSION}")
    if not _PREFIX.size + CHECKSUM_BYTES < header_len <= MAX_HEADER_BYTES:
        raise CorruptEntry("length", f"header length {header_len}")
    return int(header_len)


PREFIX_BYTES = _PREFIX.size


def read_header(data: bytes) -> GroupHeader:
    """Parse the header of a value (``data`` may be only its first ``header_len`` bytes).

    Raises:
        CorruptEntry: bad magic, version or lengths; the checksum is NOT verified here."""
    header_len = header_length(data)
    if len(data) < header_len:
        raise CorruptEntry("length", f"{len(data)} bytes, header needs {header_len}")
    try:
        return _parse_body(memoryview(data)[:header_len - CHECKSUM_BYTES], header_len)
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        raise CorruptEntry("header", str(e)) from e


def decode(data: bytes, expected_fingerprint: bytes) -> PageGroup:
    """Verify and parse a value produced by :func:`encode`.

    Args:
        data: the whole value (header + payload).
        expected_fingerprint: the running model's fingerprint; another one is a miss.

    Raises:
        CorruptEntry: on any mismatch; ``reason`` says which check failed."""
    h = read_header(data)
    if len(data) != h.total_len:
        raise CorruptEntry("length", f"{len(data)} bytes, header says {h.total_len}")
    view = memoryview(data)
    stored = bytes(view[h.header_len - CHECKSUM_BYTES:h.header_len])
    payload = bytes(view[h.header_len:])
    if _checksum(view[:h.header_len - CHECKSUM_BYTES], payload) != stored:
        raise CorruptEntry("checksum")
    if h.fingerprint != expected_fingerprint:
        raise CorruptEntry("fingerprint", f"{h.fingerprint.hex()[:16]}...")
    try:
        return PageGroup(h.fingerprint, h.hashes, h.token_ids, h.dtype, h.page_shape, payload)
    except ValueError as e:
        raise CorruptEntry("length", str(e)) from e


@dataclass(frozen=True)
class PageLayout:
    """What one page of the running model looks like: the payload's element type (a key of
    :data:`ITEMSIZE`) and the shape of one page's payload."""

    dtype: str
    page_shape: tuple[int, ...]


def check_pages(group: PageGroup, hashes: Sequence[bytes],
                layout: PageLayout | None = None,
                token_ids: Mapping[bytes, Sequence[int]] | None = None) -> None:
    """Check that a decoded value is the entry its key names: a checksum proves the bytes
    are whole, not that they are the pages the reader asked for (a valid value copied over
    another one's key, a restored backup).

    Args:
        group: the decoded value.
        hashes: the page hashes the entry must hold, in its order.
        layout: the running model's page layout (``None``: not checked).
        token_ids: expected token ids of some of its pages, by page hash.

    Raises:
        CorruptEntry: ``"hashes"``, ``"layout"`` or ``"tokens"``: the first check failed."""
    if group.hashes != tuple(hashes):
        raise CorruptEntry("hashes", f"{group.num_pages} pages, not the {len(hashes)} "
                           "its key names")
    if layout is not None and (group.dtype, group.page_shape) != (layout.dtype,
                                                                  layout.page_shape):
        raise CorruptEntry("layout", f"{group.dtype} {group.page_shape}, expected "
                           f"{layout.dtype} {layout.page_shape}")
    if token_ids:
        for h, toks in zip(group.hashes, group.token_ids):
            want = token_ids.get(h)
            if want is not None and toks != tuple(want):
                raise CorruptEntry("tokens", f"page {h.hex()[:16]} holds other tokens")


def _checksum(head: bytes | memoryview, payload: bytes) -> bytes:
    d = hashlib.blake2b(digest_size=CHECKSUM_BYTES)
    d.update(head)
    d.update(payload)
    return d.digest()


def _parse_body(view: memoryview, header_len: int) -> GroupHeader:
    off = _PREFIX.size

    def take(n: int) -> bytes:
        nonlocal off
        if off + n > len(view):
            raise ValueError(f"header ends at {len(view)}, field needs {off + n}")
        out = bytes(view[off:off + n])
        off += n
        return out

    def num(fmt: str) -> int:
        return int(struct.unpack(fmt, take(struct.calcsize(fmt)))[0])

    fp = take(num(">H"))
    n, hlen, bs = _COUNTS.unpack(take(_COUNTS.size))
    dtype = take(num(">H")).decode("ascii")
    shape = tuple(num(">Q") for _ in range(num(">B")))
    payload_len = num(">Q")
    raw_hashes = take(n * hlen)
    raw_tokens = take(n * bs * 4)
    if off != len(view):
        raise ValueError(f"{len(view) - off} stray header bytes")
    if dtype not in ITEMSIZE or n < 1 or hlen < 1:
        raise ValueError(f"dtype {dtype!r}, {n} pages, hash length {hlen}")
    if payload_len != n * math.prod(shape) * ITEMSIZE[dtype]:
        raise ValueError(f"payload length {payload_len} for {n} pages of shape {shape}")
    hashes = tuple(raw_hashes[i * hlen:(i + 1) * hlen] for i in range(n))
    toks = struct.unpack(f"<{n * bs}I", raw_tokens)
    token_ids = tuple(tuple(toks[i * bs:(i + 1) * bs]) for i in range(n))
    return GroupHeader(fp, hashes, token_ids, dtype, shape, payload_len, header_len)
