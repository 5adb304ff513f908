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
from prefixcache.cache.hashing import (DEFAULT_ROOT_SEED, DIGEST_BYTES, blake2b_128,
                                       tokens_to_bytes)

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
    monkeypatch.delenv("PREFIXCACHE_HASH_SEED", raising=False)
    assert DEFAULT_ROOT_SEED == b"prefixcache/v1"
    h = PageHasher("llama-test")
    assert h.root_seed == DEFAULT_ROOT_SEED
    root = h.root_hash(h.root_key("tenant-a", "salt-1"))
    assert root.hex() == "6889e1b8a440ec8a088003c3153f764d"
    page = h.page_hash(root, tokens_to_bytes(range(16)), h.extra_bytes())
    assert page.hex() == "0a7a467734ced1d671e0bca5ceb3d457"


def test_root_seed_from_argument_and_environment(monkeypatch):
    monkeypatch.delenv("PREFIXCACHE_HASH_SEED", raising=False)
    default = PageHasher("m")
    key = default.root_key("t", None)
    assert PageHasher("m", root_seed="prefixcache/v1").root_key("t", None) == key
    assert PageHasher("m", root_seed=b"other").root_key("t", None) != key
    monkeypatch.setenv("PREFIXCACHE_HASH_SEED", "other")
    assert PageHasher("m").root_seed == b"other"
    assert PageHasher("m").root_key("t", None) == PageHasher("m", b"other").root_key("t", None)


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


def test_fast_path_matches_page_hasher():
    """The inlined hashing loop in the manager frames pages exactly like
    ``PageHasher.page_hash`` (the path multimodal pages take)."""
    mgr = KVCacheManager(8, 4, model_id="m", root_seed="s")
    toks = list(range(100, 113))
    pt = mgr.new_page_table("a", toks, tenant="t", extra_keys=("adapter", "x", 3))
    got = mgr.page_hashes(pt, 3)
    h = mgr.hasher
    prev = h.root_hash(h.root_key("t", None))
    extra = h.extra_bytes(("adapter", "x", 3))
    want = []
    for i in range(3):
        prev = h.page_hash(prev, tokens_to_bytes(toks[4 * i:4 * i + 4]), extra)
        want.append(prev)
    assert got == want
    # Hashes are computed once per page and extended lazily.
    assert mgr.page_hashes(pt, 2) is pt.hashes and len(pt.hashes) == 3
    with pytest.raises(ValueError, match="not full"):
        mgr.page_hashes(pt, 4)


def test_float_keys_nan_and_signed_zero():
    assert encode_parts(math.nan) == encode_parts(math.nan)
    assert encode_parts(0.0) != encode_parts(-0.0)
