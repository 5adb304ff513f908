"""What a disk tier file claims is verified like its bytes: a valid, correctly checksummed file
that holds other pages than the index expects for its name (another prompt's file copied over
it), or any header field changed and re-checksummed (hashes, counts, shapes, lengths, dtype,
token ids), is a miss counted in ``corrupt`` with the file removed; a lookup never raises and
never returns a page other than the one asked for."""
from __future__ import annotations

import hashlib
import shutil
import struct
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixcache.cache.tiers.disk_tier import DiskTier
from prefixcache.cache.tiers.format import MAGIC, PageGroup, PageLayout, encode

FP = b"\x01" * 16
BS = 4
SHAPE = (2, 1, BS, 1, 2)  # one page's payload: 16 float32, 64 bytes
LAYOUT = PageLayout("float32", SHAPE)


def _h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _group(first: int, n: int) -> PageGroup:
    """Pages ``first..first+n-1``: hash ``_h(i)``, tokens ``4i..4i+3``, payload bytes
    derived from ``i``."""
    ids = range(first, first + n)
    return PageGroup(FP, tuple(_h(i) for i in ids),
                     tuple(tuple(range(i * BS, (i + 1) * BS)) for i in ids), "float32", SHAPE,
                     b"".join(bytes((i * 7 + j) % 256 for j in range(64)) for i in ids))


def _tier(directory: str | Path) -> DiskTier:
    return DiskTier(directory, 1 << 20, FP, layout=LAYOUT)


def _file_of(tier: DiskTier, page_hash: bytes) -> Path:
    return tier.directory / tier._where[page_hash]


def test_a_valid_file_of_other_pages_copied_over_a_file_is_a_counted_miss(tmp_path):
    tier = _tier(tmp_path)
    a, b = _group(0, 3), _group(10, 3)
    assert tier.put(a) and tier.put(b)
    file_a, file_b = _file_of(tier, _h(0)), _file_of(tier, _h(10))
    shutil.copyfile(file_b, file_a)  # a restore or an rsync over a live directory
    assert tier.get(a.hashes, a.token_ids) is None
    s = tier.stats()
    assert (s.corrupt, s.failures, s.hits, s.misses, s.pages) == (1, 0, 0, 1, 3)
    assert not file_a.exists() and not tier.contains(_h(0))
    got = tier.get(b.hashes, b.token_ids)  # B's own file still serves B
    assert got == b
    assert tier.put(a) and tier.get(a.hashes) == a  # the recomputed pages are stored again


def test_pages_before_a_bad_file_are_still_loaded(tmp_path):
    tier = _tier(tmp_path)
    head, tail, other = _group(0, 2), _group(2, 2), _group(20, 2)
    for g in (head, tail, other):
        assert tier.put(g)
    shutil.copyfile(_file_of(tier, _h(20)), _file_of(tier, _h(2)))
    want = head.token_ids + tail.token_ids
    got = tier.get(head.hashes + tail.hashes, want)
    assert got == head  # the verified leading file, up to the bad one
    s = tier.stats()
    assert (s.corrupt, s.hits, s.misses, s.loads) == (1, 1, 1, 1)
    assert tier.lookup_run(head.hashes + tail.hashes) == 2


def test_other_token_ids_or_layout_fail_the_read(tmp_path):
    tier = _tier(tmp_path)
    g = _group(0, 2)
    assert tier.put(g)
    bad_tokens = (g.token_ids[0], (9, 9, 9, 9))
    assert tier.get(g.hashes, bad_tokens) is None
    assert tier.stats().corrupt == 1 and not tier.contains(_h(0))
    other = DiskTier(tmp_path / "b", 1 << 20, FP, layout=PageLayout("float16", SHAPE))
    assert other.put(g)
    assert other.get(g.hashes) is None and other.stats().corrupt == 1
    assert list((tmp_path / "b").iterdir()) == []


# -- the header fuzzed field by field -----------------------------------------------------
ORIG = _group(0, 3)
ORIG_HASHES = b"".join(ORIG.hashes)
ORIG_TOKENS = b"".join(struct.pack(f"<{BS}I", *t) for t in ORIG.token_ids)


