"""Cost figures of handmade logs under handmade sheets (prices per 1 token)."""
import json

import pytest
from analyze_helpers import tokreq

from prefixcache.analyze.cost import price_log, price_sheet
from prefixcache.analyze.model_rows import check_model_map, choose_row, parse_model_map
from prefixcache.analyze.pricing import (
    PriceSheetError,
    builtin_sheet_names,
    load_price_specs,
    load_sheet,
    parse_price_specs,
    resolve,
    validate_sheet,
)
from prefixcache.analyze.replay import ReplayCache, ReplayConfig
from prefixcache.analyze.usage import Usage

R = list(range(1, 40))


def sheet(kind="automatic", **mode):
    return {"provider": "acme", "source": "https://example.com", "as_of": "2025-01-01",
            "per_tokens": 1, "modes": [{"name": "m", "kind": kind, **mode}],
            "models": {"x": {"input": 1.0, "cached_input": 0.25, "output": 2.0,
                             "storage_per_mtok_hour": 1e6}}}


def price(reqs, sh, **cfg):
    (p,) = resolve(sh)
    return price_log(reqs, p, ReplayCache(reqs, ReplayConfig(block_size=16, **cfg)))


def test_automatic_discount_min_and_formula():
    reqs = [tokreq("a", R[:12], tenant="t1"), tokreq("b", R[:20], tenant="t1"),
            tokreq("c", R[:5], tenant="t1"), tokreq("d", R[:6], tenant="t2")]
    c = price(reqs, sheet(unit_tokens=4, min_cached_tokens=8))
    # unit 4: b reads a's 3 pages (12); c's 4-token hit is under the minimum
    assert c.per_call_cached == [0, 12, 0, 0]
    assert c.flat == 43.0
    assert c.cache_aware == 12 + (8 + 12 * 0.25) + 5 + 6 == 34.0
    assert c.savings == 9.0
    assert c.hit_share == 12 / 43 and c.prices.read_ratio == 0.25
    assert c.formula_ratio == pytest.approx(43 / 34, rel=1e-12)
    assert c.input_ratio == pytest.approx(c.formula_ratio, rel=1e-12)
    t1, t2 = c.per_tenant["t1"], c.per_tenant["t2"]
    assert (t1.flat, t1.cache_aware, t1.savings) == (37.0, 28.0, 9.0)
    assert (t2.flat, t2.cache_aware, t2.savings) == (6.0, 6.0, 0.0)


def test_output_tokens_from_usage_or_response():
    a = tokreq("a", R[:12], response=R[12:15])  # 3 response tokens, no usage
    b = tokreq("b", R[:20], usage=Usage("openai", 20, 0, 0, 10))
    c = price([a, b], sheet(unit_tokens=4))
    assert c.output_tokens == 13 and c.output_source == "mixed"
    assert c.flat == 32 + 13 * 2.0
    # b reads a's prompt and published response: 12 + 3 - 1 = 14 tokens -> 3 pages
    assert c.per_call_cached == [0, 12]


def test_breakpoints_read_write_ttl_and_minimum():
    sh = sheet("breakpoints", max_breakpoints=4, write_multiplier=1.25, read_multiplier=0.1,
               ttl_seconds=300)
    a = tokreq("a", list(range(30)), boundaries=[10, 25], roles=["system", "user"], ts=0.0)
    b = tokreq("b", list(range(25)) + list(range(100, 120)), boundaries=[10, 25, 35, 40],
               roles=["system", "user", "assistant", "tool"], ts=60.0)
    c = price([a, b], sh)
    assert (c.per_call_cached, c.per_call_write) == ([0, 25], [25, 15])
    assert c.flat == 75.0
    assert c.cache_aware == (5 + 25 * 1.25) + (5 + 25 * 0.1 + 15 * 1.25) == 62.5
    b.request.timestamp = 400.0  # past the 5-minute TTL: everything is written again
    c = price([a, b], sh)
    assert (c.per_call_cached, c.per_call_write) == ([0, 0], [25, 40])
    sh["models"]["x"]["min_cacheable_tokens"] = 30  # a's breakpoints are too short
    c = price([a, b], sh)
    assert (c.per_call_cached, c.per_call_write) == ([0, 0], [0, 40 - 0])


