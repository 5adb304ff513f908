"""Run workloads against peers and collect one summary per (workload, peer, mode).

Order: read the model's context length, build, render and fit every workload to it
(:mod:`prefixcache.bench.fit`: every peer gets the same requests, and every peer is
started with the model's own ``max_model_len``); then the offline peers, loaded side by
side, workload by workload; then each serving peer in turn: start it once, run every
workload with a fresh salt, stop it. Every run starts from a cold cache (a fresh engine
offline, a fresh ``cache_salt`` when serving). A peer that is absent here is skipped with
its reason; one that fails to start or breaks down mid-run is recorded as *failed* with
its error (the tables show it, the command exits non-zero); the run goes on.
"""
from __future__ import annotations

import json
import os
import platform
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prefixcache.bench import workloads as wl
from prefixcache.bench.fit import FitReport, fit_workload, special_tokens_added
from prefixcache.bench.fit import model_max_len as model_limit
from prefixcache.bench.metrics import RunInfo, summarize
from prefixcache.bench.peers import PEER_NAMES, PeerContext, PeerUnavailable, make_peer
from prefixcache.bench.prompts import Prompt, TokenizerRenderer, label_warm_by_overlap
from prefixcache.model.registry import DEFAULT_MODEL

BENCH_MODEL = "bench"  # the random-weight Llama of bench_model.py (still selectable)


def default_threads() -> int:
    """All CPUs but one: the spare core runs the HTTP front ends, the bench's client and
    the OS, as vLLM-CPU reserves one core for its front end by default. Compute threads
    that share their cores with other busy threads spin at every barrier, which makes
    every step many times slower."""
    return max(1, (os.cpu_count() or 2) - 1)


@dataclass
class BenchOptions:
    workloads: list[str]
    model: str = DEFAULT_MODEL  # the real default model (the registry's)
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
    """A peer that did not run. ``failed``: it was asked for and could run here, but
    failed to start or stopped mid-run (the bench then exits non-zero); otherwise it is
    absent or lacks the mode (not installed, no server), which is no failure."""

    peer: str
    mode: str
    reason: str
    failed: bool = False


@dataclass
class BenchResult:
    summaries: list[dict]
    skipped: list[Skip]
    workloads: dict[str, list[wl.BenchRequest]]
    prompts: dict[str, dict[str, Prompt]]
    context: dict
    # workloads with no request that fits the model: name -> why
    not_run: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[Skip]:
        return [s for s in self.skipped if s.failed]


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
    benchmark model; ``builtin:...`` has no directory; a registered name (e.g.
    ``smollm2-135m-instruct-q4_1``), a ``.gguf`` file or a directory holding one gives its
    dequantized float32 copy in the GGUF cache, which every peer then reads; anything else
    is a Hugging Face directory.

    Raises:
        FileNotFoundError: not a model directory (no ``config.json``), or a registered
            model whose package is not installed (the message says how to install it).
    """
    if model == BENCH_MODEL:
        from prefixcache.bench.bench_model import ensure_bench_model

        d = ensure_bench_model()
        return str(d), d
    if model.startswith("builtin:"):
        return model, None
    from prefixcache.model.registry import model_dir

    d = model_dir(model).expanduser().resolve()
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"--model {model}: not a Hugging Face model directory "
                                "(no config.json) nor a GGUF file")
    return str(d), d


def describe_model(name: str, model_dir: Path | None) -> str:
    """One line on the model a run used, from its ``config.json`` (``""`` without one)."""
    if model_dir is None or not (model_dir / "config.json").is_file():
        return ""
    from prefixcache.model.config import ModelConfig
    from prefixcache.model.registry import is_converted

    c = ModelConfig.from_dir(model_dir)
    desc = (f"{c.architecture}, {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
            f"{c.num_attention_heads}/{c.num_key_value_heads} heads, "
            f"{c.intermediate_size} MLP, vocab {c.vocab_size}, context {c.context_length}")
    if name == BENCH_MODEL:
        desc += "; random weights (the benchmark model)"
    elif is_converted(model_dir):
        desc += "; GGUF weights dequantized to float32 (the copy every peer reads)"
    return desc


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
        return TokenizerRenderer.from_dir(model_dir)
    from prefixcache.model.loader import load_model

    tokenizer = load_model(model, device="cpu", dtype="float32").tokenizer
    if tokenizer is None:
        raise ValueError(f"--model {model}: the model has no tokenizer to render prompts with")
    return TokenizerRenderer(tokenizer)


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
        built[name], rendered[name] = reqs, {r.id: render(r) for r in reqs}
    return built, rendered


def concurrency_for(workload: str, reqs: list[wl.BenchRequest], concurrency: int) -> int:
    """cold-burst sends everything at once; other workloads run at ``concurrency``."""
    return len(reqs) if workload == "cold-burst" else concurrency


@dataclass
class Prepared:
    """The fitted workloads and the context every peer of the run shares."""

    ctx: PeerContext
    built: dict[str, list[wl.BenchRequest]]
    rendered: dict[str, dict[str, Prompt]]
    fits: dict[str, FitReport]
    not_run: dict[str, str]
    machine: str


def prepare(opts: BenchOptions, log: Callable[[str], None]) -> Prepared:
    """Resolve the model, build, render and fit every workload to the model's context."""
    model, model_dir = resolve_model(opts.model)
    renderer = make_renderer(model, model_dir)
    max_model_len = model_limit(model, model_dir)
    log(f"building workloads: {', '.join(opts.workloads)}")
    built, rendered = build_all(opts.workloads, opts.workload_config, renderer)
    fits, not_run = {}, {}
    reserve = special_tokens_added(getattr(renderer, "tokenizer", None))
    for name in list(built):
        reqs, prompts, fits[name] = fit_workload(built[name], rendered[name], renderer,
                                                 max_model_len, reserve)
        # warm by overlap with what is actually sent (fitting may skip or cap requests)
        label_warm_by_overlap(reqs, prompts)
        n_prompt = sum(len(p.token_ids) for p in prompts.values())
        log(f"  {name}: {len(reqs)} requests, {len({r.session for r in reqs})} sessions, "
            f"{n_prompt} prompt tokens; {fits[name].describe()}")
        if not reqs:
            not_run[name] = (f"no request fits the model's {max_model_len:,}-token context "
                             f"(all {fits[name].built} skipped)")
            del built[name], rendered[name]
            continue
        built[name], rendered[name] = reqs, prompts
    tenants = sorted({r.tenant for reqs in built.values() for r in reqs if r.tenant})
    tok = getattr(renderer, "tokenizer", None)
    eos = min(tok.eos_token_ids, default=None) if model_dir and tok is not None else None
    work_dir = opts.work_dir or ((opts.out_dir / "_scratch") if opts.out_dir
                                 else Path.home() / ".cache" / "prefixcache" / "bench-scratch")
    ctx = PeerContext(model=model, model_dir=model_dir, dtype=opts.dtype, threads=opts.threads,
                      block_size=opts.block_size, max_model_len=max_model_len,
                      kv_cache_gib=opts.kv_cache_gib, api=opts.api, work_dir=work_dir,
                      tenants=tuple(tenants), eos_token_id=eos)
    return Prepared(ctx, built, rendered, fits, not_run, machine_description())


