"""The offline API, shaped like vLLM's ``LLM``.

    from prefixcache import LLM, SamplingParams
    llm = LLM(model="builtin:tiny", block_size=16, enable_prefix_caching=True)
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=16, temperature=0.0))
    outs[0].outputs[0].text, outs[0].num_cached_tokens, outs[0].ttft
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, cast

from prefixcache.cache.pins import PinCapError, check_pin_ttl
from prefixcache.config import EngineConfig
from prefixcache.engine.engine import LLMEngine
from prefixcache.engine.miss_diagnostics import diagnostics_request, message_anchors
from prefixcache.outputs import RequestOutput
from prefixcache.sampling_params import ParamError, SamplingParams
from prefixcache.text.messages import MessageError, check_messages

PromptType = str | dict[str, Any]


class LLM:
    """Load a model and generate completions offline. Use it as a context manager
    (``with LLM(...) as llm:``) or call :meth:`close` when done; a closed LLM refuses
    new work (RuntimeError).

    Args:
        model: Hugging Face model directory or ``"builtin:tiny"``.
        **kwargs: any :class:`~prefixcache.config.EngineConfig` field (``block_size``,
            ``num_pages``, ``max_num_batched_tokens``, ``enable_prefix_caching``,
            ``device``, ``dtype``, ``deterministic``, ...).

    Raises:
        ValueError: an invalid configuration value (the message names it).
        FileNotFoundError: the model directory or its weights are missing.
    """

    def __init__(self, model: str = "builtin:tiny", **kwargs: Any):
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()
        self._closed = False

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this LLM is closed; create a new LLM to generate")

    def _prompt_ids(self, prompt: PromptType) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            if not prompt:
                raise ParamError("prompt", "the prompt is empty")
            if self.tokenizer is None:
                raise ParamError("prompt", "this model has no tokenizer; pass prompt_token_ids")
            return self.tokenizer.encode(prompt), prompt
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"]), prompt.get("prompt")
        if isinstance(prompt, dict) and "prompt" in prompt:
            return self._prompt_ids(prompt["prompt"])
        raise ParamError("prompt", "expected a string or a {'prompt_token_ids': [...]} dict")

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 tenant: str | None = None, cache_salt: str | None = None,
                 use_tqdm: bool = False, pin_ttl_s: float | None = None,
                 cache_diagnostics: bool | dict | None = None,
                 session_id: str | None = None,
                 _anchors: Sequence[tuple[tuple[str, str], ...]] = ()
                 ) -> list[RequestOutput]:
        """Generate for every prompt, all batched together; outputs in prompt order.
        With ``n > 1`` (or ``best_of``) an output holds one ``CompletionOutput`` per
        returned sample (``index`` 0 to ``n - 1``), all from one prefill of the prompt.

        Args:
            prompts: strings or ``{"prompt_token_ids": [...]}`` dicts (or one of them).
            sampling_params: one for all prompts, or one per prompt.
            tenant, cache_salt: the cache namespace of these requests.
            use_tqdm: show a progress bar.
            pin_ttl_s: pin each prompt's full pages for this long (seconds, from 1 to
                604800) once prefilled; ``output.extra["pin"]`` says whether the pin cap allowed it.
            cache_diagnostics: ``True`` or ``{"compare_to": "<request id>"}``: say why each
                request did not hit, in ``output.extra["cache_diagnostics"]`` (README,
                "Cache-miss diagnostics"; the ids are the outputs' ``request_id``).
            session_id: the tenant's agent session these calls belong to: each call's
                transcript is kept ahead of LRU for ``session_ttl_s`` after it ends
                (``docs/sessions.md``; :meth:`close_session` frees it at once).

        Raises:
            ParamError: an invalid prompt or parameter (``tenant`` and ``cache_salt``
                must be strings or None); nothing is queued then.
            RuntimeError: the LLM is closed.
        """
        self._check_open()
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ParamError("sampling_params", "need one per prompt")
        encoded = [self._prompt_ids(p) for p in prompts]
        for (ids, _), sp in zip(encoded, params):
            self.engine.validate(ids, sp)
        anchors = list(_anchors) or [()] * len(encoded)
        asks = [diagnostics_request(cache_diagnostics, a) for a in anchors]
        order = []
        for (ids, text), sp, ask in zip(encoded, params, asks):
            rid = f"offline-{next(self._ids)}"
            self.engine.add_request(rid, ids, sp, prompt=text, tenant=tenant,
                                    cache_salt=cache_salt, pin_ttl_s=pin_ttl_s,
                                    diagnostics=ask, session_id=session_id)
            order.append(rid)
        return self._run(order, use_tqdm)

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             sampling_params: SamplingParams | None = None, *, tools: list | None = None,
             tenant: str | None = None, cache_salt: str | None = None,
             cache_diagnostics: bool | dict | None = None,
             session_id: str | None = None) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, rendered with the
        model's chat template; each output's ``prompt`` is the rendered prompt text.
        Raises ParamError naming the field at fault (``messages[0].role``; with a list
        of conversations ``messages[1][0].role``), with the server's rules
        (``text/messages.py``), or ``messages`` if the model has no tokenizer."""
        self._check_open()
        if self.tokenizer is None:
            raise ParamError("messages", "this model has no tokenizer to render a chat")
        one = not (isinstance(messages, list) and messages and isinstance(messages[0], list))
        convs = cast(list[list[dict[str, Any]]], [messages] if one else messages)
        for k, conv in enumerate(convs):
            try:
                check_messages(conv)
            except MessageError as exc:
                param = exc.param if one else exc.param.replace("messages", f"messages[{k}]", 1)
                raise ParamError(param, exc.message) from None
        texts = [self.tokenizer.render_chat(c, tools=tools) for c in convs]
        prompts = [{"prompt_token_ids": self.tokenizer.encode(t, add_special_tokens=False),
                    "prompt": t} for t in texts]
        return self.generate(prompts, sampling_params, tenant=tenant, cache_salt=cache_salt,
                             cache_diagnostics=cache_diagnostics, session_id=session_id,
                             _anchors=[message_anchors(c, tools) for c in convs]
                             if cache_diagnostics else ())

    def _run(self, order: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm
            bar = tqdm(total=len(order), desc="generate")
        wanted = set(order)
        while len(done) < len(order):
            if not self.engine.has_unfinished_requests():
                raise RuntimeError("engine stopped with requests unfinished")
            for out in self.engine.step():
                if out.finished and out.request_id in wanted:
                    done[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [done[r] for r in order]

    def pin_prefix(self, prompt: PromptType, ttl_s: float, *, tenant: str | None = None,
                   cache_salt: str | None = None) -> dict:
        """Prefill ``prompt`` without generating and pin its full pages for ``ttl_s``
        seconds (pre-storing a system prompt or a document). Returns the pin as
        :meth:`list_pins` shows it, plus ``cached_tokens`` (what the prefill reused).

        Raises:
            ParamError: a bad prompt (shorter than one page), ``ttl_s`` (a number of
                seconds from 1 to 604800, a week, as HTTP ``cache_ttl``), ``tenant`` or
                ``cache_salt``.
            ValueError: prefix caching is off (nothing is published to pin).
            PinCapError: the pin does not fit under ``max_pinned_fraction``.
            RuntimeError: the LLM is closed.
        """
        self._check_open()
        try:
            ttl_s = check_pin_ttl(ttl_s)
        except ValueError as exc:
            raise ParamError("ttl_s", str(exc)) from None
        if not self.engine.config.enable_prefix_caching:
            raise ValueError("enable_prefix_caching is off: no page is published, so "
                             "nothing can be pinned")
        ids, text = self._prompt_ids(prompt)
        bs = self.engine.config.block_size
        if len(ids) < bs:
            raise ParamError("prompt", f"has {len(ids)} tokens; pinning needs at least "
                             f"one full page ({bs} tokens)")
        out = self.generate([{"prompt_token_ids": ids, "prompt": text}],
                            SamplingParams(max_tokens=0), tenant=tenant,
                            cache_salt=cache_salt, pin_ttl_s=ttl_s)[0]
        pin = out.extra.get("pin")
        if pin is None or not pin["pinned"]:
            if pin is None:
                raise RuntimeError(f"the prefill failed: {out.error}")
            raise PinCapError(pin["error"])
        return {k: v for k, v in pin.items() if k != "pinned"} | {
            "cached_tokens": out.num_cached_tokens}

    def close_session(self, session_id: str, tenant: str | None = None) -> bool:
        """Close one of the tenant's agent sessions: its kept transcript is freed at
        once. ``False`` if it has no such live session (``LLMEngine.close_session``)."""
        return self.engine.close_session(session_id, tenant)

    def list_pins(self, tenant: str | None = None) -> list[dict]:
        """The tenant's live pins, oldest first: ``prefix_hash`` (hex), ``tokens``,
        ``tier`` (``"pool"``), ``expires_at`` (Unix seconds), ``ttl_s``."""
        return self.engine.list_pins(tenant)

    def unpin(self, prefix_hash: str, tenant: str | None = None) -> bool:
        """Remove one of the tenant's pins; ``False`` if it has none by that hash.
        Raises ParamError if ``prefix_hash`` is not hex."""
        return self.engine.unpin(prefix_hash, tenant)

    def close(self) -> None:
        """Write the pool's cached pages to the KV tiers and finish their stores, and
        close the KV event sockets. Idempotent; afterwards :meth:`generate`,
        :meth:`chat` and :meth:`pin_prefix` raise RuntimeError (``stats`` and
        ``list_pins`` still answer)."""
        if self._closed:
            return
        self._closed = True
        self.engine.close()

    def stats(self) -> dict[str, int | float]:
        """``prefix_cache_queries``, ``prefix_cache_hits`` (tokens), ``hit_rate``,
        ``prefill_tokens_computed``, ``pages_total/free/cached/live`` and more."""
        return self.engine.stats()

    def reset_prefix_cache(self):
        return self.engine.reset_prefix_cache()
