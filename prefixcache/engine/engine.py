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
import threading
import time
from collections.abc import Callable, Iterable

import torch

from prefixcache.cache.identity import model_fingerprint
from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.pins import PinCapError, check_pin_ttl
from prefixcache.cache.sessions import SessionRegistry, check_session_id
from prefixcache.config import EngineConfig
from prefixcache.engine.kv_connector import TieredConnector, build_connector
from prefixcache.engine.kv_events import KVEventPublisher
from prefixcache.engine.kv_store import SharedKVStore
from prefixcache.engine.kv_tiers import KVTiers
from prefixcache.engine.miss_diagnostics import DiagnosticsRequest, MissDiagnostics
from prefixcache.engine.model_runner import ModelRunner, StepResult
from prefixcache.engine.output_processor import OutputProcessor
from prefixcache.engine.request import Request, RequestStatus
from prefixcache.engine.sample_group import SampleGroup, member_id, member_params
from prefixcache.engine.scheduler import ScheduledSeq, Scheduler
from prefixcache.model.grammar import GrammarEngine
from prefixcache.model.loader import LoadedModel, load_model
from prefixcache.outputs import RequestOutput
from prefixcache.progress import phase
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
                                           dtype=config.torch_dtype, revision=config.revision,
                                           quantization=config.quantization,
                                           compute_backend=config.compute_backend)
        self.model = self.loaded.model
        self.model_config = self.loaded.config
        self.tokenizer = self.loaded.tokenizer
        mc = self.model_config
        bs = config.block_size
        # one key everywhere: weights, KV dtype, block size and KV layout in every root
        self.fingerprint = model_fingerprint(self.loaded.cache_id, config.kv_dtype, bs)
        with phase("KV pool") as note:
            self.runner = ModelRunner(self.model, mc, config)
            num_pages = self.runner.num_pages
            kv_bytes = sum(t.nbytes for t in self.runner.kv.k + self.runner.kv.v)
            note["detail"] = f"{num_pages} pages of {bs} tokens, {kv_bytes / 2**20:.1f} MiB"
        limit = mc.check_max_model_len(config.max_model_len, config.allow_long_context)
        self.max_model_len = min(limit, num_pages * bs)
        # what limits the context, named in error messages
        self._context_limit = (
            f"the KV pool allows {self.max_model_len} tokens ({num_pages} pages of {bs} tokens; "
            "raise num_pages or kv_cache_bytes)" if num_pages * bs < limit
            else f"the maximum context length (max_model_len) is {self.max_model_len} tokens")
        # the tiers and the shared store, or nothing: built once, given to the manager
        self.connector = build_connector(config, self.runner.kv, self.fingerprint)
        self.cache = KVCacheManager(num_pages, bs,
                                    enable_prefix_caching=config.enable_prefix_caching,
                                    model_id=self.fingerprint,
                                    root_seed=config.hash_root_seed,
                                    shuffle_seed=config.shuffle_seed,
                                    max_pinned_fraction=config.max_pinned_fraction,
                                    tenant_quota_fraction=config.tenant_quota_fraction,
                                    tenant_quotas=config.tenant_quotas,
                                    connector=self.connector)
        self.sessions = SessionRegistry(self.cache, config.session_ttl_s)
        self.scheduler = Scheduler(config, self.cache, clock)
        self.diagnostics = MissDiagnostics(self.cache, self.tokenizer, self.fingerprint)
        tiers = self.tiers
        if tiers is not None and tiers.local and not tiers.write_through:  # evictions reach them
            self.diagnostics.tier_names = tuple(t.name for t in tiers.local)
            self.diagnostics.tier_holds = tiers.holds
        self.outputs = OutputProcessor(self.tokenizer, self.max_model_len, set(mc.eos_token_ids))
        self.requests: dict[str, Request] = {}
        self.groups: dict[str, SampleGroup] = {}  # live n > 1 requests, by request id
        self._grammar: GrammarEngine | None = None  # built on the first structured request
        self._grammar_lock = threading.Lock()
        self.counters = {"prefill_tokens_computed": 0, "decode_tokens_computed": 0,
                         "steps": 0, "failed_steps": 0, "requests_finished": 0,
                         "requests_aborted": 0}
        self._pending_outputs: list[RequestOutput] = []
        self.kv_events: KVEventPublisher | None = None
        if config.kv_events_endpoint or self.connector.records_events:
            self._event_log = self.cache.record_events()
        if config.kv_events_endpoint:
            self.kv_events = KVEventPublisher(
                config.kv_events_endpoint, config.kv_events_replay_endpoint,
                model=self.loaded.model_id, medium="GPU" if self.device.type == "cuda" else "CPU")

    # -- requests ------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise :class:`ParamError` naming the bad parameter. Safe from any thread; with
        ``params.structured_outputs`` it compiles the grammar into the cache (a miss can
        take a while: the server calls it off its event loop)."""
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
        if params.structured_outputs is not None:
            # the grammar decides where the output ends: EOS only once it is complete
            if params.ignore_eos:
                raise ParamError("ignore_eos", "cannot be combined with structured outputs "
                                 "(the output ends where the grammar is complete)")
            if params.min_tokens:
                raise ParamError("min_tokens", "cannot be combined with structured outputs "
                                 "(the output ends where the grammar is complete)")
            self.grammar.compile(params.structured_outputs)  # cached: add_request reuses it

    @property
    def grammar(self) -> GrammarEngine:
        """The structured-output grammar engine (built on first use: it reads the whole
        vocabulary).

        Raises:
            ParamError: the model has no tokenizer, or one without token bytes
                (``param`` is ``structured_outputs``).
        """
        with self._grammar_lock:
            return self._grammar_engine()

    def _grammar_engine(self) -> GrammarEngine:
        if self._grammar is None:
            if self.tokenizer is None:
                raise ParamError("structured_outputs", "the model has no tokenizer")
            try:
                self._grammar = GrammarEngine(self.tokenizer, self.model_config.vocab_size,
                                              self.outputs.eos_token_ids,
                                              max_threads=max(1, torch.get_num_threads()))
            except ValueError as exc:
                raise ParamError("structured_outputs", str(exc)) from None
        return self._grammar

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams | None = None, *, prompt: str | None = None,
                    tenant: str | None = None, cache_salt: str | None = None,
                    extra_keys: tuple = (), arrival_time: float | None = None,
                    pin_ttl_s: float | None = None,
                    diagnostics: DiagnosticsRequest | None = None,
                    session_id: str | None = None) -> Request:
        """Queue a request.

        ``session_id``: the tenant's agent session this call belongs to: once it
        finishes, its transcript (prompt and output pages) is kept ahead of LRU for
        ``config.session_ttl_s`` (``cache/sessions.py``; :meth:`close_session`).

        ``diagnostics``: say why the request did not hit (``output.extra
        ["cache_diagnostics"]``, once its prefill completed; ``engine/miss_diagnostics.py``).

        ``pin_ttl_s`` (seconds): once its prefill completes, pin its full prompt pages for
        that long (``cache/pins.py``; ``output.extra["pin"]`` tells the result). With
        ``params.max_tokens == 0`` the request prefills and finishes (``"length"``)
        without generating. With ``params.n > 1`` or ``best_of`` its samples share one
        prefill (``engine/sample_group.py``); each output then holds one
        ``CompletionOutput`` per returned sample, ``index`` 0 to ``n - 1``.

        Raises:
            ParamError: invalid prompt or parameters (names the parameter).
            ValueError: ``request_id`` is already in use.
            QueueFullError: the waiting queue is full.
        """
        params = params or SamplingParams()
        ids = [member_id(request_id, i) for i in range(params.num_samples)]
        if request_id in self.groups or any(rid in self.requests for rid in ids):
            raise ValueError(f"request_id {request_id!r} is already in use")
        self.validate(prompt_token_ids, params)
        check_namespace(tenant=tenant, cache_salt=cache_salt)
        if pin_ttl_s is not None:
            try:
                pin_ttl_s = check_pin_ttl(pin_ttl_s)
            except ValueError as exc:
                raise ParamError("pin_ttl_s", str(exc)) from None
        _check_session_id(session_id)
        if diagnostics is not None and not isinstance(diagnostics, DiagnosticsRequest):
            raise ParamError("diagnostics", "must be a DiagnosticsRequest or None")
        limit = self.config.max_waiting_requests
        if limit is not None and len(self.scheduler.waiting) >= limit:
            raise QueueFullError(f"{len(self.scheduler.waiting)} requests are waiting")
        arrival = self.clock() if arrival_time is None else arrival_time
        members: list[Request] = []
        for i, rid in enumerate(ids):
            sp = params if len(ids) == 1 else member_params(params, i)
            req = Request(request_id=rid, prompt_token_ids=list(prompt_token_ids),
                          sampling_params=sp, prompt=prompt, tenant=tenant,
                          cache_salt=cache_salt, extra_keys=tuple(extra_keys),
                          pin_ttl_s=pin_ttl_s if i == 0 else None, arrival_time=arrival,
                          diagnostics=diagnostics if i == 0 else None, index=i,
                          session_id=session_id if i == 0 else None)
            if sp.seed is not None:
                req.generator = torch.Generator(device=self.device).manual_seed(sp.seed)
            if sp.structured_outputs is not None:  # each sample runs its own matcher
                req.grammar = (self.grammar.matcher(sp.structured_outputs) if i == 0
                               else members[0].grammar.fork())
            self.outputs.start(req)
            self.requests[rid] = req
            members.append(req)
        if len(members) > 1:
            group = SampleGroup(request_id, params, members)
            for req in members:
                req.group = group
            self.groups[request_id] = group
        self.scheduler.add(members[0])  # the others are forked from it after its prefill
        if session_id is not None:
            self.sessions.enter(tenant, session_id)
        return members[0]

    def abort_request(self, request_id: str) -> bool:
        """Abort a request; its pages return to the pool. ``False`` if unknown/finished."""
        group = self.groups.get(request_id)
        if group is not None:  # every sample of the request
            for member in group.members:
                if not member.finished:
                    self._finish(member, "abort")
            self.counters["requests_aborted"] += 1
            self._pending_outputs.extend(self._group_outputs([group]))
            return True
        req = self.requests.get(request_id)
        if req is None or req.finished or req.group is not None:
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
        if req.diagnostics is not None and reason in ("stop", "length"):
            self.diagnostics.remember(req)
        if req.session_id is not None:  # before the table is freed
            if reason in ("stop", "length") and req.page_table is not None:
                self.sessions.keep(req.tenant, req.session_id, req.page_table)
            else:
                self.sessions.leave(req.tenant, req.session_id)
        self.scheduler.remove(req)
        self.requests.pop(req.request_id, None)
        self.connector.on_finished(req.request_id)
        group = req.group
        if group is not None and req is group.parent:
            for member in group.unforked:  # they never ran: they end with the parent
                if not member.finished:
                    self._finish(member, reason, error)
        if group is not None and group.finished:
            self.groups.pop(group.request_id, None)
            # the group's output carries the parent's metrics: they end with the last sample
            m = group.parent.metrics
            m.finished_time = max(x.metrics.finished_time for x in group.members)
            m.last_token_time = max((x.metrics.last_token_time for x in group.members
                                     if x.metrics.last_token_time is not None), default=None)

    # -- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one model step. Returns outputs of requests that produced a token,
        finished, or were aborted since the last step."""
        outputs, self._pending_outputs = self._pending_outputs, []
        plan = self.scheduler.schedule()
        if not plan.scheduled:
            self._send_events()
            if self.connector.waiting and not outputs:
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
        if any(s.request.in_prefill for s in plan.scheduled):
            self.connector.observe_prefill(time.perf_counter() - t0,
                                           sum(s.num_tokens for s in plan.scheduled))
        self._publish(plan.scheduled, result)
        self._fork(result)
        self._send_events()
        return outputs + self._emit(result)

    def _send_events(self) -> None:
        """Hand the step's index changes to the KV event publisher and the KV connector
        (the shared tier's store queue; both asynchronous)."""
        if self.kv_events is None and not self.connector.records_events:
            return
        events = self._event_log.drain()
        if self.kv_events is not None:
            self.kv_events.publish(events)
        if self.connector.records_events and events:
            self.connector.on_published(events)

    def _fail(self, scheduled: list[ScheduledSeq], exc: Exception) -> list[RequestOutput]:
        """Publish nothing, withdraw the step's in-flight pages, finish its requests."""
        self.counters["failed_steps"] += 1
        for s in scheduled:
            self.cache.fail_step(s.request.table)
        for s in scheduled:
            self._finish(s.request, "error", f"{type(exc).__name__}: {exc}")
        return self._outputs([s.request for s in scheduled])

    def _outputs(self, reqs: list[Request]) -> list[RequestOutput]:
        """One output per request, and one per group for the members of a group."""
        outputs, groups = [], {}
        for req in reqs:
            if req.group is None:
                outputs.append(self.outputs.make_output(req))
            else:
                groups[id(req.group)] = req.group
        return outputs + self._group_outputs(list(groups.values()))

    def _group_outputs(self, groups: list[SampleGroup]) -> list[RequestOutput]:
        outs = [self.outputs.make_group_output(g) for g in groups]
        return [o for o in outs if o is not None]

    def _fork(self, result: StepResult) -> None:
        """A group's parent completed its prefill in this step: fork the other members
        from its page table (shared full pages, copied partial page) so they decode from
        the next step on (``engine/sample_group.py``)."""
        for s, _, _ in result.sampled:
            group = s.request.group
            if group is None or s.request is not group.parent or group.forked:
                continue
            group.forked = True
            if group.params.max_tokens == 0:
                continue  # prefill only: every member finishes now
            src: list[int] = []
            dst: list[int] = []
            for member in group.members[1:]:
                for a, b in self.scheduler.fork(group.parent, member):
                    src.append(a)
                    dst.append(b)
            if src:
                self.runner.kv.copy_pages(src, dst)

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
        touched: list[Request] = []
        now = self.clock()
        for s, tok, lp in result.sampled:
            req = s.request
            if not req.prefill_done and req.index > 0:  # forked: the parent prefilled
                req.prefill_done = True
                req.frozen_cached = req.group.parent.frozen_cached
            elif not req.prefill_done:
                req.prefill_done = True
                req.freeze_cached()
                self.cache.record_query(req.num_prompt_tokens, req.num_cached_tokens,
                                        req.num_inflight_hit_tokens)
                if req.pin_ttl_s is not None:
                    self._pin(req)
                if req.session_id is not None:
                    self.sessions.renew(req.tenant, req.session_id, req.num_cached_tokens)
                if req.diagnostics is not None:
                    req.diagnosis = self.diagnostics.diagnose(req)
            if req.sampling_params.max_tokens == 0:  # prefill only: drop the token
                reason: str | None = "length"
            else:
                reason = self.outputs.append_token(req, tok, lp, now)
            if reason is not None:
                self._finish(req, reason)
                if req.group is None or req.group.finished:
                    self.counters["requests_finished"] += 1
            touched.append(req)
        return self._outputs(touched)

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
        mc, bs = self.model_config, self.config.block_size
        d.update(self.diagnostics.stats())
        d.update(self.sessions.stats())
        d.update(requests_running=len(self.scheduler.running),
                 requests_waiting=len(self.scheduler.waiting),
                 num_preemptions=self.scheduler.num_preemptions,
                 pages_kept_for_global_layers=sum(
                     mc.pages_for_global_layers_only(r.num_computed_tokens, bs)
                     for r in self.scheduler.running.values()))
        d.update(self.connector.stats())
        if self._grammar is not None:
            d.update(self._grammar.stats)
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
            tier = "pool" if not demoted else self.connector.tier_of(demoted)
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

    def close_session(self, session_id: str, tenant: str | None = None) -> bool:
        """Close the tenant's agent session: its kept transcript's pages are freed at
        once (those no running request or other pin holds). ``False`` when the tenant
        has no such live session (another tenant's is never touched).

        Raises:
            ParamError: ``session_id`` is not a string of 1 to 256 characters.
        """
        check_namespace(tenant=tenant)
        _check_session_id(session_id)
        return self.sessions.close(tenant, session_id)

    def session_info(self, session_id: str, tenant: str | None = None) -> dict | None:
        """The tenant's session as :meth:`SessionRegistry.info` shows it, or ``None``."""
        check_namespace(tenant=tenant)
        return self.sessions.info(tenant, session_id)
    def close(self) -> None:
        """Finish the queued KV tier stores and stop their worker, and close the KV
        event sockets (idempotent). The engine keeps serving from the pool alone
        afterwards."""
        self.cache.close_connector()  # its counters stay readable in stats()
        if self.kv_events is not None:
            self.kv_events.close()
            self.kv_events = None

    @property
    def tiers(self) -> KVTiers | None:
        """The KV tiers behind :attr:`connector` (introspection: tests, benchmarks), or
        ``None`` without tiers."""
        c = self.connector
        return c.tiers if isinstance(c, TieredConnector) else None

    @property
    def shared(self) -> SharedKVStore | None:
        """The shared store behind :attr:`connector` (introspection), or ``None``."""
        c = self.connector
        return c.shared if isinstance(c, TieredConnector) else None

    def reset_prefix_cache(self):
        """Drop unreferenced cached pages; running requests are unaffected."""
        report = self.cache.reset()
        self._send_events()
        return report


def _check_session_id(session_id: object) -> None:
    """Raises ParamError naming ``session_id`` unless it is None or 1 to 256 characters."""
    try:
        check_session_id(session_id)
    except ValueError as exc:
        raise ParamError("session_id", str(exc)) from None