class Recorder:
    """Collects summaries and skips; writes each summary to the JSON Lines file (closed
    on leaving the ``with`` block, whatever happens) and to ``OUT/runs``."""

    def __init__(self, opts: BenchOptions, log: Callable[[str], None]):
        self.opts, self.log = opts, log
        self.summaries: list[dict] = []
        self.skipped: list[Skip] = []
        self.jsonl = None

    def __enter__(self) -> Recorder:
        self.jsonl = _open_jsonl(self.opts)
        return self

    def __exit__(self, *exc) -> None:
        if self.jsonl:
            self.jsonl.close()
            self.jsonl = None

    def record(self, summary: dict) -> None:
        self.summaries.append(summary)
        if self.jsonl:
            self.jsonl.write(json.dumps(_without_requests(summary)) + "\n")
            self.jsonl.flush()
        _save_run(self.opts, summary)
        self.log(_one_line(summary))

    def skip(self, peer: str, mode: str, reason: str, *, failed: bool) -> None:
        self.skipped.append(Skip(peer, mode, reason, failed))
        self.log(f"{'FAILED' if failed else 'skip'} {peer} ({mode}): {reason}")


def start_peer(name: str, mode: str, prep: Prepared, rec: Recorder):
    """The started peer, or ``None``: absent here (skipped), or failed to start."""
    peer = make_peer(name, mode)
    try:
        peer.check(prep.ctx)
    except PeerUnavailable as exc:
        rec.skip(name, peer.mode, str(exc), failed=False)
        return None
    rec.log(f"starting {peer.label} ...")
    t = time.perf_counter()
    try:
        peer.start(prep.ctx)
    except Exception as exc:  # noqa: BLE001 - reported in the tables and the exit code
        peer.stop()
        rec.skip(name, peer.mode, f"failed to start: {_error_text(exc)}", failed=True)
        return None
    rec.log(f"  {peer.label} ready in {time.perf_counter() - t:.1f} s")
    return peer


def run_on(peer, wname: str, prep: Prepared, opts: BenchOptions, rec: Recorder) -> bool:
    """Run workload ``wname`` on a started peer; ``False`` when the peer broke down."""
    conc = concurrency_for(wname, prep.built[wname], opts.concurrency if peer.mode == "serving"
                           else opts.offline_concurrency)
    try:
        summary = run_one(peer, prep.ctx, wname, prep.built[wname], prep.rendered[wname], conc,
                          opts, prep.machine)
    except Exception as exc:  # noqa: BLE001 - reported in the tables and the exit code
        rec.skip(peer.name, peer.mode, f"failed during {wname}: {_error_text(exc)}", failed=True)
        return False
    summary["fit"] = prep.fits[wname].to_dict()
    rec.record(summary)
    return True


