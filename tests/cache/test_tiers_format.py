"""The page-group byte format: round trip, and every corruption is detected."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.cache.tiers.format import (
    CHECKSUM_BYTES,
    FORMAT_VERSION,
    MAGIC,
    PREFIX_BYTES,
    CorruptEntry,
    PageGroup,
    decode,
    encode,
    header_length,
    read_header,
)

FP = b"fingerprint-0001"


def group(n: int = 3, bs: int = 4, shape: tuple[int, ...] = (2, 2, 4, 1, 2)) -> PageGroup:
    per_page = 1
    for d in shape:
        per_page *= d
    payload = bytes((i * 7 + 3) % 256 for i in range(n * per_page * 2))
    return PageGroup(FP, tuple(bytes([i]) * 16 for i in range(n)),
                     tuple(tuple(range(i * bs, i * bs + bs)) for i in range(n)),
                     "bfloat16", shape, payload)


def test_round_trip_is_exact() -> None:
    g = group()
    data = encode(g)
    assert data[:4] == MAGIC
    assert struct.unpack(">H", data[4:6])[0] == FORMAT_VERSION
    assert decode(data, FP) == g
    h = read_header(data)
    assert h.hashes == g.hashes and h.token_ids == g.token_ids
    assert h.payload_len == 3 * 2 * 2 * 4 * 1 * 2 * 2 == len(g.payload)
    assert h.total_len == len(data)
    assert header_length(data[:PREFIX_BYTES]) == h.header_len


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5), bs=st.integers(1, 6), dims=st.lists(st.integers(1, 3), max_size=4),
       toks=st.integers(0, 2**32 - 1))
def test_round_trip_any_geometry(n: int, bs: int, dims: list[int], toks: int) -> None:
    shape = tuple(dims)
    per = 1
    for d in shape:
        per *= d
    g = PageGroup(b"f", tuple(bytes([i, 1]) for i in range(n)),
                  tuple((toks,) * bs for _ in range(n)), "float32", shape,
                  bytes(i % 251 for i in range(n * per * 4)))
    assert decode(encode(g), b"f") == g


def test_select_keeps_pages_with_their_bytes() -> None:
    g = group()
    sub = g.select([g.hashes[2], g.hashes[0]])
    assert sub.hashes == (g.hashes[2], g.hashes[0])
    assert sub.token_ids == (g.token_ids[2], g.token_ids[0])
    assert sub.payload == g.page_payload(2) + g.page_payload(0)
    with pytest.raises(KeyError):
        g.select([b"\xff" * 16])


def test_every_flipped_byte_is_detected() -> None:
    data = encode(group(n=1, shape=(2, 1, 2, 1, 1)))
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(CorruptEntry):
            decode(bytes(bad), FP)


@pytest.mark.parametrize("cut", [0, 3, PREFIX_BYTES, 40, -CHECKSUM_BYTES, -1])
def test_truncation_is_detected(cut: int) -> None:
    data = encode(group())
    with pytest.raises(CorruptEntry) as e:
        decode(data[:cut] if cut >= 0 else data[:len(data) + cut], FP)
    assert e.value.reason in {"length", "header"}


def test_extra_bytes_are_detected() -> None:
    with pytest.raises(CorruptEntry) as e:
        decode(encode(group()) + b"\0", FP)
    assert e.value.reason == "length"


def test_bad_magic_version_fingerprint() -> None:
    data = encode(group())
    with pytest.raises(CorruptEntry) as e:
        decode(b"XXXX" + data[4:], FP)
    assert e.value.reason == "magic"
    with pytest.raises(CorruptEntry) as e:
        decode(data[:4] + struct.pack(">H", FORMAT_VERSION + 1) + data[6:], FP)
    assert e.value.reason == "version"
    with pytest.raises(CorruptEntry) as e:
        decode(data, b"another-model")
    assert e.value.reason == "fingerprint"


def test_payload_swap_with_valid_lengths_fails_checksum() -> None:
    a, b = encode(group()), bytearray(encode(group()))
    hl = read_header(a).header_len
    b[hl:] = bytes(len(b) - hl)
    with pytest.raises(CorruptEntry) as e:
        decode(bytes(b), FP)
    assert e.value.reason == "checksum"


def test_group_validation_names_the_field() -> None:
    g = group()
    with pytest.raises(ValueError, match="payload"):
        PageGroup(FP, g.hashes, g.token_ids, g.dtype, g.page_shape, g.payload[:-1])
    with pytest.raises(ValueError, match="token_ids"):
        PageGroup(FP, g.hashes, g.token_ids[:2], g.dtype, g.page_shape, g.payload)
    with pytest.raises(ValueError, match="dtype"):
        PageGroup(FP, g.hashes, g.token_ids, "complex32", g.page_shape, g.payload)
    with pytest.raises(ValueError, match="hashes"):
        PageGroup(FP, (), (), g.dtype, g.page_shape, b"")
