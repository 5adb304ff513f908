"""Page hashes: typed, length-prefixed key encoding; chained, stable, namespaced hashes."""
from __future__ import annotations

import hashlib
import math
import struct
from enum import IntEnum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.cache import KVCacheManager, PageHasher, encode_parts
from prefixcache.cache.hashing import (
    DEFAULT_ROOT_SEED,
    DIGEST_BYTES,
    blake2b_128,
    tokens_to_bytes,
)

# -- encode_parts ------------------------------------------------------------------------

DISTINCT_PART_LISTS = [
    ("ab", "c"), ("a", "bc"), ("abc",), ("a", "b", "c"),
    ("x",), (b"x",), (("x",),), ((b"x",),), ([["x"]],),
    (1,), ("1",), (b"1",), (1.0,), (True,), (False,), (0,), (0.0,), (-0.0,),
    (None,), ("",), (b"",), ((),), ((None,),), (None, None),
    (("a", "b"),), (("a",), "b"), ("a", ("b",)), (("ab",),),
    (12,), (1, 2), ((1, 2),), (-1,), (2**64,),
    ("tenant", "x"), ("cache_salt", "x"), (("tenant", "x"),), (("cache_salt", "x"),),
]


def test_encode_parts_distinct_for_distinct_parts():
    encoded = [encode_parts(*parts) for parts in DISTINCT_PART_LISTS]
    assert len(set(encoded)) == len(DISTINCT_PART_LISTS)


def test_encode_parts_exact_bytes():
    assert encode_parts("x", b"x", 1, None, True) == (
        b"S\x00\x00\x00\x01x" + b"Y\x00\x00\x00\x01x" + b"I\x00\x00\x00\x011" + b"N"
        + b"B\x01")
    assert encode_parts(("a", [1])) == (b"T\x00\x00\x00\x02" + b"S\x00\x00\x00\x01a"
                                        + b"T\x00\x00\x00\x01" + b"I\x00\x00\x00\x011")
    assert encode_parts(1.5) == b"F" + struct.pack(">d", 1.5)


def test_encode_parts_intenum_encodes_as_its_value():
    class Color(IntEnum):
        RED = 7

    assert encode_parts(Color.RED) == encode_parts(7)


def test_encode_parts_rejects_unknown_types():
    with pytest.raises(TypeError, match="dict"):
        encode_parts({"a": 1})
    with pytest.raises(TypeError, match="set"):
        encode_parts(("ok", {1}))


# A value model in which equal canonical forms must encode alike and different ones
# differently (Python's == conflates 1, 1.0 and True; the encoding must not).
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True), st.text(max_size=6), st.binary(max_size=6))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3).map(tuple),
                      max_leaves=8)


def canon(v):
    if v is None:
        return ("N",)
    if isinstance(v, bool):
        return ("B", v)
    if isinstance(v, int):
        return ("I", v)
    if isinstance(v, float):
        return ("F", struct.pack(">d", v))
    if isinstance(v, str):
        return ("S", v)
    if isinstance(v, bytes):
        return ("Y", v)
    return ("T",) + tuple(canon(x) for x in v)


@settings(max_examples=300, deadline=None)
@given(st.lists(values, max_size=4), st.lists(values, max_size=4))
def test_encode_parts_is_injective(a, b):
    same = [canon(x) for x in a] == [canon(x) for x in b]
    assert (encode_parts(*a) == encode_parts(*b)) == same


# -- tokens and hash function ----------------------------------------------------------

def test_tokens_to_bytes_is_u32_little_endian():
    assert tokens_to_bytes([1, 256, 2**32 - 1]) == (b"\x01\x00\x00\x00" b"\x00\x01\x00\x00"
                                                    b"\xff\xff\xff\xff")
    with pytest.raises(OverflowError):
        tokens_to_bytes([2**32])
    with pytest.raises(OverflowError):
        tokens_to_bytes([-1])


def test_default_hash_is_blake2b_128():
    assert DIGEST_BYTES == 16
    assert blake2b_128(b"abc") == hashlib.blake2b(b"abc", digest_size=16).digest()
    assert PageHasher("m", root_seed="s").hash_fn is blake2b_128


def test_hashes_are_pinned_across_processes(monkeypatch):
    """Golden values: the default root seed and the encoding are part of the on-disk
    format (KV tiers will store hashes); a change here must be deliberate."""
    monkeypatch.setenv("PREFIXCACHE_HASH_SEED", "ignored")  # the hasher reads no env
    assert DEFAULT_ROOT_SEED == b"prefixcache/v1"
    h = PageHasher("llama-test")
    assert h.root_seed == DEFAULT_ROOT_SEED
    root = h.root_hash(h.root_key("tenant-a", "salt-1"))
    assert root.hex() == "6889e1b8a440ec8a088003c3153f764d"
    page = h.page_hash(root, tokens_to_bytes(range(16)), h.extra_bytes())
    assert page.hex() == "0a7a467734ced1d671e0bca5ceb3d457"


# Computed with the code before the framing was unified (two copies: the manager's
# inlined text-page loop and ``PageHasher.page_hash`` for multimodal pages).
PINNED_TEXT = ["9fd5995d147c3d6a1f5dab0924685acc", "bcb592007e696526b88041a1f8c44953",
               "f1fadfdfa94466098cf4afc225463423"]
