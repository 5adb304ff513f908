"""Hugging Face transformers ``generate``: one request at a time, no cache across requests.

transformers has no server and no batching across requests, so this peer runs in
process as a serial server behind a client at the run's concurrency: the client
"sends" requests following the session scheduler, they queue, and ``generate`` serves
them one at a time in arrival order. TTFT runs from the send to the streamer receiving
the first new token, so it includes the queueing a serial server imposes (a cold burst
of N waits for N prefills). Output length is fixed like the other peers'
(``min_new_tokens = max_new_tokens``, greedy).
"""
from __future__ import annotations

import gc
import time
from collections import deque
from typing import Any

from prefixcache.bench.metrics import PeakRSS, RequestResult
from prefixcache.bench.peers.base import Peer, PeerContext, PeerRun, PeerUnavailable, Progress
from prefixcache.bench.prompts import Prompt
from prefixcache.bench.schedule import SessionScheduler
from prefixcache.bench.workloads import BenchRequest


class _TimingStreamer:
    """A ``generate`` streamer that timestamps the first generated token."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:  # call 1 is the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


class TransformersPeer(Peer):
    name = "transformers"
    modes = ("offline",)
    description = "Hugging Face transformers generate, serial, no cache across requests"

    def __init__(self, mode: str = "offline"):
        super().__init__(mode)
        self.model: Any = None  # a transformers causal LM once started (imported lazily)
        self.ctx: PeerContext | None = None

    @property
    def label(self) -> str:
        return f"{self.name} (offline, serial)"

    def check(self, ctx: PeerContext) -> None:
        if ctx.model_dir is None:
            raise PeerUnavailable("transformers: needs a Hugging Face model directory, "
                                  f"not {ctx.model!r}")

    def start(self, ctx: PeerContext) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.ctx = ctx
        torch.set_num_threads(ctx.threads)
        self.model = AutoModelForCausalLM.from_pretrained(str(ctx.model_dir),
                                                          dtype=getattr(torch, ctx.dtype))
        self.model.eval()

    def run(self, workload: str, reqs: list[BenchRequest], prompts: dict[str, Prompt], *,
            concurrency: int, salt: str, progress: Progress | None = None,
            time_scale: float = 1.0) -> PeerRun:
        import torch

        ctx = self.ctx
        assert ctx is not None and self.model is not None, "TransformersPeer.start() first"
        torch.set_num_threads(ctx.threads)
        sched = SessionScheduler(reqs, concurrency, time_scale=time_scale)
        queue: deque = deque()
        mem = PeakRSS()
        mem.start()
        results = []
        t0 = time.perf_counter()
        while not sched.done:
            now = time.perf_counter() - t0
            while (r := sched.next_ready(now)) is not None:
                queue.append((r, now))
            if not queue:
                nxt = sched.next_arrival() or 0.0
                time.sleep(max(0.0, min(0.5, nxt - (time.perf_counter() - t0))))
                continue
            r, send = queue.popleft()
            ids = prompts[r.id].token_ids
            streamer = _TimingStreamer()
            err, n_out = None, 0
            try:
                with torch.inference_mode():
                    out = self.model.generate(torch.tensor([ids]), max_new_tokens=r.max_tokens,
                                              min_new_tokens=r.max_tokens, do_sample=False,
                                              streamer=streamer, pad_token_id=ctx.eos_token_id)
                n_out = out.shape[1] - len(ids)
            except Exception as exc:  # noqa: BLE001 - record and go on
                err = f"{type(exc).__name__}: {exc}"
            end = time.perf_counter() - t0
            ref = r.reference or {}
            first = None if streamer.first is None else streamer.first - t0
            res = RequestResult(id=r.id, session=r.session, turn=r.turn, group=r.group,
                                tenant=r.tenant, warm_expected=r.warm_expected,
                                prompt_tokens=len(ids), cached_tokens=None,
                                output_tokens=n_out, send_time=send, first_token_time=first,
                                end_time=end, reference_prompt_tokens=ref.get("prompt_tokens"),
                                reference_cached_tokens=ref.get("cached_tokens"), error=err)
            results.append(res)
            sched.finish(r)
            mem.sample()
            if progress:
                progress(res)
        wall = time.perf_counter() - t0
        computed = sum(r.prompt_tokens for r in results if r.error is None)
        return PeerRun(results, wall, peak_rss=mem.stop(), prefill_tokens_computed=computed)

    def stop(self) -> None:
        self.model = None
        gc.collect()

    def detail(self) -> dict:
        import torch
        import transformers

        return {"transformers": transformers.__version__, "torch": torch.__version__,
                "torch_threads": torch.get_num_threads(),
                "serving": "serial, in process (no server)"}
