"""Runs the synchronous :class:`~prefixcache.engine.engine.LLMEngine` on a background
thread and streams its outputs to asyncio.

One thread owns the engine: every engine call (add, abort, stats, reset) is a command
queued to it and executed between two model steps, so the engine needs no locks. The
thread steps while any request is unfinished and otherwise sleeps on a condition
variable (no busy loop). Each request's outputs go to an ``asyncio.Queue`` of the
caller's event loop through ``loop.call_soon_threadsafe``, as ``(index, output)`` pairs
(``index`` tells the prompts of one HTTP request apart). Outputs are cumulative
snapshots, so a slow consumer may skip to the latest one without losing anything.

An exception escaping ``step()`` (the engine itself handles model failures) never kills
the thread: it aborts every request, sends the error to their queues and keeps serving.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefixcache.outputs import RequestOutput
from prefixcache.progress import phase
from prefixcache.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread is not running."""


@dataclass
class RequestSpec:
    """One engine request: the arguments of ``LLMEngine.add_request`` and the
    ``index`` its outputs carry."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    tenant: str | None = None
    cache_salt: str | None = None
    arrival_time: float | None = None
    index: int = 0
    pin_ttl_s: float | None = None  # pin the prompt's full pages for this long (seconds)
    diagnostics: Any = None  # engine.miss_diagnostics.DiagnosticsRequest, when asked
    session_id: str | None = None  # the tenant's agent session (cache/sessions.py)


@dataclass(eq=False)
class StreamState:
    """Engine-thread bookkeeping of one request (also used by the metrics observer)."""

    spec: RequestSpec
    queue: asyncio.Queue | None
    loop: asyncio.AbstractEventLoop
    silent: bool = False             # aborted by the consumer: nothing more to send
    obs: dict[str, Any] = field(default_factory=dict)

    def send(self, item: Any) -> None:
        if self.silent or self.queue is None:
            return
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (self.spec.index, item))
        except RuntimeError:  # the event loop is closed (shutdown)
            self.silent = True


OutputObserver = Callable[[StreamState, RequestOutput], None]
StepObserver = Callable[[list[RequestOutput]], None]


class AsyncEngine:
    """The engine behind an asyncio front end.

    Args:
        engine: an ``LLMEngine`` (anything with its ``add_request``, ``abort_request``,
            ``step`` and ``has_unfinished_requests``).
        on_output: called on the engine thread for every output of a known request,
            before it is sent (metrics).
        on_step: called on the engine thread with each step's outputs.
        warmup: call ``engine.warmup()`` (where it has one) on the engine thread before
            the first command; a failure is logged and serving goes on.
    """

    def __init__(self, engine: Any, *, on_output: OutputObserver | None = None,
                 on_step: StepObserver | None = None, warmup: bool = False):
        self.engine = engine
        self.warmup = warmup
        self._warm = threading.Event()
        self.on_output = on_output
        self.on_step = on_step
        self._cond = threading.Condition()
        self._cmds: deque[Callable[[], None]] = deque()
        self._streams: dict[str, StreamState] = {}   # engine thread only
        self._stop = False
        self._thread: threading.Thread | None = None
        self.step_errors = 0

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="prefixcache-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the thread after its current step; unfinished requests are aborted."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Block until the engine thread finished its warmup (or had none to run);
        ``False`` on timeout. Call after :meth:`start`."""
        return self._warm.wait(timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- commands (any thread) ---------------------------------------------------------
    def _submit(self, fn: Callable[[], None]) -> None:
        if not self.is_alive():
            raise EngineDeadError("the engine thread is not running")
        with self._cond:
            self._cmds.append(fn)
            self._cond.notify()

    async def call(self, fn: Callable[[Any], Any], timeout: float | None = None) -> Any:
        """Run ``fn(engine)`` on the engine thread between two steps; its result."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def cmd() -> None:
            try:
                res, exc = fn(self.engine), None
            except Exception as e:  # handed to the caller
                res, exc = None, e
            _resolve(loop, fut, res, exc)

        self._submit(cmd)
        return await asyncio.wait_for(fut, timeout) if timeout else await fut

    async def add_requests(self, specs: list[RequestSpec], queue: asyncio.Queue) -> None:
        """Add requests atomically: either all are queued in the engine, or none (the
        first error, ``ParamError`` / ``QueueFullError`` / ``ValueError``, is raised).
        Their outputs arrive in ``queue`` as ``(spec.index, RequestOutput)``; an engine
        failure arrives as ``(spec.index, exception)``. If the caller is cancelled
        while waiting, the requests are aborted."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def cmd() -> None:
            added: list[RequestSpec] = []
            try:
                for s in specs:
                    pin: dict[str, Any] = ({} if s.pin_ttl_s is None
                                           else {"pin_ttl_s": s.pin_ttl_s})
                    if s.diagnostics is not None:
                        pin["diagnostics"] = s.diagnostics
                    if s.session_id is not None:
                        pin["session_id"] = s.session_id
                    self.engine.add_request(s.request_id, s.prompt_token_ids, s.params,
                                            prompt=s.prompt, tenant=s.tenant,
                                            cache_salt=s.cache_salt, arrival_time=s.arrival_time,
                                            **pin)
                    added.append(s)
                    self._streams[s.request_id] = StreamState(s, queue, loop)
            except Exception as exc:
                for s in added:
                    self._abort_now(s.request_id)
                _resolve(loop, fut, None, exc)
                return
            _resolve(loop, fut, None, None)

        self._submit(cmd)
        try:
            await fut
        except asyncio.CancelledError:
            for s in specs:
                self.abort(s.request_id)
            raise

    def abort(self, request_id: str) -> None:
        """Abort a request (its pages return to the pool before the next step); no
        more outputs are sent for it. Never blocks; safe in ``finally`` blocks."""
        try:
            self._submit(lambda: self._abort_now(request_id))
        except EngineDeadError:
            pass

    # -- engine thread -----------------------------------------------------------------
    def _abort_now(self, request_id: str) -> None:
        st = self._streams.get(request_id)
        if st is not None:
            st.silent = True  # its final "abort" output still reaches the observers
        if not self.engine.abort_request(request_id):
            self._streams.pop(request_id, None)

    def _warmup(self) -> None:
        fn = getattr(self.engine, "warmup", None) if self.warmup else None
        try:
            if fn is not None:
                with phase("warm-up") as note:
                    note["detail"] = f"one step of {fn()} tokens on the engine thread"
        except Exception:  # serving without it is only slower on the first request
            log.exception("engine warmup failed")
        finally:
            self._warm.set()

    def _run(self) -> None:
        self._warmup()
        consecutive_failures = 0
        while True:
            with self._cond:
                while (not self._cmds and not self._stop
                       and not self.engine.has_unfinished_requests()):
                    self._cond.wait()
                if self._stop:
                    break
                cmds = list(self._cmds)
                self._cmds.clear()
            for cmd in cmds:
                try:
                    cmd()
                except Exception:  # commands report their own errors; never die here
                    log.exception("engine command failed")
            try:
                outputs = self.engine.step()
            except Exception as exc:
                consecutive_failures += 1
                self.step_errors += 1
                log.exception("engine step failed; aborting its requests")
                self._fail_all(exc)
                if consecutive_failures > 1:
                    time.sleep(min(1.0, 0.05 * consecutive_failures))  # no hot loop
                continue
            consecutive_failures = 0
            self._dispatch(outputs)
        self._shutdown_requests()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        if self.on_step is not None and outputs:
            try:
                self.on_step(outputs)
            except Exception:
                log.exception("step observer failed")
        for out in outputs:
            st = self._streams.get(out.request_id)
            if st is None:
                continue
            if self.on_output is not None:
                try:
                    self.on_output(st, out)
                except Exception:
                    log.exception("output observer failed")
            if out.finished:
                del self._streams[out.request_id]
            st.send(out)

    def _fail_all(self, exc: Exception) -> None:
        """After an unexpected step exception: abort every request and tell its
        consumer. Requests the engine cannot abort any more are dropped."""
        err = RuntimeError(f"engine step failed: {type(exc).__name__}: {exc}")
        for rid, st in list(self._streams.items()):
            st.send(err)
            st.silent = True
            try:
                self.engine.abort_request(rid)
            except Exception:
                log.exception("abort of %s failed after a step error", rid)
            self._streams.pop(rid, None)

    def _shutdown_requests(self) -> None:
        for rid, st in list(self._streams.items()):
            st.send(EngineDeadError("the server is shutting down"))
            try:
                self.engine.abort_request(rid)
            except Exception:
                pass
        self._streams.clear()
        close = getattr(self.engine, "close", None)
        if callable(close):  # finishes the KV tier stores, so a restart hits
            try:
                close()
            except Exception:
                log.exception("engine close failed")


def _resolve(loop: asyncio.AbstractEventLoop, fut: asyncio.Future, result: Any,
             exc: BaseException | None) -> None:
    def set_it() -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
    try:
        loop.call_soon_threadsafe(set_it)
    except RuntimeError:
        pass