PINNED_MM = ["31c0cb7d055860e61a5ac89193b6edf0", "ef98fb47e9d308035731c2ea9cb6d7bb"]
PINNED_BS16 = ["8fae55f143c23aba9b337230e182a5c6", "d5a5ac9215ed2b2a83b02f2623b7353c"]


def test_page_table_hashes_are_pinned():
    """The chain a page table gets (text pages, multimodal pages, block size 16) is
    byte-identical to the hashes persisted before ``PageHasher.chain`` existed."""
    mgr = KVCacheManager(16, 4, model_id="llama-test")
    pt = mgr.new_page_table("a", list(range(100, 113)), tenant="tenant-a",
                            cache_salt="salt-1", extra_keys=("adapter", "x", 3))
    assert [x.hex() for x in mgr.page_hashes(pt, 3)] == PINNED_TEXT
    mm = mgr.new_page_table("b", list(range(9)), mm_hashes=((2, 4, b"img-1"),))
    assert [x.hex() for x in mgr.page_hashes(mm, 2)] == PINNED_MM
    big = KVCacheManager(16, 16, model_id="m", root_seed="s")
    pt16 = big.new_page_table("c", list(range(40)))
    assert [x.hex() for x in big.page_hashes(pt16, 2)] == PINNED_BS16
    # Hashes are computed once per page and extended lazily.
    assert mgr.page_hashes(pt, 2) is pt.hashes and len(pt.hashes) == 3
    with pytest.raises(ValueError, match="not full"):
        mgr.page_hashes(pt, 4)


def test_chain_is_page_hash_repeated():
    """``chain`` over many pages equals ``page_hash`` page by page, with one extra
    for all pages or one per page."""
    h = PageHasher("m", root_seed="s")
    root = h.root_hash(h.root_key("t", None))
    raw = tokens_to_bytes(range(12))
    extras = [h.extra_bytes(), h.extra_bytes(("x",)), h.extra_bytes((), ((0, 1, b"i"),))]
    want, prev = [], root
    for i in range(3):
        prev = h.page_hash(prev, raw[16 * i:16 * (i + 1)], extras[i])
        want.append(prev)
    assert h.chain(root, raw, extras, 16) == want
    same = h.chain(root, raw, extras[0], 16)
    assert same[0] == want[0] and len(set(same)) == 3
    assert h.chain(root, b"", extras[0], 16) == []
    with pytest.raises(ValueError, match="page_bytes"):
        h.chain(root, raw, extras[0], 0)
    with pytest.raises(ValueError, match="raw"):
        h.chain(root, raw[:-4], extras[0], 16)
    with pytest.raises(ValueError, match="extras"):
        h.chain(root, raw, extras[:2], 16)


def test_root_seed_is_an_argument_never_the_environment(monkeypatch):
    monkeypatch.delenv("PREFIXCACHE_HASH_SEED", raising=False)
    default = PageHasher("m")
    key = default.root_key("t", None)
    assert PageHasher("m", root_seed="prefixcache/v1").root_key("t", None) == key
    assert PageHasher("m", root_seed=b"prefixcache/v1").root_key("t", None) == key
    assert PageHasher("m", root_seed=b"other").root_key("t", None) != key
    monkeypatch.setenv("PREFIXCACHE_HASH_SEED", "other")
    assert PageHasher("m").root_seed == DEFAULT_ROOT_SEED
    assert PageHasher("m", "other").root_key("t", None) == PageHasher(
        "m", b"other").root_key("t", None)
    with pytest.raises(TypeError, match="root_seed"):
        PageHasher("m", root_seed=7)  # type: ignore[arg-type]


def test_root_separates_model_tenant_and_salt():
    h = PageHasher("m", root_seed="s")
    roots = {h.root_key(None, None), h.root_key("x", None), h.root_key(None, "x"),
             h.root_key("", None), h.root_key(None, ""), h.root_key("x", "x"),
             PageHasher("m2", root_seed="s").root_key(None, None)}
    assert len(roots) == 7


def _first_page_hash(mgr, tokens, **ns):
    pt = mgr.new_page_table("h", list(tokens), **ns)
    try:
        return mgr.page_hashes(pt, 1)[0]
    finally:
        mgr.free(pt)


def test_adapter_x_and_salt_x_hash_differently():
    mgr = KVCacheManager(4, 4, root_seed="s")
    toks = [1, 2, 3, 4]
    hashes = {
        _first_page_hash(mgr, toks),
        _first_page_hash(mgr, toks, cache_salt="x"),
        _first_page_hash(mgr, toks, tenant="x"),
        _first_page_hash(mgr, toks, extra_keys=("x",)),
        _first_page_hash(mgr, toks, extra_keys=("adapter", "x", 1)),
        _first_page_hash(mgr, toks, extra_keys=("adapter", "x", 2)),
    }
    assert len(hashes) == 6


def test_chained_hash_depends_on_every_earlier_page():
    mgr = KVCacheManager(8, 4, root_seed="s")
    a = mgr.new_page_table("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    b = mgr.new_page_table("b", [9, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    ha, hb = mgr.page_hashes(a, 3), mgr.page_hashes(b, 3)
    assert all(x != y for x, y in zip(ha, hb))
    assert len(set(ha)) == 3


def test_float_keys_nan_and_signed_zero():
    assert encode_parts(math.nan) == encode_parts(math.nan)
    assert encode_parts(0.0) != encode_parts(-0.0)
