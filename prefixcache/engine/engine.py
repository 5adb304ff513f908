"""The engine loop: schedule -> runner.run -> commit -> outputs.

``LLMEngine`` is synchronous and single-threaded: ``add_request`` / ``abort_request``
queue work, each ``step()`` runs one model step and returns the outputs of requests that
produced a token or finished. The server drives it from a background thread; the
offline ``LLM`` drives it in a loop.

Publication rule: pages are committed (published) only after
:meth:`ModelRunner.run` returned, which is after the step's device work finished
(an explicit synchronisation ends every step, see ``engine/model_runner.py``). A failing
step publishes nothing, withdraws its in-flight registrations and finishes the step's
requests with ``finish_reason="error"``; the engine keeps serving.
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable

import torch

from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.pins import PinCapError, check_pin_ttl
from prefixcache.cache.tiers.redis_store import RedisTier
from prefixcache.config import EngineConfig
from prefixcache.engine.kv_events import KVEventPublisher
from prefixcache.engine.kv_store import SharedKVStore
from prefixcache.engine.kv_tiers import KVTiers, model_fingerprint
from prefixcache.engine.model_runner import ModelRunner, StepResult
from prefixcache.engine.output_processor import OutputProcessor
from prefixcache.engine.request import Request, RequestStatus
from prefixcache.engine.scheduler import ScheduledSeq, Scheduler
from prefixcache.model.loader import LoadedModel, load_model
from prefixcache.outputs import RequestOutput
from prefixcache.sampling_params import ParamError, SamplingParams, check_namespace

log = logging.getLogger(__name__)
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")


class QueueFullError(RuntimeError):
    """The waiting queue is at ``max_waiting_requests``; retry later."""


class LLMEngine:
    """Continuous-batching engine over a paged KV pool with prefix caching.

    Args:
        config: engine configuration.
        loaded: an already loaded model (tests); default loads ``config.model``.
        clock: time source in seconds (tests inject a fake clock).

    Raises:
        ValueError / FileNotFoundError: from model loading or configuration.
    """

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.config = config
        self.clock = clock
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = torch.device(config.device)
        self.loaded = loaded or load_model(config.model, device=config.device,
                                           dtype=config.torch_dtype,
                                           quantization=config.quantization,
                                           compute_backend=config.compute_backend)
        self.model = self.loaded.model
        self.model_config = self.loaded.config
        self.tokenizer = self.loaded.tokenizer
        mc = self.model_config
        bs = config.block_size
        # one key everywhere: weights, KV dtype, block size and KV layout in every root
        self.fingerprint = model_fingerprint(self.loaded.cache_id, config.torch_dtype, bs)
        self.runner = ModelRunner(self.model, mc, config)
        num_pages = self.runner.num_pages
        limit = mc.check_max_model_len(config.max_model_len, config.allow_long_context)
        self.max_model_len = min(limit, num_pages * bs)
        # what limits the context, named in error messages
        self._context_limit = (
            f"the KV pool allows {self.max_model_len} tokens ({num_pages} pages of {bs} tokens; "
            "raise num_pages or kv_cache_bytes)" if num_pages * bs < limit
            else f"the maximum context length (max_model_len) is {self.max_model_len} tokens")
        self.cache = KVCacheManager(num_pages, bs,
                                    enable_prefix_caching=config.enable_prefix_caching,
                                    model_id=self.fingerprint,
                                    root_seed=config.hash_root_seed,
                                    shuffle_seed=config.shuffle_seed,
                                    max_pinned_fraction=config.max_pinned_fraction,
                                    tenant_quota_fraction=config.tenant_quota_fraction,
                                    tenant_quotas=config.tenant_quotas)
        self.scheduler = Scheduler(config, self.cache, clock)
        self.tiers: KVTiers | None = None
        self.shared: SharedKVStore | None = None
        if config.enable_prefix_caching and (config.host_cache_bytes or config.disk_cache_dir
                                             or config.kv_store_url):
            self.tiers = KVTiers(config, self.cache, self.runner.kv, self.fingerprint)
            self.scheduler.extend_hit = self.tiers.extend_hit
            if config.kv_store_url:
                remote = RedisTier(config.kv_store_url, self.tiers.fingerprint,
                                   ttl_s=config.kv_store_ttl_s,
                                   timeout_s=config.kv_store_timeout_s,
                                   layout=self.tiers.layout)
                self.tiers.add_remote(remote)
                self.shared = SharedKVStore(config, self.cache, self.runner.kv, remote,
                                            self.tiers.estimates)
                self.scheduler.remote_wait = self.shared.should_wait
        self.outputs = OutputProcessor(self.tokenizer, self.max_model_len, set(mc.eos_token_ids))
        self.requests: dict[str, Request] = {}
        self.counters = {"prefill_tokens_computed": 0, "decode_tokens_computed": 0,
                         "steps": 0, "failed_steps": 0, "requests_finished": 0,
                         "requests_aborted": 0}
        self._pending_outputs: list[RequestOutput] = []
        self.kv_events: KVEventPublisher | None = None
        if config.kv_events_endpoint or self.shared is not None:
            self._event_log = self.cache.record_events()
        if config.kv_events_endpoint:
            self.kv_events = KVEventPublisher(
                config.kv_events_endpoint, config.kv_events_replay_endpoint,
                model=self.loaded.model_id, medium="GPU" if self.device.type == "cuda" else "CPU")

    # -- requests ------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise :class:`ParamError` naming the bad parameter."""
        if not prompt_token_ids:
            raise ParamError("prompt", "the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or t < 0 or t >= vocab]
        if bad:
            raise ParamError("prompt", f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
        bad = [t for t in params.stop_token_ids or () if t >= vocab]
        if bad:
            raise ParamError("stop_token_ids", f"token id {bad[0]} is outside the vocabulary")
        n = len(prompt_token_ids)
        if n >= self.max_model_len:
            raise ParamError("prompt", f"the prompt has {n} tokens; {self._context_limit}, "
                             "leaving no room for output")
        if params.max_tokens is not None and n + params.max_tokens > self.max_model_len:
            raise ParamError("max_tokens", f"max_tokens={params.max_tokens} plus the prompt's "
                             f"{n} tokens is too long: {self._context_limit}")
        if n + params.min_tokens > self.max_model_len:
            raise ParamError("min_tokens", f"min_tokens={params.min_tokens} plus the prompt's "
                             f"{n} tokens can never be generated: {self._context_limit}")

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams | None = None, *, prompt: str | None = None,
                    tenant: str | None = None, cache_salt: str | None = None,
                    extra_keys: tuple = (), arrival_time: float | None = None,
                    pin_ttl_s: float | None = None) -> Request:
        """Queue a request.

        ``pin_ttl_s`` (seconds): once its prefill completes, pin its full prompt pages for
        that long (``cache/pins.py``; ``output.extra["pin"]`` tells the result). With
        ``params.max_tokens == 0`` the request prefills and finishes (``"length"``)
        without generating.

        Raises:
            ParamError: invalid prompt or parameters (names the parameter).
            ValueError: ``request_id`` is already in use.
            QueueFullError: the waiting queue is full.
        """
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        self.validate(prompt_token_ids, params)
        check_namespace(tenant=tenant, cache_salt=cache_salt)
        if pin_ttl_s is not None:
            try:
                pin_ttl_s = check_pin_ttl(pin_ttl_s)
            except ValueError as exc:
                raise ParamError("pin_ttl_s", str(exc)) from None
        limit = self.config.max_waiting_requests
        if limit is not None and len(self.scheduler.waiting) >= limit:
            raise QueueFullError(f"{len(self.scheduler.waiting)} requests are waiting")
        req = Request(request_id=request_id, prompt_token_ids=list(prompt_token_ids),
                      sampling_params=params, prompt=prompt, tenant=tenant,
                      cache_salt=cache_salt, extra_keys=tuple(extra_keys), pin_ttl_s=pin_ttl_s,
                      arrival_time=self.clock() if arrival_time is None else arrival_time)
        if params.seed is not None:
            req.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        self.outputs.start(req)
        self.requests[request_id] = req
        self.scheduler.add(req)
        return req

    def abort_request(self, request_id: str) -> bool:
        """Abort a request; its pages return to the pool. ``False`` if unknown/finished."""
        req = self.requests.get(request_id)
        if req is None or req.finished:
            return False
        self._finish(req, "abort")
        self.counters["requests_aborted"] += 1
        self._pending_outputs.append(self.outputs.make_output(req))
        return True

    def warmup(self) -> int:
        """Run one full-size step outside the scheduler (no request, no counter, no cache
        entry: :meth:`ModelRunner.warmup` over free pages, which stay free), so that the
        calling thread's memory and the kernels are set up before the first request. Its
        size: ``max_num_batched_tokens`` tokens, at most the pool's and the context's
        limit. Returns the tokens run.

        Raises:
            RuntimeError: a request was already added, or a page is not free.
        """
        bs = self.config.block_size
        free = self.cache.pool.free_pages()
        if self.requests or len(free) != self.runner.num_pages:
            raise RuntimeError("warmup() runs before the first request, on a pool whose "
                               "pages are all free")
        n = min(self.config.max_num_batched_tokens, self.max_model_len - 1,
                self.runner.num_pages * bs - 1)
        if n < 1:
            return 0
        self.runner.warmup(n, sorted(free))
        return n

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def _finish(self, req: Request, reason: str, error: str | None = None) -> None:
        req.finish_reason = reason
        req.error = error
        req.status = RequestStatus.FINISHED
        req.metrics.finished_time = self.clock()
        req.freeze_cached()
        self.scheduler.remove(req)
        self.requests.pop(req.request_id, None)
        if self.shared is not None:
            self.shared.forget(req.request_id)

    # -- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one model step. Returns outputs of requests that produced a token,
        finished, or were aborted since the last step."""
        outputs, self._pending_outputs = self._pending_outputs, []
        plan = self.scheduler.schedule()
        if not plan.scheduled:
            self._send_events()
            if self.shared is not None and self.shared.waiting and not outputs:
                time.sleep(0.002)  # only followers of another replica: do not spin
            return outputs
        self.counters["steps"] += 1
        t0 = time.perf_counter()
        try:
            result = self.runner.run(plan.scheduled)
        except Exception as exc:  # the engine keeps serving; the step's requests fail
            log.exception("model step failed")
            self._send_events()
            return outputs + self._fail(plan.scheduled, exc)
        if self.tiers is not None and any(s.request.in_prefill for s in plan.scheduled):
            self.tiers.estimates.observe_prefill(time.perf_counter() - t0,
                                                 sum(s.num_tokens for s in plan.scheduled))
        self._publish(plan.scheduled, result)
        self._send_events()
        return outputs + self._emit(result)

    def _send_events(self) -> None:
        """Hand the step's index changes to the KV event publisher and the shared tier's
        store queue (both asynchronous)."""
        if self.kv_events is None and self.shared is None:
            return
        events = self._event_log.drain()
        if self.kv_events is not None:
            self.kv_events.publish(events)
        if self.shared is not None and events:
            self.shared.publish(events)

    def _fail(self, scheduled: list[ScheduledSeq], exc: Exception) -> list[RequestOutput]:
        """Publish nothing, withdraw the step's in-flight pages, finish its requests."""
        self.counters["failed_steps"] += 1
        for s in scheduled:
            self.cache.fail_step(s.request.table)
        for s in scheduled:
            self._finish(s.request, "error", f"{type(exc).__name__}: {exc}")
        return [self.outputs.make_output(s.request) for s in scheduled]

    def _publish(self, scheduled: list[ScheduledSeq], result: StepResult) -> None:
        """The step completed on the device: commit its KV (publishing full pages)."""
        for req, start, lps in result.prompt_logprobs:
            self.outputs.append_prompt_logprobs(req, start, lps)
        for s in scheduled:
            kind = "prefill" if s.request.in_prefill else "decode"
            self.counters[f"{kind}_tokens_computed"] += s.num_tokens
            self.cache.commit(s.request.table, s.num_tokens)

    def _emit(self, result: StepResult) -> list[RequestOutput]:
        """Append the sampled tokens, apply stop conditions, build the outputs."""
        outputs = []
        now = self.clock()
        for s, tok, lp in result.sampled:
            req = s.request
            if not req.prefill_done:
                req.prefill_done = True
                req.freeze_cached()
                self.cache.record_query(req.num_prompt_tokens, req.num_cached_tokens,
                                        req.num_inflight_hit_tokens)
                if req.pin_ttl_s is not None:
                    self._pin(req)
            if req.sampling_params.max_tokens == 0:  # prefill only: drop the token
                reason: str | None = "length"
            else:
                reason = self.outputs.append_token(req, tok, lp, now)
            if reason is not None:
                self._finish(req, reason)
                self.counters["requests_finished"] += 1
            outputs.append(self.outputs.make_output(req))
        return outputs

    def _pin(self, req: Request) -> None:
        """Pin the request's full prompt pages (its prefill just completed). A pin the
        cap refuses leaves the request unpinned (``req.pin_error``), never failed."""
        n = req.num_prompt_tokens // self.cache.block_size
        try:
            req.pin = self.cache.pin(req.table, n, req.pin_ttl_s)  # type: ignore[arg-type]
        except (PinCapError, ValueError) as exc:
            req.pin_error = str(exc)

    # -- introspection -------------------------------------------------------------------
    def stats(self) -> dict[str, int | float]:
        """Cache counters and gauges, engine counters, queue lengths."""
        d = self.cache.stats()
        d.update(self.counters)
        d.update(requests_running=len(self.scheduler.running),
                 requests_waiting=len(self.scheduler.waiting),
                 num_preemptions=self.scheduler.num_preemptions)
        if self.tiers is not None:
            d.update(self.tiers.stats())
        if self.shared is not None:
            d.update(self.shared.stats())
        return d

    def tenant_pages(self, tenants: Iterable[str] = ()
                     ) -> dict[str | None, dict[str, int | None]]:
        """Per tenant (those holding pages, with a quota of their own, or named in
        ``tenants``): ``pages`` held (live or cached) and ``quota_pages`` (``None``
        without a quota)."""
        usage, quotas = self.cache.pool.usage, self.cache.quotas
        names = set(usage) | set(quotas.fractions) | set(tenants)
        return {t: {"pages": usage[t], "quota_pages": quotas.limit(t)}  # type: ignore[misc]
                for t in names}

    def list_pins(self, tenant: str | None = None) -> list[dict]:
        """The tenant's live pins, oldest first: ``prefix_hash`` (hex), ``tokens``,
        ``tier`` (``"pool"``, or ``"host"``/``"disk"``: the lowest KV tier holding a
        page demoted from the pool), ``expires_at`` (Unix seconds), ``ttl_s``. Never
        another tenant's. A pin with a demoted page no tier holds any more lapses here."""
        check_namespace(tenant=tenant)
        out = []
        for pin in self.cache.pins.list(tenant):
            demoted = pin.demoted()
            tier = "pool" if not demoted else (
                None if self.tiers is None else self.tiers.tier_of(demoted))
            if tier is None:
                self.cache.pins.drop(pin)
                continue
            out.append(pin.as_dict(tier))
        return out

    def unpin(self, prefix_hash: str, tenant: str | None = None) -> bool:
        """Remove the tenant's pin named by ``prefix_hash`` (hex). ``False`` when the
        tenant has no such pin (another tenant's pin is never touched).

        Raises:
            ParamError: ``prefix_hash`` is not a hex string.
        """
        check_namespace(tenant=tenant)
        if not (isinstance(prefix_hash, str) and _HEX.fullmatch(prefix_hash)):
            raise ParamError("prefix_hash", f"must be a non-empty hex string (an even "
                             f"number of 0-9a-f digits), got {str(prefix_hash)[:64]!r}")
        key = bytes.fromhex(prefix_hash)
        return self.cache.pins.unpin(tenant, key)
    def close(self) -> None:
        """Finish the queued KV tier stores and stop their worker, and close the KV
        event sockets (idempotent). The engine keeps serving from the pool alone
        afterwards."""
        if self.shared is not None:
            self.shared.close()  # before the tiers close their clients
        if self.tiers is not None and not self.tiers.closed:
            self.scheduler.extend_hit = None
            self.cache.set_evict_hook(None)
            self.tiers.close()  # its counters stay readable in stats()
        if self.kv_events is not None:
            self.kv_events.close()
            self.kv_events = None

    def reset_prefix_cache(self):
        """Drop unreferenced cached pages; running requests are unaffected."""
        report = self.cache.reset()
        self._send_events()
        return report
