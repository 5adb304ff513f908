"""The grammar engine of structured outputs: compiled grammars and per-request matchers.

Built on xgrammar. A :class:`GrammarEngine` holds the tokenizer's vocabulary as xgrammar
sees it (every token id's bytes) and a bounded LRU cache of compiled grammars keyed by
the specification's canonical text (:meth:`StructuredOutputsParams.key`), so a schema
is compiled once. Each constrained request gets a :class:`GrammarMatcher`: the sampler
asks it for the step's token bitmask (one bit per token id, ``int32 [ceil(V / 32)]``),
applied to the logits with xgrammar's kernel (no Python loop over the vocabulary), and it
is advanced with each token the request accepts.

Preemption and recompute: a matcher is advanced from the request's output token list
(:meth:`GrammarMatcher.advance` takes the whole list and accepts only the tokens it has
not seen), so recomputing a preempted request's KV never advances it twice.
"""
from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

import torch
import xgrammar as xgr

from prefixcache.sampling_params import ParamError, StructuredOutputsParams
from prefixcache.text.byte_tokenizer import ByteTokenizer
from prefixcache.text.grammar_ebnf import (
    ebnf_literal,
    json_schema_grammar,
    xgrammar_error_text,
)
from prefixcache.text.hf_tokenizer import HFTokenizer
from prefixcache.text.json_tokenizer import JSONTokenizer
from prefixcache.text.tokenizer import Tokenizer

DEFAULT_CACHE_SIZE = 64      # compiled grammars kept (least recently used dropped first)


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int,
                   stop_token_ids: Iterable[int]) -> xgr.TokenizerInfo:
    """xgrammar's view of ``tokenizer``: the bytes of each of ``vocab_size`` token ids
    (the logits' width; ids past the tokenizer's vocabulary are padding, never allowed)
    and the ids that end generation (allowed only where the grammar is complete).

    Raises:
        ValueError: a tokenizer kind whose token bytes are unknown (the approximate one).
    """
    stops = sorted(set(stop_token_ids))
    if isinstance(tokenizer, ByteTokenizer):
        # ids 0-255 are the bytes; special and padding ids decode to nothing: empty, so
        # xgrammar treats them as special (never allowed, except the stop ids)
        vocab = [bytes([i]) for i in range(256)] + [b""] * (vocab_size - 256)
        return xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size,
                                 stop_token_ids=stops)
    if isinstance(tokenizer, HFTokenizer):
        return xgr.TokenizerInfo.from_huggingface(tokenizer.backend, vocab_size=vocab_size,
                                                  stop_token_ids=stops)
    if isinstance(tokenizer, JSONTokenizer):
        from transformers import PreTrainedTokenizerFast

        fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
        return xgr.TokenizerInfo.from_huggingface(fast, vocab_size=vocab_size,
                                                  stop_token_ids=stops)
    raise ValueError(f"structured outputs need a real tokenizer; {tokenizer.name!r} "
                     f"({type(tokenizer).__name__}) has no token bytes")