def test_breakpoint_placement_static_plus_latest():
    from prefixcache.analyze.breakpoints import choose_breakpoints
    b = [5, 10, 20, 30, 40, 50]
    roles = ["tools", "system", "user", "assistant", "tool", "assistant"]
    assert choose_breakpoints(b, roles, 4, 0) == [10, 30, 40, 50]
    assert choose_breakpoints(b, roles, 4, 25) == [30, 40, 50]
    assert choose_breakpoints(b, ["user"] * 6, 4, 0) == [20, 30, 40, 50]


def test_explicit_storage_token_hours():
    sh = sheet("explicit", unit_tokens=4, ttl_seconds=3600)
    a = tokreq("a", R[:12], ts=0.0)
    b = tokreq("b", R[:20], ts=1800.0)
    c = price([a, b], sh)
    # a's 3 pages are read by b: stored from t=0 to 1800 s + one TTL = 1.5 h each
    assert c.storage_token_hours == 3 * 4 * 1.5
    assert c.storage == 18.0
    assert c.cache_aware == 12 + 8 + 12 * 0.25 + 18.0
    a.request.timestamp = b.request.timestamp = None  # no times: one TTL per page
    assert price([a, b], sh).storage_token_hours == 3 * 4 * 1.0
    # pages published from a's response and read by b are stored too
    a = tokreq("a", R[:8], response=R[8:17], ts=0.0)  # 8 + 9 - 1 = 16 tokens: 4 pages
    b.request.timestamp = 1800.0
    c = price([a, b], sh)
    assert c.per_call_cached == [0, 16] and c.storage_token_hours == 4 * 4 * 1.5


def test_self_hosted_prices_from_throughput_and_analysis_cache():
    sh = {"provider": "self-hosted", "source": "x", "as_of": "2025-01-01",
          "modes": [{"name": "pc", "kind": "automatic", "use_analysis_cache": True}],
          "models": {"gpu": {"accelerator_hour": 3.6, "prefill_tokens_per_second": 1000,
                             "decode_tokens_per_second": 100, "cached_input": 0.0}}}
    (p,) = resolve(sh)
    assert p.input == pytest.approx(1e-6, rel=1e-12) and p.output == pytest.approx(1e-5)
    (q,) = resolve(sh, overrides={"accelerator_hour": 7.2})
    assert q.input == pytest.approx(2e-6, rel=1e-12)
    reqs = [tokreq("a", R[:12]), tokreq("b", R[:20])]
    c = price_log(reqs, p, ReplayCache(reqs, ReplayConfig(block_size=8)))
    assert c.per_call_cached == [0, 8]  # the analysis block size (8), not a provider unit
    assert c.formula_ratio == pytest.approx(32 / 24, rel=1e-12)


def test_builtin_sheets_are_complete():
    names = builtin_sheet_names()
    assert {"openai", "anthropic", "deepseek", "gemini", "self-hosted"} <= set(names)
    for n in names:
        s = load_sheet(n)
        assert s["source"] and s["as_of"]
    kinds = {p.label: p for p in parse_price_specs(["all"])}
    a5 = kinds["anthropic/claude-sonnet-4-5/5m"]
    assert a5.write / a5.input == pytest.approx(1.25) and a5.read / a5.input == pytest.approx(0.1)
    assert kinds["anthropic/claude-sonnet-4-5/1h"].write / a5.input == pytest.approx(2.0)
    assert a5.max_breakpoints == 4 and a5.min_cached_tokens == 1024
    ds = kinds["deepseek/deepseek-chat/automatic"]
    assert (ds.input * 1e6, ds.read * 1e6, ds.unit_tokens) == (0.28, 0.028, 64)
    assert kinds["gemini/gemini-2.5-flash/explicit-1h"].storage_per_token_hour > 0
    assert kinds["openai/gpt-4.1/automatic"].min_cached_tokens == 1024


