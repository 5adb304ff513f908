"""`prefixcache generate` and `prefixcache demo` on the built-in model; the engine flags
that every command shares (generated from EngineConfig); subcommand loading."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.cli import SUBCOMMANDS, build_parser, main
from prefixcache.config import EngineConfig
from prefixcache.engine.args import config_from_args, engine_fields
from prefixcache.model.registry import DEFAULT_MODEL
from prefixcache.sampling_params import ParamError


def test_generate_json_matches_the_offline_api(capsys):
    assert main(["generate", "--model", "builtin:tiny", "--raw", "--json", "--max-tokens", "6",
                 "Hello there", "Hello there!"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    ref = LLM("builtin:tiny").generate(["Hello there", "Hello there!"],
                                      SamplingParams(max_tokens=6, temperature=0.0))
    assert [x["token_ids"] for x in lines] == [r.outputs[0].token_ids for r in ref]
    assert [x["prompt_tokens"] for x in lines] == [12, 13]  # <bos> + 11 / 12 bytes
    assert all(x["finish_reason"] in ("stop", "length") for x in lines)


def test_demo_shows_hits_and_one_prefill_for_the_burst(capsys):
    assert main(["demo", "--model", "builtin:tiny", "--burst", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # undo rich's line wrapping
    assert "hit rate" in out and "warm 5" in out and "How many items can one card hold? ->" in out
    # 1922-token prompts: the leader computes 1922, each follower only its last 2 tokens
    assert "burst of 3 identical cold requests (1922 tokens each): 1926 prefill tokens" in out


def test_user_errors_print_one_line_and_exit_2(capsys, tmp_path):
    assert main(["generate", "--model", "builtin:tiny", "--max-tokens", "-1", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prefixcache generate: error: max_tokens: must be at least 0")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["generate", "--model", str(tmp_path / "missing"), "x"]) == 2
    assert str(tmp_path / "missing") in capsys.readouterr().err


def test_empty_text_prompt_and_kv_pool_limit_are_named():
    llm = LLM("builtin:tiny", num_pages=40, block_size=16, max_model_len=1024)
    with pytest.raises(ParamError) as e:
        llm.generate([""], SamplingParams(max_tokens=2))
    assert e.value.param == "prompt" and "empty" in str(e.value)
    with pytest.raises(ParamError) as e:
        llm.generate([{"prompt_token_ids": [5] * 700}], SamplingParams(max_tokens=2))
    assert "the KV pool allows 640 tokens (40 pages of 16 tokens" in str(e.value)
    assert llm.stats()["pages_live"] == 0


def _engine_flags(command: str) -> dict[str, argparse.Action]:
    """The engine flags of ``command``'s parser, by dest."""
    parser = build_parser([command])
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    fields = {f.name for f in engine_fields()} | {"kv_cache_gib", "host_cache_gib",
                                                  "disk_cache_gib"}
    return {a.dest: a for a in sub.choices[command]._actions if a.dest in fields}


def parse(command: str, *argv: str) -> argparse.Namespace:
    return build_parser([command]).parse_args([command, *argv])


def test_every_engine_command_has_the_same_flags():
    cli_fields = [f for f in dataclasses.fields(EngineConfig) if f.metadata.get("cli", True)]
    assert "shuffle_seed" not in {f.name for f in cli_fields}
    flags = {cmd: _engine_flags(cmd) for cmd in ("generate", "demo", "serve")}
    gib = {"kv_cache_bytes": "kv_cache_gib", "host_cache_bytes": "host_cache_gib",
           "disk_cache_bytes": "disk_cache_gib"}
    want = ({f.name for f in cli_fields} - set(gib)) | set(gib.values())
    for cmd, actions in flags.items():
        assert set(actions) == want, cmd
        shape = {d: (a.option_strings, a.default, a.type, a.help, a.required)
                 for d, a in actions.items()}
        assert shape == {d: (a.option_strings, a.default, a.type, a.help, a.required)
                         for d, a in flags["generate"].items()}, cmd
    # one default model everywhere: the demo's (the offline LLM() keeps builtin:tiny)
    assert flags["serve"]["model"].default == DEFAULT_MODEL
    assert not flags["serve"]["model"].required
    a = flags["generate"]
    assert a["seed"].option_strings == ["--seed"] and a["seed"].default == 0
    assert a["enable_prefix_caching"].option_strings == ["--no-prefix-caching"]
    assert a["kv_cache_gib"].default == 1.0 and "(GiB)" in a["kv_cache_gib"].help
    assert a["block_size"].help == "KV page size (tokens); default: 16"
    assert "default: the model's context length" in a["max_model_len"].help
    # bench-engine and bench share the dtype flag
    assert _engine_flags("bench-engine")["dtype"].type is a["dtype"].type
    assert _engine_flags("bench")["dtype"].type is a["dtype"].type


@pytest.mark.parametrize("command,extra", [("generate", ["x"]), ("demo", []), ("serve", [])])
def test_flags_build_the_same_config_in_every_command(command, extra, monkeypatch):
    monkeypatch.setenv("PREFIXCACHE_HASH_SEED", "from-env")
    c = config_from_args(parse(command, *extra))
    # every command defaults to the demo's real model; EngineConfig keeps builtin:tiny
    assert c == EngineConfig(model=DEFAULT_MODEL, hash_root_seed="from-env")
    assert EngineConfig().model == "builtin:tiny"
    c = config_from_args(parse(
        command, *extra, "--seed", "7", "--dtype", "bf16", "--kv-cache-gib", "0.5",
        "--no-prefix-caching", "--deterministic", "--max-model-len", "300",
        "--allow-long-context", "--num-threads", "1", "--hash-root-seed", "flag",
        "--max-waiting-requests", "3", "--cache-aware-window-s", "0"))
    assert (c.seed, c.dtype, c.kv_cache_bytes, c.enable_prefix_caching, c.deterministic,
            c.max_model_len, c.allow_long_context, c.num_threads, c.hash_root_seed,
            c.max_waiting_requests, c.cache_aware_window_s) == (
        7, "bfloat16", 1 << 29, False, True, 300, True, 1, "flag", 3, 0.0)


