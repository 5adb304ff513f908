"""Our engine in-process (the offline Python API), prefix caching on or off.

Each workload gets a fresh ``LLM`` (an empty cache). Requests are fed to
``llm.engine`` through ``add_request`` / ``step`` following the session scheduler, so
offline runs see the same arrival pattern as serving runs; TTFT is measured from
``add_request`` to the step that returns the first token.
"""
from __future__ import annotations

import gc
import time

from prefixcache.bench.metrics import PeakRSS, RequestResult
from prefixcache.bench.peers.base import Peer, PeerContext, PeerRun, PeerUnavailable, Progress
from prefixcache.bench.prompts import Prompt
from prefixcache.bench.schedule import SessionScheduler
from prefixcache.bench.workloads import BenchRequest


class OursOffline(Peer):
    modes = ("offline",)

    def __init__(self, mode: str = "offline", *, prefix_caching: bool = True):
        super().__init__(mode)
        self.prefix_caching = prefix_caching
        self.name = "prefixcache" if prefix_caching else "prefixcache-nocache"
        self.description = ("our engine, offline API, prefix caching "
                            f"{'on' if prefix_caching else 'off'}")
        self.ctx: PeerContext | None = None

    def check(self, ctx: PeerContext) -> None:
        try:
            from prefixcache.engine.llm import LLM  # noqa: F401
        except ImportError as exc:
            raise PeerUnavailable(f"{self.name}: the engine is not importable ({exc})") from None

    def start(self, ctx: PeerContext) -> None:
        self.ctx = ctx

    def make_llm(self):
        from prefixcache.engine.llm import LLM

        ctx = self.ctx
        return LLM(model=ctx.model, block_size=ctx.block_size,
                   enable_prefix_caching=self.prefix_caching, dtype=ctx.dtype, device="cpu",
                   num_threads=ctx.threads, max_model_len=ctx.max_model_len,
                   kv_cache_bytes=int(ctx.kv_cache_gib * 2**30))

    def run(self, workload: str, reqs: list[BenchRequest], prompts: dict[str, Prompt], *,
            concurrency: int, salt: str, progress: Progress | None = None,
            time_scale: float = 1.0) -> PeerRun:
        llm = self.make_llm()
        try:
            mem = PeakRSS()
            mem.start()
            before = dict(getattr(llm.engine, "counters", {}))
            results, wall = drive_engine(llm.engine, reqs, prompts, concurrency=concurrency,
                                         time_scale=time_scale, on_done=progress,
                                         on_tick=mem.sample)
            after = getattr(llm.engine, "counters", {})
            computed = (after["prefill_tokens_computed"] - before.get("prefill_tokens_computed", 0)
                        if "prefill_tokens_computed" in after else None)
            stats = llm.stats() if hasattr(llm, "stats") else {}
            numeric = {k: v for k, v in stats.items() if isinstance(v, (int, float))}
            return PeerRun(results, wall, peak_rss=mem.stop(), prefill_tokens_computed=computed,
                           cache_stats=numeric)
        finally:
            del llm
            gc.collect()

    def detail(self) -> dict:
        import torch

        return {"engine": "prefixcache", "prefix_caching": self.prefix_caching,
                "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


def drive_engine(engine, reqs: list[BenchRequest], prompts: dict[str, Prompt], *,
                 concurrency: int, time_scale: float = 1.0, on_done=None,
                 on_tick=None) -> tuple[list[RequestResult], float]:
    """Feed ``reqs`` to an ``LLMEngine`` step by step; returns (results, wall seconds)."""
    from prefixcache.sampling_params import SamplingParams

    sched = SessionScheduler(reqs, concurrency, time_scale=time_scale)
    by_id: dict[str, BenchRequest] = {}
    send: dict[str, float] = {}
    first: dict[str, float] = {}
    results: list[RequestResult] = []
    t0 = time.perf_counter()
    last_tick = 0.0
    unfinished = getattr(engine, "has_unfinished_requests", None) or engine.has_unfinished
    while not sched.done:
        now = time.perf_counter() - t0
        while (r := sched.next_ready(now)) is not None:
            params = SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True)
            by_id[r.id] = r
            send[r.id] = time.perf_counter() - t0
            try:
                engine.add_request(r.id, prompts[r.id].token_ids, params, tenant=r.tenant)
            except Exception as exc:  # a rejected request is a result too
                results.append(_result(r, prompts[r.id], send[r.id], None, None, 0, None,
                                       f"{type(exc).__name__}: {exc}"))
                sched.finish(r)
                if on_done:
                    on_done(results[-1])
        if not unfinished():
            nxt = sched.next_arrival()
            if nxt is not None:
                time.sleep(max(0.0, min(0.5, nxt - (time.perf_counter() - t0))))
            continue
        outs = engine.step()
        now = time.perf_counter() - t0
        if on_tick and now - last_tick > 0.5:
            on_tick()
            last_tick = now
        for out in outs:
            r = by_id.get(out.request_id)
            if r is None:
                continue
            toks = out.outputs[0].token_ids if out.outputs else []
            if toks and out.request_id not in first:
                first[out.request_id] = now
            if out.finished:
                ok = out.outputs and out.outputs[0].finish_reason not in ("error", "abort")
                err = out.error or (None if ok else "finished without output")
                results.append(_result(r, prompts[r.id], send[r.id], first.get(r.id), now,
                                       len(toks), out.num_cached_tokens, err,
                                       prompt_len=len(out.prompt_token_ids)))
                sched.finish(r)
                if on_done:
                    on_done(results[-1])
    return results, time.perf_counter() - t0


def _result(r: BenchRequest, prompt: Prompt, send: float, first: float | None,
            end: float | None, n_out: int, cached: int | None, error: str | None,
            prompt_len: int | None = None) -> RequestResult:
    ref = r.reference or {}
    return RequestResult(id=r.id, session=r.session, turn=r.turn, group=r.group, tenant=r.tenant,
                         warm_expected=r.warm_expected,
                         prompt_tokens=prompt_len or len(prompt.token_ids),
                         cached_tokens=cached, output_tokens=n_out, send_time=send,
                         first_token_time=first,
                         end_time=end, reference_prompt_tokens=ref.get("prompt_tokens"),
                         reference_cached_tokens=ref.get("cached_tokens"), error=error)