def test_sheet_specs_and_errors(tmp_path):
    (p,) = parse_price_specs(["openai:gpt-4o"])
    assert p.model == "gpt-4o" and p.input * 1e6 == pytest.approx(2.5)
    f = tmp_path / "mine.json"
    f.write_text(json.dumps(sheet()))
    assert parse_price_specs([f"{f}:x"])[0].provider == "acme"
    with pytest.raises(PriceSheetError, match="no model"):
        parse_price_specs(["openai:nope"])
    with pytest.raises(PriceSheetError, match="no built-in"):
        parse_price_specs(["nosuch"])
    bad = sheet()
    del bad["models"]["x"]["cached_input"]
    with pytest.raises(PriceSheetError, match="cached_input"):
        validate_sheet(bad)


def two_model_sheet(kind="automatic", **mode):
    sh = sheet(kind, **mode)
    sh["default_model"] = "x"
    sh["models"]["y"] = {"input": 10.0, "cached_input": 1.0, "output": 20.0,
                         "min_cacheable_tokens": 4}
    return sh


def modeled(rid, prompt, model, out=0):
    tr = tokreq(rid, prompt, usage=Usage("acme", len(prompt), 0, out) if out else None)
    tr.request.model = model
    return tr


def test_each_request_priced_by_its_own_model_row():
    reqs = [modeled("a", R[:16], "y"), modeled("b", R[:20], "y"), modeled("c", R[:16], "x"),
            modeled("d", R[:8], "acme/y-2025-01-31"), modeled("e", R[:8], "zzz"),
            modeled("f", R[:12], "zzz"), modeled("g", R[:4], None)]
    (c,) = price_sheet(reqs, two_model_sheet(unit_tokens=4), ReplayCache(
        reqs, ReplayConfig(block_size=16)))
    # one cache per log model: b reads a's 16 tokens, f reads e's 8; c, d, g share nothing
    assert c.per_call_cached == [0, 16, 0, 0, 0, 8, 0]
    assert c.flat == 16 * 10 + 20 * 10 + 16 + 8 * 10 + 8 + 12 + 4 == 480
    assert c.cache_aware == 160 + (4 * 10 + 16 * 1) + 16 + 80 + 8 + (4 + 8 * 0.25) + 4 == 330
    d = c.as_dict()
    assert d["label"] == "acme/by-model/m" and d["price_per_mtok"] is None
    assert [(m["model"], m["row"], m["how"], m["requests"], m["flat"], m["cache_aware"])
            for m in d["models"]] == [
        ("y", "y", "own model", 2, 360.0, 216.0), ("zzz", "x", "default row", 2, 20.0, 14.0),
        ("x", "x", "own model", 1, 16.0, 16.0),
        ("acme/y-2025-01-31", "y", "snapshot", 1, 80.0, 80.0),
        (None, "x", "default row", 1, 4.0, 4.0)]
    assert [(s["model"], s["row"], s["requests"]) for s in d["substitutions"]] == [
        ("zzz", "x", 2), (None, "x", 1)]
    assert d["read_ratio"] == pytest.approx((44 * 1 + 40 * 0.25) / 480)


def test_mapped_and_pinned_rows_are_substitutions():
    reqs = [modeled("a", R[:16], "zzz"), modeled("b", R[:16], "zzz"), modeled("c", R[:8], "x")]
    sh = two_model_sheet(unit_tokens=4)
    rc = ReplayCache(reqs, ReplayConfig(block_size=16))
    (m,) = price_sheet(reqs, sh, rc, model_map={"zzz": "y"})
    assert m.per_call_cached == [0, 12, 0]  # a full-prompt hit recomputes the last unit
    assert m.flat == 2 * 16 * 10 + 8 and m.cache_aware == 160 + (4 * 10 + 12 * 1) + 8
    assert [(s["model"], s["row"], s["how"], s["requests"])
            for s in m.as_dict()["substitutions"]] == [("zzz", "y", "--price-model", 2)]
    (p,) = price_sheet(reqs, sh, rc, pinned="y")
    assert p.as_dict()["label"] == "acme/y/m" and p.flat == 40 * 10
    assert {s["model"]: s["how"] for s in p.as_dict()["substitutions"]} == {
        "zzz": "pinned by --prices", "x": "pinned by --prices"}