class GrammarMatcher:
    """One request's position in its grammar.

    Attributes:
        num_accepted: output tokens accepted so far.
    """

    def __init__(self, compiled: xgr.CompiledGrammar):
        self._m = xgr.GrammarMatcher(compiled)
        self.num_accepted = 0

    def fork(self) -> GrammarMatcher:
        """An independent copy at the same position (parallel samples of one prompt)."""
        twin = copy.copy(self)
        twin._m = self._m.fork()
        return twin

    def advance(self, output_token_ids: list[int]) -> None:
        """Accept ``output_token_ids[num_accepted:]`` (the request's tokens not yet seen).

        Raises:
            RuntimeError: the grammar rejects a token (the mask was not applied to it).
        """
        for tok in output_token_ids[self.num_accepted:]:
            if self._m.is_terminated() or not self._m.accept_token(tok):
                raise RuntimeError(f"token {tok} does not continue the grammar "
                                   f"(after {self.num_accepted} tokens)")
            self.num_accepted += 1

    @property
    def terminated(self) -> bool:
        """A stop token was accepted, or the grammar can take no further token."""
        return bool(self._m.is_terminated())

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (int32 on the CPU)."""
        self._m.fill_next_token_bitmask(bitmask, row)


class GrammarEngine:
    """Compiles structured-output specifications once and makes matchers.

    Args:
        tokenizer: the model's tokenizer (see :func:`tokenizer_info` for the kinds).
        vocab_size: the logits' width (the model's vocabulary).
        stop_token_ids: the ids that end generation (EOS).
        cache_size: compiled grammars kept, least recently used dropped first.
        max_threads: xgrammar's compile threads.

    Attributes:
        stats: ``grammar_cache_hits``, ``grammar_cache_misses``, ``grammar_compile_s``
            (seconds spent compiling, all misses together), ``grammar_cache_size``.

    Raises:
        ValueError: as :func:`tokenizer_info`; ``cache_size < 1``.
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Iterable[int],
                 cache_size: int = DEFAULT_CACHE_SIZE, max_threads: int = 2):
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {cache_size}")
        self.vocab_size = vocab_size
        self.info = tokenizer_info(tokenizer, vocab_size, stop_token_ids)
        # one cache, ours (keyed by the specification, bounded, counted)
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=max_threads,
                                             cache_enabled=False)
        self._cache: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.cache_size = cache_size
        self.stats: dict[str, float] = {"grammar_cache_hits": 0, "grammar_cache_misses": 0,
                                        "grammar_compile_s": 0.0, "grammar_cache_size": 0}

    def compile(self, spec: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """The compiled grammar of ``spec`` (from the cache when compiled before).

        Raises:
            ParamError: xgrammar cannot compile it; ``param`` is ``spec.param``.
        """
        with self._lock:  # the server compiles off its loop while the engine steps
            return self._compile_cached(spec)

    def _compile_cached(self, spec: StructuredOutputsParams) -> xgr.CompiledGrammar:
        key = spec.key()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self.stats["grammar_cache_hits"] += 1
            return hit
        t0 = time.perf_counter()
        try:
            compiled = self._compile(spec)
        except ParamError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError/its own kinds
            raise ParamError(spec.param,
                             f"cannot be compiled: {xgrammar_error_text(exc)}") from None
        self.stats["grammar_compile_s"] += time.perf_counter() - t0
        self.stats["grammar_cache_misses"] += 1
        self._cache[key] = compiled
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        self.stats["grammar_cache_size"] = len(self._cache)
        return compiled

    def _compile(self, spec: StructuredOutputsParams) -> xgr.CompiledGrammar:
        ws = not spec.disable_any_whitespace
        c = self._compiler
        if spec.json is not None:
            return c.compile_grammar(json_schema_grammar(spec.json, any_whitespace=ws))
        if spec.json_object:
            return c.compile_grammar(json_schema_grammar({"type": "object"}, any_whitespace=ws,
                                                         strict=False))
        if spec.regex is not None:
            return c.compile_regex(spec.regex)
        if spec.choice is not None:
            return c.compile_grammar("root ::= " + " | ".join(map(ebnf_literal, spec.choice)))
        assert spec.grammar is not None
        return c.compile_grammar(spec.grammar)

    def matcher(self, spec: StructuredOutputsParams) -> GrammarMatcher:
        """A fresh matcher at the start of ``spec``'s grammar. Raises as :meth:`compile`."""
        return GrammarMatcher(self.compile(spec))



def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """An int32 ``[rows, ceil(vocab_size / 32)]`` bitmask on the CPU, all tokens allowed."""
    return xgr.allocate_token_bitmask(rows, vocab_size)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor,
                  indices: list[int] | None = None) -> None:
    """Set to ``-inf``, in place, the logits of tokens whose bit is 0.

    Args:
        logits: float ``[S, V]`` on any device.
        bitmask: int32 ``[S, ceil(V / 32)]`` (moved to the logits' device here); row ``i``
            masks ``logits[i]``.
        indices: the rows to mask (all without it); the other rows are left as they are.
    """
    if bitmask.device != logits.device:
        bitmask = bitmask.to(logits.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1],
                                    indices=indices)