def test_bad_dtype_flag_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        parse("generate", "--dtype", "float64", "x")
    assert e.value.code == 2
    assert "argument --dtype: dtype: unsupported dtype 'float64'" in capsys.readouterr().err


def test_sampling_seed_is_the_requests_seed_and_seed_the_engines(capsys):
    sampled = ["generate", "--model", "builtin:tiny", "--raw", "--json", "--max-tokens", "8",
               "--temperature", "1.0", "Hi"]
    assert main([*sampled, "--sampling-seed", "3"]) == 0
    assert main([*sampled, "--sampling-seed", "3", "--seed", "99"]) == 0
    a, b = (json.loads(x)["token_ids"] for x in capsys.readouterr().out.splitlines())
    ref = LLM("builtin:tiny", seed=5).generate(
        ["Hi"], SamplingParams(max_tokens=8, temperature=1.0, seed=3))[0].outputs[0].token_ids
    assert a == b == ref  # a request's own seed wins over the engine's
    assert main([*sampled, "--seed", "11"]) == 0
    c = json.loads(capsys.readouterr().out)["token_ids"]
    engine_seeded = LLM("builtin:tiny", seed=11).generate(
        ["Hi"], SamplingParams(max_tokens=8, temperature=1.0))[0].outputs[0].token_ids
    assert c == engine_seeded and c != a


def test_a_broken_subcommand_import_shows_its_error(tmp_path, monkeypatch):
    (tmp_path / "broken_subcommand.py").write_text("import prefixcache.no_such_module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(SUBCOMMANDS, "broken", "broken_subcommand")
    with pytest.raises(ModuleNotFoundError) as e:
        main(["broken"])
    assert e.value.name == "prefixcache.no_such_module"
    with pytest.raises(ModuleNotFoundError):
        build_parser(["--help"])  # listing every subcommand imports them all
    # another subcommand still runs: the broken one is listed, not loaded
    assert build_parser(["generate"]).parse_args(["generate", "x"]).prompts == ["x"]


def test_add_engine_args_names_unknown_fields():
    from prefixcache.engine.args import add_engine_args

    with pytest.raises(ValueError, match=r"^include: no engine flag for \['shuffle_seed'\]"):
        add_engine_args(argparse.ArgumentParser(), include=("dtype", "shuffle_seed"))
    with pytest.raises(ValueError, match=r"^defaults: no engine flag for \['nope'\]"):
        add_engine_args(argparse.ArgumentParser(), defaults={"nope": 1})
    with pytest.raises(ValueError, match="^defaults: deterministic has no --no- flag"):
        add_engine_args(argparse.ArgumentParser(), defaults={"deterministic": True})
    p = argparse.ArgumentParser()
    add_engine_args(p, include=("block_size",), defaults={"block_size": 32})
    assert vars(p.parse_args([])) == {"block_size": 32}


def test_chat_outputs_carry_the_rendered_prompt(capsys):
    llm = LLM("builtin:tiny")
    out = llm.chat([{"role": "user", "content": "Hi"}],
                   SamplingParams(max_tokens=2, temperature=0.0))[0]
    assert out.prompt == "<bos><|user|>Hi<|end|><|assistant|>"
    # the same ids as before: the text is rendered once and encoded without extra specials
    assert out.prompt_token_ids == [256, 259, 72, 105, 262, 260]
    assert main(["generate", "--model", "builtin:tiny", "--chat", "--json", "--max-tokens",
                 "2", "Hi"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["prompt"] == "<bos><|user|>Hi<|end|><|assistant|>"
    assert line["prompt_tokens"] == 6 and line["token_ids"] == out.outputs[0].token_ids
    # the template is the default; --raw sends the text as is
    assert main(["generate", "--model", "builtin:tiny", "--json", "--max-tokens", "2",
                 "Hi"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt"] == line["prompt"]
    assert main(["generate", "--model", "builtin:tiny", "--raw", "--json", "--max-tokens", "2",
                 "Hi"]) == 0
    raw = json.loads(capsys.readouterr().out)
    assert raw["prompt"] == "Hi" and raw["prompt_tokens"] == 3  # <bos> H i
    with pytest.raises(SystemExit) as exc:  # argparse: one or the other
        main(["generate", "--model", "builtin:tiny", "--raw", "--chat", "Hi"])
    assert exc.value.code == 2
    assert "--chat: not allowed with argument --raw" in capsys.readouterr().err


def test_tier_flags_reach_the_config(tmp_path):
    args = parse("serve", "--host-cache-gib", "0.5", "--disk-cache-dir", str(tmp_path),
                 "--disk-cache-gib", "2")
    cfg = config_from_args(args)
    assert cfg.host_cache_bytes == 1 << 29 and cfg.disk_cache_bytes == 2 << 30
    assert cfg.disk_cache_dir == str(tmp_path)
    off = config_from_args(parse("serve"))
    assert off.host_cache_bytes == 0 and off.disk_cache_dir is None