def test_breakpoints_keep_one_cache_per_row():
    b = [16]
    reqs = [modeled("a", R[:16], "y"), modeled("b", R[:16], "x"), modeled("c", R[:16], "y")]
    for r in reqs:
        r.boundaries, r.boundary_roles = b, ["system"]
    rc = ReplayCache(reqs, ReplayConfig(block_size=16))
    (c,) = price_sheet(reqs, two_model_sheet("breakpoints", max_breakpoints=1,
                                            write_multiplier=2.0, read_multiplier=0.5), rc)
    assert c.per_call_write == [16, 16, 0] and c.per_call_cached == [0, 0, 16]
    assert c.cache_aware == 16 * 20 + 16 * 2 + 16 * 5


def test_model_map_errors_name_the_flag():
    assert parse_model_map(["gpt-4o=gpt-4.1", " a = b "]) == {"gpt-4o": "gpt-4.1", "a": "b"}
    for bad in ("gpt-4o", "=x", "x="):
        with pytest.raises(ValueError, match="--price-model"):
            parse_model_map([bad])
    with pytest.raises(ValueError, match="--price-model zzz=nope"):
        check_model_map({"zzz": "nope"}, [two_model_sheet()])
    with pytest.raises(PriceSheetError, match="--prices openai:nope"):
        load_price_specs(["openai:nope"])


@pytest.mark.parametrize("sheet_name,model,row,how", [
    ("openai", "gpt-4o", "gpt-4o", "own model"),
    ("openai", "gpt-4o-mini-2024-07-18", "gpt-4o-mini", "snapshot"),
    ("openai", "openai/o3-mini-2025-01-31", "o3-mini", "snapshot"),
    ("openai", "gpt-4-turbo", "gpt-4.1", "default row"),
    ("anthropic", "claude-3-7-sonnet-20250219", "claude-3-7-sonnet", "snapshot"),
    ("anthropic", "claude-3-5-sonnet-latest", "claude-3-5-sonnet", "snapshot"),
    ("deepseek", "deepseek/deepseek-reasoner", "deepseek-reasoner", "snapshot"),
    ("deepseek", None, "deepseek-chat", "default row"),
])
def test_builtin_rows_match_logged_model_names(sheet_name, model, row, how):
    assert choose_row(load_sheet(sheet_name), model) == (row, how)


def test_explicit_storage_is_billed_at_each_models_own_rate():
    sh = two_model_sheet("explicit", unit_tokens=4, ttl_seconds=3600)
    sh["models"]["y"]["storage_per_mtok_hour"] = 4e6  # x stores at 1 per token-hour
    rc_reqs = [modeled("a", R[:12], "y"), modeled("b", R[:20], "y"), modeled("c", R[:8], "x"),
               modeled("d", R[:12], "x")]
    for i, tr in enumerate(rc_reqs):
        tr.request.timestamp = 1800.0 * (i % 2)  # each read half an hour after its write
    (c,) = price_sheet(rc_reqs, sh, ReplayCache(rc_reqs, ReplayConfig(block_size=16)))
    # one cache per model: b reads a's 3 pages (y), d reads c's 2 pages (x); each page is
    # stored 0.5 h plus one TTL = 1.5 h
    assert c.per_call_cached == [0, 12, 0, 8]
    assert c.storage_token_hours == (3 + 2) * 4 * 1.5
    assert c.storage == 3 * 4 * 1.5 * 4.0 + 2 * 4 * 1.5 * 1.0
