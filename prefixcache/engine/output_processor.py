"""Turns sampled tokens into request state: text, logprobs, stop conditions, outputs.

Per generated token the work is O(1) in the request's history: stop ids are a set, stop
strings are searched only in the new text plus a window of the longest stop string, and
an output shares the request's token and logprob lists instead of copying them.
"""
from __future__ import annotations

from collections.abc import Iterable

from prefixcache.engine.request import Request
from prefixcache.engine.sample_group import SampleGroup
from prefixcache.model.sampler import TokenLogprobs
from prefixcache.outputs import CompletionOutput, Logprob, RequestOutput
from prefixcache.text.detokenizer import IncrementalDetokenizer
from prefixcache.text.tokenizer import Tokenizer


class OutputProcessor:
    """Detokenizes incrementally and decides when a request stops.

    Stop conditions, checked after every token in this order: the request's grammar
    (structured outputs) accepted a stop token (``"stop"``), a stop token id or EOS
    (``finish_reason="stop"``; EOS ignored with ``ignore_eos`` and before ``min_tokens``),
    a stop string in the new text (``"stop"``, the text is cut before it unless
    ``include_stop_str_in_output``), ``max_tokens`` or the context length (``"length"``).
    The stopping token stays in ``token_ids``, as in vLLM.

    Args:
        tokenizer: or ``None`` (token ids only; ``text`` stays empty).
        max_model_len: context length in tokens.
        eos_token_ids: the model's EOS ids (``config.json``), besides the tokenizer's.
    """

    def __init__(self, tokenizer: Tokenizer | None, max_model_len: int,
                 eos_token_ids: Iterable[int] = ()):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids)
        if tokenizer is not None:
            self.eos_token_ids |= set(tokenizer.eos_token_ids)

    def start(self, req: Request) -> None:
        if self.tokenizer is not None:
            req.detokenizer = IncrementalDetokenizer(
                self.tokenizer, req.prompt_token_ids, req.sampling_params.skip_special_tokens)

    def append_token(self, req: Request, token: int, lp: TokenLogprobs | None,
                     now: float) -> str | None:
        """Record one generated token. Returns the finish reason, or ``None``."""
        p = req.sampling_params
        req.all_token_ids.append(token)
        req.output_token_ids.append(token)
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
        req.metrics.last_token_time = now
        if lp is not None and req.logprobs is not None:
            req.logprobs.append(self.logprob_dict(lp))
            req.cumulative_logprob = (req.cumulative_logprob or 0.0) + lp.logprob
        n_out = req.num_output_tokens
        if req.grammar is not None:
            req.grammar.advance(req.output_token_ids)
            if req.grammar.terminated:  # it accepted a stop token: not text
                self._flush(req)
                return "stop"
        if n_out >= p.min_tokens:
            if token in req.stop_ids:
                req.stop_reason = token
                self._flush(req)
                return "stop"
            if not p.ignore_eos and token in self.eos_token_ids:
                self._flush(req)
                return "stop"
        if req.detokenizer is not None:
            delta = req.detokenizer.push([token])
            if p.stop and delta and n_out >= p.min_tokens and self._check_stop_strings(req, delta):
                return "stop"
            req.text = self._visible(req)
        if p.max_tokens is not None and n_out >= p.max_tokens:
            self._flush(req)
            return "length"
        if len(req.all_token_ids) >= self.max_model_len:
            self._flush(req)
            return "length"
        return None

    def _visible(self, req: Request) -> str:
        return req.detokenizer.text

    def _flush(self, req: Request) -> None:
        if req.detokenizer is not None:
            req.detokenizer.flush()
            req.text = req.detokenizer.text

    def _check_stop_strings(self, req: Request, delta: str) -> bool:
        """Find the earliest stop string that ends inside the new text."""
        p = req.sampling_params
        assert isinstance(p.stop, list)  # SamplingParams.__post_init__ made it a list
        text = req.detokenizer.text
        longest = max(len(s) for s in p.stop)  # at most MAX_STOP_STRINGS
        lo = max(0, len(text) - len(delta) - longest + 1)
        best: tuple[int, str] | None = None
        for s in p.stop:
            k = text.find(s, lo)  # scans only the new tail: [lo, len(text))
            if k != -1 and (best is None or k < best[0]):
                best = (k, s)
        if best is None:
            return False
        k, s = best
        req.text = text[:k + len(s)] if p.include_stop_str_in_output else text[:k]
        req.stop_reason = s
        return True

    def logprob_dict(self, lp: TokenLogprobs) -> dict[int, Logprob]:
        dec = self.tokenizer.decode_token if self.tokenizer is not None else (lambda t: None)
        out = {lp.token_id: Logprob(lp.logprob, lp.rank, dec(lp.token_id))}
        for r, (t, v) in enumerate(zip(lp.top_ids, lp.top_logprobs), start=1):
            if t not in out:
                out[t] = Logprob(v, r, dec(t))
        return out

    def append_prompt_logprobs(self, req: Request, start: int,
                               lps: list[TokenLogprobs]) -> None:
        """Record the logprobs of prompt positions ``start + 1 ...`` (one per entry of
        ``lps``: the distribution at position ``p`` scores prompt token ``p + 1``)."""
        if req.prompt_logprobs is None or start == 0:
            req.prompt_logprobs = [None]
        req.prompt_logprobs.extend(self.logprob_dict(lp) for lp in lps)

    def make_output(self, req: Request) -> RequestOutput:
        """A snapshot of the request (cumulative text and tokens, as vLLM streams). O(1):
        it shares the request's lists (see :class:`CompletionOutput`)."""
        return self._request_output(req, [self._completion(req, 0, True)], req.finished,
                                    req.error)

    def make_group_output(self, group: SampleGroup) -> RequestOutput | None:
        """A snapshot of a request with parallel samples: one ``CompletionOutput`` per
        returned sample, ``index`` in output order; ``finished`` once every sample is.
        With ``best_of`` only the final output exists (``None`` before): which samples
        are returned is known only then. Its samples carry token logprobs only if the
        caller asked for them (``cumulative_logprob`` always)."""
        if group.ranked and not group.finished:
            return None
        keep_lps = group.params.logprobs is not None
        comps = [self._completion(m, i if group.ranked else m.index, keep_lps)
                 for i, m in enumerate(group.returned())]
        error = next((m.error for m in group.members if m.error is not None), None)
        return self._request_output(group.parent, comps, group.finished, error,
                                    request_id=group.request_id)

    @staticmethod
    def _completion(req: Request, index: int, keep_lps: bool) -> CompletionOutput:
        return CompletionOutput(
            index=index, text=req.text, token_ids=req.output_token_ids,
            cumulative_logprob=req.cumulative_logprob,
            logprobs=req.logprobs if keep_lps else None,
            finish_reason=req.finish_reason, stop_reason=req.stop_reason,
            num_tokens=len(req.output_token_ids))

    def _request_output(self, req: Request, comps: list[CompletionOutput], finished: bool,
                        error: str | None, request_id: str | None = None) -> RequestOutput:
        return RequestOutput(
            request_id=request_id or req.request_id, prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids, outputs=comps, finished=finished,
            num_cached_tokens=req.num_cached_tokens, metrics=req.metrics, error=error,
            prompt_logprobs=req.prompt_logprobs or None, extra=self._extra(req))

    @classmethod
    def _extra(cls, req: Request) -> dict:
        extra = cls._pin_extra(req)
        if req.diagnosis is not None:
            extra["cache_diagnostics"] = req.diagnosis
        return extra

    @staticmethod
    def _pin_extra(req: Request) -> dict:
        """``{"pin": {...}}`` for a request that asked for a pin, once decided."""
        if req.pin_ttl_s is None or (req.pin is None and req.pin_error is None):
            return {}
        if req.pin is None:
            return {"pin": {"pinned": False, "error": req.pin_error}}
        return {"pin": {"pinned": True} | req.pin.as_dict()}
