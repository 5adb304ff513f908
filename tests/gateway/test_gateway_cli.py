"""``prefixcache gateway``: flag parsing and user errors."""
from __future__ import annotations

import json

import pytest

from prefixcache.cli import main
from prefixcache.gateway.cli import load_policies
from prefixcache.gateway.upstreams import UpstreamSpec, parse_upstream
from prefixcache.server import anthropic_wire as wire


def test_upstream_specs_parse_and_bad_ones_name_the_flag():
    assert parse_upstream("claude=https://api.anthropic.com,provider=anthropic,"
                          "models=claude-sonnet-4-5|claude-opus-4-1,key-env=ANTHROPIC_KEY,"
                          "timeout-s=30") == UpstreamSpec(
        "claude", "https://api.anthropic.com", "anthropic",
        ("claude-sonnet-4-5", "claude-opus-4-1"), "ANTHROPIC_KEY", 30.0)
    assert parse_upstream("local=http://127.0.0.1:8000/").url == "http://127.0.0.1:8000"
    for bad, msg in (("nourl", "NAME=URL"), ("x=ftp://h", "NAME=URL"),
                     ("x=http://h,provider=gemini", "provider must be"),
                     ("x=http://h,colour=red", "unknown option"),
                     ("x=http://h,timeout-s=0", "timeout-s must be > 0")):
        with pytest.raises(ValueError, match=msg):
            parse_upstream(bad)


def test_tenant_policies_are_checked(tmp_path):
    p = tmp_path / "policy.json"
    p.write_text(json.dumps({"alice": {"cache_ttl_s": 60, "cache_sampled": True},
                             "*": {"semantic": False}}))
    pol = load_policies(str(p))
    assert pol["alice"].cache_ttl_s == 60.0 and pol["alice"].cache_sampled
    p.write_text(json.dumps({"bob": {"ttl": 5}}))
    with pytest.raises(ValueError, match=r"^--tenant-policy: bob\.ttl: unknown field"):
        load_policies(str(p))
    p.write_text(json.dumps({"bob": {"cache_ttl_s": -1}}))
    with pytest.raises(ValueError, match=r"bob\.cache_ttl_s: must be a finite number > 0"):
        load_policies(str(p))


def test_a_bad_flag_is_a_one_line_user_error(capsys, tmp_path):
    assert main(["gateway", "--upstream", "x=http://h,provider=nope"]) == 2
    assert "prefixcache gateway: error: --upstream x: provider must be" in capsys.readouterr().err
    missing = str(tmp_path / "none.json")
    assert main(["gateway", "--upstream", "x=http://h", "--api-keys", missing]) == 2
    assert "API-key file not found" in capsys.readouterr().err