def _raw(fp: bytes, n: int, hlen: int, bs: int, dtype: bytes, shape: list[int],
         payload_len: int, hashes: bytes, tokens: bytes, payload: bytes,
         header_len_delta: int) -> bytes:
    """A value laid out as ``format.encode`` lays it out, with any field values, its
    checksum recomputed (so only the checks of the header's claims can catch it)."""
    body = struct.pack(">H", len(fp)) + fp + struct.pack(">IHI", n, hlen, bs)
    body += struct.pack(">H", len(dtype)) + dtype + struct.pack(">B", len(shape))
    body += b"".join(struct.pack(">Q", d) for d in shape) + struct.pack(">Q", payload_len)
    body += hashes + tokens
    header_len = 12 + len(body) + 16 + header_len_delta
    head = struct.pack(">4sHHI", MAGIC, 1, 0, max(0, header_len)) + body
    digest = hashlib.blake2b(head + payload, digest_size=16).digest()
    return head + digest + payload


def _either(original, *others):
    return st.one_of(st.just(original), st.sampled_from(others))


U32, U64 = 2**32 - 1, 2**64 - 1
FIELDS = st.fixed_dictionaries({
    "fp": _either(FP, b"\x02" * 16, b"", FP[:-1]),
    "n": _either(3, 0, 1, 2, 4, U32),
    "hlen": _either(16, 0, 1, 15, 17, 48, 2**16 - 1),
    "bs": _either(BS, 0, 1, 3, 5, U32),
    "dtype": _either(b"float32", b"float16", b"bfloat16", b"int8", b"float64", b"", b"nope",
                     b"\xff\xfe"),
    "shape": _either(list(SHAPE), [], [0], [2, 1, BS, 1, 1], [1, 2, BS, 1, 2],
                     [2, 1, BS, 2, 1], [32], [2**40, 2**40], [U64], [1] * 255),
    "payload_len": _either(192, 0, 64, 128, 191, 193, 384, U64),
    "hashes": _either(ORIG_HASHES, ORIG_HASHES[:-1], ORIG_HASHES[16:] + ORIG_HASHES[:16],
                      b"".join(_h(i) for i in (10, 11, 12)), ORIG_HASHES[:32],
                      ORIG_HASHES + _h(3), ORIG_HASHES[::-1]),
    "tokens": _either(ORIG_TOKENS, ORIG_TOKENS[:-4], b"\x00" * len(ORIG_TOKENS),
                      ORIG_TOKENS[4:] + ORIG_TOKENS[:4], ORIG_TOKENS + b"\x00" * 16),
    # (a payload of the right length under a recomputed checksum is indistinguishable
    # from real KV: only lengths are fuzzed here, the checksum test covers the bytes)
    "payload": _either(ORIG.payload, ORIG.payload[:-1], ORIG.payload + b"\x00", b""),
    "header_len_delta": _either(0, -1, 1, -1000, 1 << 27),
})


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(FIELDS)
def test_any_header_is_a_counted_miss_or_the_right_pages(fields):
    raw = _raw(**fields)
    same = raw == encode(ORIG)
    with tempfile.TemporaryDirectory() as d:
        tier = _tier(d)
        assert tier.put(ORIG)
        path = _file_of(tier, _h(0))
        path.write_bytes(raw)
        got = tier.get(ORIG.hashes, ORIG.token_ids)  # never raises
        s = tier.stats()
        if same:
            assert got == ORIG and s.corrupt == 0
        else:
            assert got is None
            assert (s.corrupt, s.misses, s.hits) == (1, 1, 0)
            assert not path.exists() and tier.lookup_run(ORIG.hashes) == 0
        # a restart over the same bytes: the index is rebuilt from the header alone
        path.write_bytes(raw)
        again = _tier(d)  # never raises
        indexed = again.lookup_run(ORIG.hashes)
        got = again.get(ORIG.hashes, ORIG.token_ids)
        if got is not None:  # only ever the pages asked for
            assert got == ORIG.select(ORIG.hashes[:got.num_pages]) and got.num_pages <= indexed
        elif indexed:  # indexed under these hashes from its header, then failed the read
            assert again.stats().corrupt == 1 and not path.exists()