def run_offline(plan: list[tuple[str, str]], prep: Prepared, opts: BenchOptions,
                rec: Recorder) -> None:
    """Offline peers are cheap to keep loaded side by side: run them workload by workload
    (A, B, C on one workload, then the next), so a slow spell on the machine hits all of
    them alike."""
    peers = [p for p in (start_peer(n, m, prep, rec) for n, m in plan if m == "offline") if p]
    try:
        for wname in prep.built:
            for peer in list(peers):
                if not run_on(peer, wname, prep, opts, rec):
                    peers.remove(peer)
                    peer.stop()
    finally:
        for peer in peers:
            peer.stop()


def run_serving(plan: list[tuple[str, str]], prep: Prepared, opts: BenchOptions,
                rec: Recorder) -> None:
    """Servers run one after another (each holds its cores while up)."""
    for name, mode in plan:
        if mode != "serving":
            continue
        peer = start_peer(name, mode, prep, rec)
        if peer is None:
            continue
        try:
            for wname in prep.built:
                if not run_on(peer, wname, prep, opts, rec):
                    break
        finally:
            peer.stop()


def run_bench(opts: BenchOptions, log: Callable[[str], None] = print) -> BenchResult:
    prep = prepare(opts, log)
    for name, why in prep.not_run.items():
        log(f"FAILED workload {name}: {why}")
    with Recorder(opts, log) as rec:
        plan = plan_runs(opts.peers, opts.modes, rec.skipped, log)
        if prep.built:
            run_offline(plan, prep, opts, rec)
            run_serving(plan, prep, opts, rec)
    ctx, cfg = prep.ctx, opts.workload_config
    context = {"model": ctx.model, "model_name": opts.model,
               "model_desc": describe_model(opts.model, ctx.model_dir),
               "model_dir": str(ctx.model_dir) if ctx.model_dir else None,
               "model_sha256": weights_digest(ctx.model_dir), "dtype": opts.dtype,
               "threads": opts.threads, "concurrency": opts.concurrency,
               "offline_concurrency": opts.offline_concurrency, "block_size": opts.block_size,
               "max_model_len": ctx.max_model_len, "machine": prep.machine, "api": opts.api,
               "workload_config": dict(vars(cfg)),
               "fit": {w: f.to_dict() for w, f in prep.fits.items()},
               "not_run": prep.not_run,
               "failed": [vars(s) for s in rec.skipped if s.failed]}
    return BenchResult(rec.summaries, rec.skipped, prep.built, prep.rendered, context,
                       prep.not_run)


def plan_runs(peers: list[str], modes: list[str], skipped: list[Skip],
              log) -> list[tuple[str, str]]:
    """``(peer, mode)`` pairs to run: every selected mode the peer supports, modes in
    order (so ``--mode serving`` runs serving peers only; transformers, which has no
    server, runs only when offline is selected). A peer with no mode left is skipped with
    the reason."""
    from prefixcache.bench.peers import PEER_MODES

    plan = [(name, mode) for mode in modes for name in peers if mode in PEER_MODES[name]]
    for name in peers:
        if not any(p == name for p, _ in plan):
            reason = (f"{name}: runs in {'/'.join(PEER_MODES[name])} mode only, not in "
                      f"{'/'.join(modes)} mode")
            skipped.append(Skip(name, "/".join(modes), reason))
            log(f"skip {name}: {reason}")
    return plan


def run_one(peer, ctx: PeerContext, workload: str, reqs, prompts, concurrency: int,
            opts: BenchOptions, machine: str) -> dict:
    bar = None
    if opts.progress:
        from tqdm import tqdm

        bar = tqdm(total=len(reqs), desc=f"{workload} | {peer.label}", unit="req", leave=False)
    salt = f"{workload}-{uuid.uuid4().hex[:12]}"
    load_before = os.getloadavg()[0]
    try:
        run = peer.run(workload, reqs, prompts, concurrency=concurrency, salt=salt,
                       progress=(lambda r: bar.update(1)) if bar else None,
                       time_scale=opts.time_scale)
    finally:
        if bar:
            bar.close()
    info = RunInfo(workload=workload, model=ctx.model, peer=peer.name, mode=peer.mode,
                   dtype=ctx.dtype, threads=ctx.threads,
                   concurrency=run.concurrency or concurrency, machine=machine,
                   block_size=ctx.block_size, max_model_len=ctx.max_model_len,
                   peer_detail=peer.detail())
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


def _error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, PeerUnavailable) else f"{type(exc).__name__}: {exc}"


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
    return (f"  {s['workload']:<13} {s['peer'] + ' (' + s['mode'] + ')':<32} "
            f"reqs={s['requests']} err={s['errors']} "
            f"hit={hr} ttft p50={_fmt(s['ttft_p50_s'])}s p99={_fmt(s['ttft_p99_s'])}s "
            f"req/s={_fmt(s['requests_per_s'], '.2f')} out tok/s={_fmt(s['output_tok_s'], '.1f')}"
            + (f" cross-tenant={s['cross_tenant_hits']}" if "cross_tenant_hits" in s else ""))


def load_runs(out_dir: Path) -> list[dict]:
    """Every per-run JSON under ``out_dir/runs`` (to re-make reports without rerunning)."""
    return [json.loads(p.read_text()) for p in sorted((out_dir / "runs").glob("*__*__*.json"))]

