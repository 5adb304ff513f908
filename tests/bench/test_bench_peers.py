"""Peers: clear skip messages when absent, and the offline engine loop on a fake engine."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixcache.bench import runner
from prefixcache.bench.peers import PeerContext, PeerUnavailable, make_peer
from prefixcache.bench.peers.ours_offline import drive_engine
from prefixcache.bench.peers.server import ServerProcess
from prefixcache.bench.prompts import Prompt
from prefixcache.bench.workloads import BenchRequest, WorkloadConfig
from prefixcache.outputs import CompletionOutput, RequestOutput


def ctx(tmp_path, **kw) -> PeerContext:
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    return PeerContext(model=str(model_dir), model_dir=model_dir, work_dir=tmp_path / "work",
                       peers_dir=tmp_path / "no-peers", **kw)


@pytest.mark.parametrize("name, venv", [("vllm", "vllm"), ("llamacpp", "llamacpp")])
def test_absent_peer_venv_gives_a_clear_skip_message(tmp_path, name, venv):
    peer = make_peer(name, "serving")
    with pytest.raises(PeerUnavailable) as exc:
        peer.check(ctx(tmp_path))
    msg = str(exc.value)
    assert f"no-peers/{venv}/bin/python is missing" in msg and "make peers" in msg


def test_llamacpp_needs_the_converter_from_the_sdist(tmp_path):
    c = ctx(tmp_path)
    (c.peers_dir / "llamacpp" / "bin").mkdir(parents=True)
    (c.peers_dir / "llamacpp" / "bin" / "python").touch()
    with pytest.raises(PeerUnavailable, match="GGUF converter is missing"):
        make_peer("llamacpp", "serving").check(c)


def test_modes_and_models_peers_cannot_use(tmp_path):
    with pytest.raises(PeerUnavailable, match="serving mode only, skipped in offline mode"):
        make_peer("vllm", "offline")
    with pytest.raises(PeerUnavailable, match="serving mode only"):
        make_peer("llamacpp", "offline")
    assert make_peer("transformers", "serving").mode == "offline"  # no server: runs offline
    with pytest.raises(PeerUnavailable, match="needs a Hugging Face model directory"):
        make_peer("transformers", "offline").check(PeerContext(model="builtin:tiny",
                                                               model_dir=None))
    with pytest.raises(ValueError, match="unknown peer"):
        make_peer("tgi", "serving")


def test_runner_skips_absent_peers_and_reports_why(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "resolve_model", lambda m: (str(tmp_path), tmp_path))
    monkeypatch.setattr(runner, "make_renderer", lambda m, d: _CharRenderer())
    monkeypatch.setattr(runner, "model_limit", lambda m, d: 4096)
    monkeypatch.setattr(runner.wl, "build_workload", lambda name, cfg, measure=None: [
        BenchRequest(id="r", session="r", prompt="hello", max_tokens=2)])
    import prefixcache.bench.peers.base as base
    monkeypatch.setattr(base.PeerContext, "__init__",
                        _patched_init(base.PeerContext.__init__, tmp_path))
    opts = runner.BenchOptions(workloads=["few-shot"], peers=["vllm", "llamacpp"],
                               modes=["serving", "offline"], workload_config=WorkloadConfig(),
                               progress=False)
    logs: list[str] = []
    result = runner.run_bench(opts, log=logs.append)
    assert result.summaries == []
    reasons = {(s.peer, s.mode): s.reason for s in result.skipped}
    assert set(reasons) == {("vllm", "serving"), ("llamacpp", "serving")}
    assert "make peers" in reasons[("vllm", "serving")]
    assert result.failed == []  # absent is no failure
    assert any(line.startswith("skip vllm (serving): not installed") for line in logs)


def test_plan_runs_each_peer_in_the_modes_it_has():
    skipped, logs = [], []
    plan = runner.plan_runs(["prefixcache", "transformers", "vllm"], ["offline", "serving"],
                            skipped, logs.append)
    assert plan == [("prefixcache", "offline"), ("transformers", "offline"),
                    ("prefixcache", "serving"), ("vllm", "serving")]
    assert skipped == []
    plan = runner.plan_runs(["vllm", "transformers"], ["offline"], skipped, logs.append)
    assert plan == [("transformers", "offline")]
    assert [s.peer for s in skipped] == ["vllm"] and "serving mode only" in skipped[0].reason
    assert logs == ["skip vllm: vllm: runs in serving mode only, not in offline mode"]
    # --mode serving runs serving peers only: transformers has no server
    skipped, logs = [], []
    peers = ["prefixcache", "transformers", "vllm"]
    plan = runner.plan_runs(peers, ["serving"], skipped, logs.append)
    assert plan == [("prefixcache", "serving"), ("vllm", "serving")]
    assert [(s.peer, s.failed) for s in skipped] == [("transformers", False)]
    assert "offline mode only" in skipped[0].reason


def _patched_init(orig, tmp_path):
    def init(self, *a, **kw):
        orig(self, *a, **kw)
        self.peers_dir = tmp_path / "no-peers"
    return init


class _CharRenderer:
    def render(self, req):
        return Prompt(req.prompt, [ord(c) for c in req.prompt])


# --------------------------------------------------------------------------- offline loop
class FakeEngine:
    """One token per step per running request; the first step of a request is its
    prefill. Requests whose prompt starts with 7 report 16 cached tokens."""

    def __init__(self):
        self.running: dict[str, dict] = {}
        self.added: list[tuple[str, int, str | None]] = []
        self.counters = {"prefill_tokens_computed": 0}

    def add_request(self, rid, ids, params, tenant=None, cache_salt=None):
        if len(ids) > 100:
            raise ValueError("prompt: too long")
        self.added.append((rid, len(ids), tenant))
        self.running[rid] = {"ids": ids, "out": [], "max": params.max_tokens,
                             "cached": 16 if ids[0] == 7 else 0}

    def has_unfinished_requests(self):
        return bool(self.running)

    def step(self):
        outs = []
        for rid, st in list(self.running.items()):
            if not st["out"]:
                self.counters["prefill_tokens_computed"] += len(st["ids"]) - st["cached"]
            st["out"].append(1)
            done = len(st["out"]) == st["max"]
            out = CompletionOutput(0, "", list(st["out"]),
                                   finish_reason="length" if done else None)
            outs.append(RequestOutput(request_id=rid, prompt=None, prompt_token_ids=st["ids"],
                                      outputs=[out], finished=done,
                                      num_cached_tokens=st["cached"]))
            if done:
                del self.running[rid]
        return outs


def test_drive_engine_records_ttft_cached_tokens_and_rejections():
    reqs = [BenchRequest(id="a0", session="a", turn=0, max_tokens=3, tenant="t"),
            BenchRequest(id="a1", session="a", turn=1, max_tokens=2, tenant="t"),
            BenchRequest(id="b0", session="b", max_tokens=1),
            BenchRequest(id="big", session="c", max_tokens=1)]
    prompts = {"a0": Prompt(None, [5] * 20), "a1": Prompt(None, [7] * 30),
               "b0": Prompt(None, [7] * 17), "big": Prompt(None, [1] * 101)}
    eng = FakeEngine()
    done = []
    results, wall = drive_engine(eng, reqs, prompts, concurrency=2, on_done=done.append)
    by_id = {r.id: r for r in results}
    assert len(done) == 4 and wall > 0
    assert [a[0] for a in eng.added] == ["a0", "b0", "a1"]  # big was rejected, a1 waited for a0
    assert eng.added[0][2] == "t"
    got = (by_id["a0"].output_tokens, by_id["a0"].cached_tokens, by_id["a1"].cached_tokens)
    assert got == (3, 0, 16)
    assert by_id["a1"].send_time >= by_id["a0"].end_time
    assert all(r.first_token_time is not None and r.error is None for r in results if r.id != "big")
    assert by_id["big"].error.startswith("ValueError: prompt: too long")
    assert eng.counters["prefill_tokens_computed"] == 20 + 14 + 1


def test_server_process_start_failure_shows_the_log(tmp_path):
    import sys

    code = "import sys; print('boom: no model'); sys.exit(3)"
    proc = ServerProcess([sys.executable, "-c", code], {}, tmp_path / "logs" / "x.log")
    proc.start()
    first_line = r"^server exited with code 3 during start-up: boom: no model \(log "
    with pytest.raises(PeerUnavailable, match=first_line):
        proc.wait_ready("http://127.0.0.1:9/health", timeout_s=30)
    proc.stop()
    assert Path(tmp_path / "logs" / "x.log").read_text().startswith("$ ")


def test_vllm_cache_salt_is_accepted_by_vllm():
    # vLLM refuses salts over 128 characters or containing '@', '/', '\\' or NUL
    peer = make_peer("vllm", "serving")
    body = peer.extra_body(BenchRequest(id="r", session="r", tenant="tenant3"),
                           "multi-tenant-0123456789ab")
    assert body == {"ignore_eos": True, "cache_salt": "multi-tenant-0123456789ab-tenant3"}
    assert peer.extra_body(BenchRequest(id="r", session="r"), "x")["cache_salt"] == "x-default"


def test_llamacpp_serves_requests_fully_and_at_fixed_length(tmp_path):
    peer = make_peer("llamacpp", "serving")
    peer.gguf = tmp_path / "m.gguf"
    c = ctx(tmp_path)
    (c.peers_dir / "llamacpp" / "bin").mkdir(parents=True)
    (c.peers_dir / "llamacpp" / "bin" / "python").touch()
    argv, env = peer.command(c, 1234)
    assert argv[argv.index("--interrupt_requests") + 1] == "false"  # else C > 1 truncates answers
    assert argv[argv.index("--n_threads") + 1] == str(c.threads) == env["OMP_NUM_THREADS"]
    body = peer.extra_body(BenchRequest(id="r", session="r", max_tokens=16), "salt")
    assert body == {"min_tokens": 16}


class _FakeOffline:
    """An offline peer: ``fail_on`` (workload -> exception) raises from ``run``."""

    mode = "offline"

    def __init__(self, name, fail_on=None):
        self.name, self.label, self.fail_on = name, f"{name} (offline)", fail_on or {}
        self.stopped = 0

    def check(self, ctx):
        pass

    def start(self, ctx):
        pass

    def stop(self):
        self.stopped += 1

    def detail(self):
        return {}

    def run(self, workload, reqs, prompts, *, concurrency, salt, progress=None, time_scale=1.0):
        from prefixcache.bench.metrics import RequestResult
        from prefixcache.bench.peers import PeerRun

        if workload in self.fail_on:
            raise self.fail_on[workload]
        rs = [RequestResult(id=r.id, session=r.session, turn=r.turn, group=r.group, tenant=None,
                            warm_expected=False, prompt_tokens=len(prompts[r.id].token_ids),
                            cached_tokens=0, output_tokens=r.max_tokens, send_time=0.0,
                            first_token_time=0.1, end_time=0.2) for r in reqs]
        return PeerRun(rs, wall_s=1.0)


def _fake_bench(tmp_path, monkeypatch, peers: dict):
    monkeypatch.setattr(runner, "resolve_model", lambda m: ("builtin:tiny", None))
    monkeypatch.setattr(runner, "make_renderer", lambda m, d: _CharRenderer())
    monkeypatch.setattr(runner, "model_limit", lambda m, d: 12)
    monkeypatch.setattr(runner.wl, "build_workload", lambda name, cfg, measure=None: [
        BenchRequest(id=f"{name}/{i}", session=f"{name}/{i}", prompt="x" * n, max_tokens=2)
        for i, n in enumerate([4, 10, 11])])
    monkeypatch.setattr(runner, "make_peer", lambda name, mode: peers[name])
    files = []
    real_open = runner._open_jsonl
    monkeypatch.setattr(runner, "_open_jsonl",
                        lambda opts: files.append(real_open(opts)) or files[-1])
    opts = runner.BenchOptions(workloads=["few-shot", "agent"], peers=list(peers),
                               modes=["offline"], json_path=tmp_path / "out.jsonl", progress=False)
    return opts, files


def test_a_peer_that_breaks_mid_run_is_failed_and_the_others_go_on(tmp_path, monkeypatch):
    bad = _FakeOffline("prefixcache", {"agent": RuntimeError("step failed")})
    good = _FakeOffline("prefixcache-nocache")
    opts, files = _fake_bench(tmp_path, monkeypatch,
                              {"prefixcache": bad, "prefixcache-nocache": good})
    logs: list[str] = []
    result = runner.run_bench(opts, log=logs.append)
    # prompts of 4, 10, 11 tokens + 2 out against 12: the 11-token one is skipped
    assert [(s["workload"], s["peer"], s["requests"]) for s in result.summaries] == [
        ("few-shot", "prefixcache", 2), ("few-shot", "prefixcache-nocache", 2),
        ("agent", "prefixcache-nocache", 2)]
    assert all(s["fit"] == {"max_model_len": 12, "built": 3, "reserve": 0, "capped": 0,
                            "skipped": 1}
               for s in result.summaries)
    assert [(s.peer, s.reason) for s in result.failed] == [
        ("prefixcache", "failed during agent: RuntimeError: step failed")]
    assert bad.stopped >= 1 and good.stopped >= 1
    assert "FAILED prefixcache (offline): failed during agent: RuntimeError: step failed" in logs
    assert result.context["failed"] == [
        {"peer": "prefixcache", "mode": "offline", "failed": True,
         "reason": "failed during agent: RuntimeError: step failed"}]
    assert files[0].closed
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3


def test_the_json_lines_file_is_closed_when_the_bench_is_interrupted(tmp_path, monkeypatch):
    peer = _FakeOffline("prefixcache", {"agent": KeyboardInterrupt()})
    opts, files = _fake_bench(tmp_path, monkeypatch, {"prefixcache": peer})
    with pytest.raises(KeyboardInterrupt):
        runner.run_bench(opts, log=lambda line: None)
    assert files[0].closed and peer.stopped >= 1
    (row,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert (row["workload"], row["requests"]) == ("few-shot", 2)


def test_a_workload_with_no_request_that_fits_is_not_run_and_fails_the_command(
        tmp_path, monkeypatch, capsys):
    from prefixcache.bench.cli import exit_status

    peer = _FakeOffline("prefixcache")
    opts, _ = _fake_bench(tmp_path, monkeypatch, {"prefixcache": peer})
    monkeypatch.setattr(runner, "model_limit", lambda m, d: 5)  # prompts of 4, 10, 11 + 2 out
    result = runner.run_bench(opts, log=lambda line: None)
    assert result.summaries == [] and result.failed == []
    assert result.not_run == {
        "few-shot": "no request fits the model's 5-token context (all 3 skipped)",
        "agent": "no request fits the model's 5-token context (all 3 skipped)"}
    assert result.context["fit"]["agent"]["skipped"] == 3
    assert exit_status(result) == 1
    assert "prefixcache bench: workload agent: no request fits" in capsys.readouterr().err
