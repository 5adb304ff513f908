"""Run workloads against peers and collect one summary per (workload, peer, mode).

Order: build and render every workload first (so servers get a context length that fits
all of them); then the offline peers, loaded side by side, workload by workload; then
each serving peer in turn: start it once, run every workload with a fresh salt, stop
it. Every run starts from a cold cache (a fresh engine offline, a fresh ``cache_salt``
when serving). A peer that is absent or fails to start is skipped with its reason; the
run goes on.
"""
from __future__ import annotations

import json
import os
import platform
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from prefixcache.bench import workloads as wl
from prefixcache.bench.metrics import RunInfo, summarize
from prefixcache.bench.peers import PEER_NAMES, PeerContext, PeerUnavailable, make_peer
from prefixcache.bench.prompts import HFRenderer, Prompt, label_warm_by_overlap

DEFAULT_MODEL = "bench"  # the random-weight Llama of bench_model.py


def default_threads() -> int:
    """All CPUs but one: the spare core runs the HTTP front ends, the bench's client and
    the OS, as vLLM-CPU reserves one core for its front end by default. Compute threads
    that share their cores with other busy threads spin at every barrier: on 2 cores,
    2 threads next to one other busy process made a decode step 18x slower."""
    return max(1, (os.cpu_count() or 2) - 1)


@dataclass
class BenchOptions:
    workloads: list[str]
    model: str = DEFAULT_MODEL
    peers: list[str] = field(default_factory=lambda: list(PEER_NAMES))
    modes: list[str] = field(default_factory=lambda: ["offline", "serving"])
    concurrency: int = 4  # serving mode
    offline_concurrency: int = 1  # offline mode: per-request latency without queueing
    threads: int = field(default_factory=lambda: default_threads())
    dtype: str = "float32"
    block_size: int = 16
    kv_cache_gib: float = 2.0
    api: str = "completions"
    time_scale: float = 1.0
    workload_config: wl.WorkloadConfig = field(default_factory=wl.WorkloadConfig)
    out_dir: Path | None = None
    json_path: Path | None = None
    work_dir: Path | None = None
    progress: bool = True


@dataclass
class Skip:
    peer: str
    mode: str
    reason: str


@dataclass
class BenchResult:
    summaries: list[dict]
    skipped: list[Skip]
    workloads: dict[str, list[wl.BenchRequest]]
    prompts: dict[str, dict[str, Prompt]]
    context: dict


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{cpu}, {os.cpu_count()} CPUs{mem}, {platform.system()} {platform.release()}"


def resolve_model(model: str) -> tuple[str, Path | None]:
    """``(what our engine loads, Hugging Face dir or None)``. ``bench`` builds/reuses the
    benchmark model; ``builtin:...`` has no directory; anything else is a directory."""
    if model == DEFAULT_MODEL:
        from prefixcache.bench.bench_model import ensure_bench_model

        d = ensure_bench_model()
        return str(d), d
    if model.startswith("builtin:"):
        return model, None
    d = Path(model).expanduser().resolve()
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"--model {model}: not a Hugging Face model directory (no config.json)")
    return str(d), d


def weights_digest(model_dir: Path | None) -> str | None:
    """sha256 (first 16 hex digits) over the directory's safetensors files, in name order."""
    if model_dir is None:
        return None
    import hashlib

    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:16]


def make_renderer(model: str, model_dir: Path | None):
    if model_dir is not None:
        return HFRenderer.from_dir(model_dir)
    from prefixcache.bench.prompts import EngineTokenizerRenderer
    from prefixcache.model.loader import load_model

    return EngineTokenizerRenderer(load_model(model, device="cpu", dtype="float32").tokenizer)


def build_all(names: list[str], cfg: wl.WorkloadConfig, renderer) -> tuple[dict, dict]:
    """Build and render each workload (a request is rendered once: measuring it for the
    session length limit and sending it use the same prompt)."""
    built, rendered = {}, {}
    for name in names:
        cache: dict[str, Prompt] = {}

        def render(req, cache=cache):
            if req.id not in cache:
                cache[req.id] = renderer.render(req)
            return cache[req.id]

        reqs = wl.build_workload(name, cfg, measure=lambda r: len(render(r).token_ids))
        if not reqs:
            raise ValueError(f"workload {name} has no requests at these sizes")
        prompts = {r.id: render(r) for r in reqs}
        label_warm_by_overlap(reqs, prompts)
        built[name], rendered[name] = reqs, prompts
    return built, rendered