def test_wire_translation_round_trips_text_tools_and_stops():
    msg = {"model": "m", "max_tokens": 7, "system": [{"type": "text", "text": "S"}],
           "stop_sequences": ["END"], "temperature": 0,
           "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
           "messages": [{"role": "user", "content": "q"},
                        {"role": "assistant", "content": [
                            {"type": "text", "text": "calling"},
                            {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
                        {"role": "user", "content": [
                            {"type": "tool_result", "tool_use_id": "t1", "content": "42"}]}]}
    chat = wire.messages_to_chat(msg)
    assert chat["messages"][0] == {"role": "system", "content": "S"}
    assert chat["messages"][2]["tool_calls"][0]["function"] == {"name": "f",
                                                               "arguments": '{"a": 1}'}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "t1", "content": "42"}
    assert chat["stop"] == ["END"] and chat["tools"][0]["function"]["name"] == "f"
    back = wire.chat_to_messages(chat)
    assert back["system"] == msg["system"] and back["tools"] == msg["tools"]
    assert back["messages"][1]["content"] == msg["messages"][1]["content"]
    assert back["messages"][2]["content"] == msg["messages"][2]["content"]
    assert back["stop_sequences"] == ["END"] and back["max_tokens"] == 7
    assert wire.pin_ttl_s(msg) is None
    msg["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    assert wire.pin_ttl_s(msg) == 3600.0
    msg["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "2h"}
    with pytest.raises(wire.WireError) as err:
        wire.pin_ttl_s(msg)
    assert err.value.param == "system[0].cache_control"
    with pytest.raises(wire.WireError) as err:
        wire.messages_to_chat({"messages": [{"role": "user", "content": [{"type": "image"}]}]})
    assert err.value.param == "messages[0].content[0]"


def test_build_app_serves_and_checks_its_flags(tmp_path):
    from starlette.testclient import TestClient

    from prefixcache.cli import build_parser
    from prefixcache.gateway.cli import build_app
    from tests.server.live import free_port

    argv = ["gateway", "--upstream", "x=http://127.0.0.1:9,models=m", "--port",
            str(free_port())]
    app = build_app(build_parser(argv).parse_args(argv))
    with TestClient(app) as c:
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/v1/models").json()["data"][0]["id"] == "m"
        big = c.post("/v1/chat/completions", content=b"x" * 3_000_000)
        assert big.status_code == 413
    bad = argv + ["--max-body-bytes", "100"]
    with pytest.raises(SystemExit):  # argparse refuses it (test_numeric_flags_...)
        build_parser(bad).parse_args(bad)
    twice = argv + ["--upstream", "x=http://h"]
    with pytest.raises(ValueError, match="unique"):
        build_app(build_parser(twice).parse_args(twice))


@pytest.mark.parametrize("flag, value, says", [
    ("--semantic-threshold", "2", "must be in (0, 1], not 2"),
    ("--semantic-threshold", "0", "must be in (0, 1], not 0"),
    ("--semantic-threshold", "-0.5", "must be in (0, 1]"),
    ("--semantic-threshold", "nan", "must be in (0, 1], not nan"),
    ("--semantic-threshold", "inf", "must be in (0, 1], not inf"),
    ("--semantic-threshold", "high", "not a number: 'high'"),
    ("--cache-entries", "0", "must be >= 1, not 0"),
    ("--cache-entries", "-5", "must be >= 1, not -5"),
    ("--cache-entries", "inf", "not an integer: 'inf'"),
    ("--max-body-bytes", "100", "must be >= 1024, not 100"),
    ("--max-body-bytes", "nan", "not an integer: 'nan'"),
    ("--port", "0", "must be >= 1, not 0"),
    ("--port", "70000", "must be a TCP port (1-65535), not 70000"),
])
def test_numeric_flags_out_of_range_are_argparse_errors_naming_the_flag(
        capsys, flag, value, says):
    with pytest.raises(SystemExit) as exc:
        main(["gateway", "--upstream", "x=http://h", flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"prefixcache gateway: error: argument {flag}: {says}" in err


def test_semantic_threshold_in_range_is_accepted():
    from prefixcache.cli import build_parser

    argv = ["gateway", "--upstream", "x=http://h", "--semantic-threshold", "1"]
    assert build_parser(argv).parse_args(argv).semantic_threshold == 1.0


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1"])
def test_upstream_timeout_must_be_positive_and_finite(value):
    with pytest.raises(ValueError, match="timeout-s must be > 0 and finite"):
        parse_upstream(f"x=http://h,timeout-s={value}")


@pytest.mark.parametrize("ttl", ["Infinity", "NaN", "true", "0"])
def test_tenant_policy_ttl_must_be_positive_and_finite(tmp_path, ttl):
    p = tmp_path / "policy.json"
    p.write_text('{"bob": {"cache_ttl_s": ' + ttl + '}}')
    with pytest.raises(ValueError, match=r"bob\.cache_ttl_s: must be a finite number > 0$"):
        load_policies(str(p))


@pytest.mark.parametrize("entry, says", [
    ({"semantic": "false"}, "carol.semantic: must be true or false"),
    ({"semantic": 0}, "carol.semantic: must be true or false"),
    ({"cache_sampled": "no"}, "carol.cache_sampled: must be true or false"),
    ({"cache_sampled": None}, "carol.cache_sampled: must be true or false"),
    ({"store_finish_reasons": "stop"}, "carol.store_finish_reasons: must be a list drawn "
                                       "from stop, length, tool_calls, content_filter"),
    ({"store_finish_reasons": [1, None]}, "carol.store_finish_reasons: must be a list"),
    ({"store_finish_reasons": ["stop", "error"]}, "carol.store_finish_reasons: must be"),
    ({"cache_ttl_s": "60"}, "carol.cache_ttl_s: must be a finite number > 0"),
    ({"Semantic": True}, "carol.Semantic: unknown field"),
])
def test_tenant_policy_values_are_strictly_typed(tmp_path, capsys, entry, says):
    p = tmp_path / "policy.json"
    p.write_text(json.dumps({"alice": {}, "carol": entry}))
    with pytest.raises(ValueError) as exc:
        load_policies(str(p))
    assert str(exc.value).startswith(f"--tenant-policy: {says}")
    assert main(["gateway", "--upstream", "x=http://h", "--tenant-policy", str(p)]) == 2
    assert f"prefixcache gateway: error: --tenant-policy: {says}" in capsys.readouterr().err


def test_tenant_policy_whole_file_shape_and_defaults(tmp_path):
    from prefixcache.gateway.policy import TenantPolicy

    p = tmp_path / "policy.json"
    p.write_text(json.dumps({
        "carol": {"semantic": False, "cache_sampled": True, "cache_ttl_s": 1.5,
                  "store_finish_reasons": ["stop", "tool_calls", "content_filter"]},
        "*": {}}))
    pol = load_policies(str(p))
    assert pol == {"carol": TenantPolicy(1.5, True, False,
                                         ("stop", "tool_calls", "content_filter")),
                   "*": TenantPolicy(3600.0, False, False, ("stop", "length"))}
    for bad, says in (([], "must hold a JSON object"), ({"dave": []}, "dave: must be an")):
        p.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=f"^--tenant-policy: {says}"):
            load_policies(str(p))