def concurrency_for(workload: str, reqs: list[wl.BenchRequest], concurrency: int) -> int:
    """cold-burst sends everything at once; other workloads run at ``concurrency``."""
    return len(reqs) if workload == "cold-burst" else concurrency


def run_bench(opts: BenchOptions, log: Callable[[str], None] = print) -> BenchResult:
    model, model_dir = resolve_model(opts.model)
    renderer = make_renderer(model, model_dir)
    cfg = opts.workload_config
    log(f"building workloads: {', '.join(opts.workloads)}")
    built, rendered = build_all(opts.workloads, cfg, renderer)
    longest = max(len(p.token_ids) + r.max_tokens for name in built for r in built[name]
                  for p in [rendered[name][r.id]])
    max_model_len = -(-(longest + 64) // 1024) * 1024
    tenants = sorted({r.tenant for reqs in built.values() for r in reqs if r.tenant})
    eos = getattr(getattr(renderer, "tokenizer", None), "eos_token_id", None)
    work_dir = opts.work_dir or ((opts.out_dir / "_scratch") if opts.out_dir
                                 else Path.home() / ".cache" / "prefixcache" / "bench-scratch")
    ctx = PeerContext(model=model, model_dir=model_dir, dtype=opts.dtype, threads=opts.threads,
                      block_size=opts.block_size, max_model_len=max_model_len, kv_cache_gib=opts.kv_cache_gib,
                      api=opts.api, work_dir=work_dir, tenants=tuple(tenants), eos_token_id=eos)
    machine = machine_description()
    for name, reqs in built.items():
        n_prompt = sum(len(rendered[name][r.id].token_ids) for r in reqs)
        log(f"  {name}: {len(reqs)} requests, {len({r.session for r in reqs})} sessions, {n_prompt} prompt tokens")
    summaries, skipped = [], []
    jsonl = _open_jsonl(opts)

    def record(summary: dict) -> None:
        summaries.append(summary)
        if jsonl:
            jsonl.write(json.dumps(_without_requests(summary)) + "\n")
            jsonl.flush()
        _save_run(opts, summary)
        log(_one_line(summary))

    def start(name: str, mode: str):
        peer = make_peer(name, mode)
        try:
            peer.check(ctx)
            log(f"starting {peer.label} ...")
            t = time.perf_counter()
            peer.start(ctx)
            log(f"  {peer.label} ready in {time.perf_counter() - t:.1f} s")
            return peer
        except PeerUnavailable as exc:
            skipped.append(Skip(name, peer.mode, str(exc)))
            log(f"skip {peer.label}: {exc}")
            peer.stop()
            return None

    def run(peer, wname: str) -> bool:
        conc = concurrency_for(wname, built[wname], opts.concurrency if peer.mode == "serving"
                               else opts.offline_concurrency)
        try:
            record(run_one(peer, ctx, wname, built[wname], rendered[wname], conc, opts, machine))
            return True
        except PeerUnavailable as exc:
            skipped.append(Skip(peer.name, peer.mode, str(exc)))
            log(f"skip {peer.label}: {exc}")
            return False

    plan = plan_runs(opts.peers, opts.modes, skipped, log)
    # Offline peers are cheap to keep loaded side by side: run them workload by workload
    # (A, B, C on one workload, then the next), so a slow spell on the machine hits all
    # of them alike. Servers run one after another (each holds its cores while up).
    offline = [p for p in (start(n, m) for n, m in plan if m == "offline") if p is not None]
    try:
        for wname in built:
            for peer in list(offline):
                if not run(peer, wname):
                    offline.remove(peer)
                    peer.stop()
    finally:
        for peer in offline:
            peer.stop()
    for name, mode in plan:
        if mode != "serving":
            continue
        peer = start(name, mode)
        if peer is None:
            continue
        try:
            for wname in built:
                if not run(peer, wname):
                    break
        finally:
            peer.stop()
    if jsonl:
        jsonl.close()
    context = {"model": model, "model_dir": str(model_dir) if model_dir else None,
               "model_sha256": weights_digest(model_dir), "dtype": opts.dtype,
               "threads": opts.threads, "concurrency": opts.concurrency,
               "offline_concurrency": opts.offline_concurrency, "block_size": opts.block_size,
               "max_model_len": max_model_len, "machine": machine, "api": opts.api,
               "workload_config": {k: v for k, v in vars(cfg).items()}}
    return BenchResult(summaries, skipped, built, rendered, context)


def plan_runs(peers: list[str], modes: list[str], skipped: list[Skip], log) -> list[tuple[str, str]]:
    """``(peer, mode)`` pairs to run: every selected mode the peer supports, modes in
    order. transformers has no server, so it runs (once, offline) whatever the mode. A
    peer with no mode left is skipped with the reason."""
    from prefixcache.bench.peers import PEER_MODES

    plan = []
    for mode in modes:
        for name in peers:
            if name == "transformers":
                if ("transformers", "offline") not in plan:
                    plan.append(("transformers", "offline"))
            elif mode in PEER_MODES[name]:
                plan.append((name, mode))
    for name in peers:
        if not any(p == name for p, _ in plan):
            reason = (f"{name}: runs in {'/'.join(PEER_MODES[name])} mode only, not in "
                      f"{'/'.join(modes)} mode")
            skipped.append(Skip(name, "/".join(modes), reason))
            log(f"skip {name}: {reason}")
    return plan


def run_one(peer, ctx: PeerContext, workload: str, reqs, prompts, concurrency: int, opts: BenchOptions,
            machine: str) -> dict:
    bar = None
    if opts.progress:
        from tqdm import tqdm

        bar = tqdm(total=len(reqs), desc=f"{workload} | {peer.label}", unit="req", leave=False)
    salt = f"{workload}-{uuid.uuid4().hex[:12]}"
    load_before = os.getloadavg()[0]
    try:
        run = peer.run(workload, reqs, prompts, concurrency=concurrency, salt=salt,
                       progress=(lambda r: bar.update(1)) if bar else None, time_scale=opts.time_scale)
    finally:
        if bar:
            bar.close()
    info = RunInfo(workload=workload, model=ctx.model, peer=peer.name, mode=peer.mode, dtype=ctx.dtype,
                   threads=ctx.threads, concurrency=run.concurrency or concurrency, machine=machine,
                   block_size=ctx.block_size, max_model_len=ctx.max_model_len, peer_detail=peer.detail())
    token_ids = {r.id: prompts[r.id].token_ids for r in reqs}
    ref = wl.reference_hit_rate(reqs) if workload == "agent" else None
    summary = summarize(info, run.results, wall_s=run.wall_s, peak_rss=run.peak_rss,
                        prefill_tokens_computed=run.prefill_tokens_computed, token_ids=token_ids,
                        reference_hit_rate=ref, cache_stats=run.cache_stats,
                        cached_tokens_total=run.cached_tokens_total)
    # the machine's 1-minute load average before and after: other work on the machine
    # slows every peer, and this shows whether it did
    summary["load_average_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    # when it was measured: a report can combine runs of several invocations (OUT/runs)
    summary["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return summary


def _open_jsonl(opts: BenchOptions):
    if opts.json_path is None:
        return None
    opts.json_path.parent.mkdir(parents=True, exist_ok=True)
    return open(opts.json_path, "w")


def _without_requests(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "per_request"}


def _save_run(opts: BenchOptions, summary: dict) -> None:
    if opts.out_dir is None:
        return
    d = opts.out_dir / "runs"
    d.mkdir(parents=True, exist_ok=True)
    name = f"{summary['workload']}__{summary['peer']}__{summary['mode']}.json"
    (d / name).write_text(json.dumps(summary, indent=1))


def _fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def _one_line(s: dict) -> str:
    hr = "-" if s["hit_rate"] is None else f"{s['hit_rate']:.1%}"
    return (f"  {s['workload']:<13} {s['peer'] + ' (' + s['mode'] + ')':<32} reqs={s['requests']} err={s['errors']} "
            f"hit={hr} ttft p50={_fmt(s['ttft_p50_s'])}s p99={_fmt(s['ttft_p99_s'])}s "
            f"req/s={_fmt(s['requests_per_s'], '.2f')} out tok/s={_fmt(s['output_tok_s'], '.1f')}"
            + (f" cross-tenant={s['cross_tenant_hits']}" if "cross_tenant_hits" in s else ""))


def load_runs(out_dir: Path) -> list[dict]:
    """Every per-run JSON under ``out_dir/runs`` (to re-make reports without rerunning)."""
    return [json.loads(p.read_text()) for p in sorted((out_dir / "runs").glob("*__*__*.json"))]

