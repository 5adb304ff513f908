"""Per-request cache-miss diagnostics: why a request read no more from the prefix cache.

A request asks with a :class:`DiagnosticsRequest` (``LLMEngine.add_request(...,
diagnostics=...)``); once its prefill is done, :meth:`MissDiagnostics.diagnose` fills
``output.extra["cache_diagnostics"]`` (:meth:`MissDiagnostics.diagnose` documents the
keys) and, when it finishes, :meth:`MissDiagnostics.remember` keeps its tokens for later
comparisons of the same tenant. The comparison and the reason codes are the cache core's
(:mod:`prefixcache.cache.miss_diagnosis`), shared with ``analyze`` and the gateway.

Cost: a request that does not ask does no diagnostic work (``diag_requests`` and
``diag_responses_recorded`` stay 0); the one standing cost is one dict insert per dropped
page (``diag_drops_recorded``), which is what tells "evicted" from "never seen".
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.miss_diagnosis import (
    REASONS,
    DropLog,
    Facts,
    PromptRecord,
    ResponseLog,
    decide,
    find_sections,
    first_divergence,
    locate,
    reusable_tokens,
)
from prefixcache.engine.request import Request
from prefixcache.sampling_params import ParamError

EXCERPT_TOKENS = 8  # tokens shown on each side of a divergence


@dataclass(frozen=True)
class DiagnosticsRequest:
    """What a request asks of its diagnosis.

    Args:
        compare_to: an earlier response id of the same tenant to compare with; ``None``
            compares with the tenant's best matching earlier request that asked too.
        anchors: ``(label, text)`` of the prompt's parts in order (``"system"``,
            ``"tools"``, ``"messages[1]"``, ``"messages[1].content[0]"``), so a divergence
            is named by its section; empty for a raw prompt (a character offset then).
    """

    compare_to: str | None = None
    anchors: tuple[tuple[str, str], ...] = ()


class MissDiagnostics:
    """The engine's diagnoser: the bounded drop and response records of one pool.

    Args:
        cache: the engine's cache manager (its drops are recorded from now on).
        tokenizer: decodes excerpts and character offsets (``None``: token positions only).
        fingerprint: the model fingerprint (part of every page key).
    """

    def __init__(self, cache: KVCacheManager, tokenizer: Any, fingerprint: str):
        self.cache, self.tokenizer, self.fingerprint = cache, tokenizer, fingerprint
        self.drops = DropLog()
        self.responses = ResponseLog()
        cache.record_drops(self.drops)
        self.counters = {"diag_requests": 0, "diag_responses_recorded": 0}
        self.reasons: Counter[str] = Counter()
        # With KV tiers (set by the engine): the names of the local tiers, fastest first,
        # and ``holds(page_hash)`` -> whether one of them still holds the page.
        self.tier_names: tuple[str, ...] = ()
        self.tier_holds: Callable[[bytes], bool] | None = None

    def _model_key(self, req: Request) -> tuple:
        return (self.fingerprint, req.extra_keys)

    def diagnose(self, req: Request) -> dict[str, Any]:
        """The diagnosis of a request whose prefill just completed (it still holds its
        page table). Keys: ``reason`` (a :data:`~.miss_diagnosis.REASONS` code),
        ``detail`` (tier or what expired, else ``None``; ``evicted`` names where the page
        was evicted last: ``pool`` (the device's KV pool, no KV tier held it after),
        ``host`` or ``disk`` (it left the pool into the tiers, then the lowest tier
        evicted it too), ``prompt_tokens``,
        ``cached_tokens``, ``reusable_tokens`` (what the compared request allowed, whole
        pages; ``None`` without one), ``compared_with`` (its id or ``None``),
        ``compare_to_found`` (``None`` unless ``compare_to`` was given), ``divergence``
        (``None``, or ``token`` position, ``char`` offset, ``section``, ``before``,
        ``after`` and ``earlier_after`` excerpts)."""
        self.counters["diag_requests"] += 1
        ask: DiagnosticsRequest = req.diagnostics
        bs, prompt = self.cache.block_size, req.prompt_token_ids
        n, cached = len(prompt), req.num_cached_tokens
        limit = (n - 1) // bs * bs if self.cache.enable_prefix_caching else 0
        found: bool | None = None
        earlier_id: str | None = None
        earlier = None
        if ask.compare_to is not None:
            earlier = self.responses.get(req.tenant, ask.compare_to)
            found = earlier is not None
            earlier_id = ask.compare_to if found else None
        else:
            best = self.responses.best(req.tenant, prompt, bs, req.cache_salt)
            if best is not None:
                earlier_id, earlier = best
        common = 0 if earlier is None else first_divergence(earlier.token_ids, prompt)
        facts = Facts(n, cached, bs, req.read_cache, limit, req.cache_salt,
                      self._model_key(req), earlier=earlier, common=common)
        h = b""  # the hash of the first page the request did not read
        if req.read_cache and cached < limit and req.page_table is not None:
            k = cached // bs
            h = self.cache.page_hashes(req.page_table, k + 1)[k]
            facts.first_missed_drop = self.drops.cause(req.tenant, h)
        reason, detail = decide(facts)
        if (reason, detail) == ("evicted", "pool") and self.tier_holds is not None \
                and self.tier_names and h and not self.tier_holds(h):
            detail = self.tier_names[-1]  # written back on eviction, then evicted there
        self.reasons[reason] += 1
        return {"reason": reason, "detail": detail, "prompt_tokens": n, "cached_tokens": cached,
                "reusable_tokens": (None if earlier is None
                                    else reusable_tokens(common, n, bs)),
                "compared_with": earlier_id, "compare_to_found": found,
                "divergence": (None if earlier is None else self._divergence(
                    prompt, earlier, common, ask, earlier.cache_salt == req.cache_salt))}

    def _divergence(self, prompt: list[int], earlier: PromptRecord, at: int,
                    ask: DiagnosticsRequest, same_salt: bool) -> dict[str, Any]:
        """Where the prompt leaves ``earlier``; the earlier prompt's text only under the
        same ``cache_salt`` (a salt may separate the end users of one tenant)."""
        out: dict[str, Any] = {"token": at, "char": None, "section": None, "before": None,
                               "after": None, "earlier_after": None}
        tok = self.tokenizer
        if tok is None:
            return out
        w = EXCERPT_TOKENS
        char = len(tok.decode(prompt[:at], skip_special_tokens=True))
        sections = find_sections(tok.decode(prompt, skip_special_tokens=True), ask.anchors)
        out.update(char=char, section=locate(sections, char),
                   before=tok.decode(prompt[max(0, at - w):at], skip_special_tokens=True),
                   after=tok.decode(prompt[at:at + w], skip_special_tokens=True),
                   earlier_after=None if not same_salt else tok.decode(
                       list(earlier.token_ids[at:at + w]), skip_special_tokens=True))
        return out

    def remember(self, req: Request) -> None:
        """Keep a finished request's tokens (prompt and output whose KV was computed:
        all but the last sampled token) under its id, for its tenant only."""
        self.counters["diag_responses_recorded"] += 1
        ids = req.all_token_ids
        if req.output_token_ids:
            ids = ids[:-1]
        self.responses.add(req.tenant, req.request_id, PromptRecord(
            tuple(ids), req.num_prompt_tokens, req.cache_salt, self._model_key(req)))

    def stats(self) -> dict[str, int]:
        """``diag_requests``, ``diag_responses_recorded``, ``diag_drops_recorded`` and
        ``miss_reason_<code>`` per :data:`~.miss_diagnosis.REASONS` code (requests that
        asked, by the reason reported)."""
        d = dict(self.counters, diag_drops_recorded=self.drops.recorded)
        d.update({f"miss_reason_{r}": self.reasons[r] for r in REASONS})
        return d


def diagnostics_request(value: Any, anchors: tuple[tuple[str, str], ...] = (),
                        param: str = "cache_diagnostics") -> DiagnosticsRequest | None:
    """A request's ask -> :class:`DiagnosticsRequest`: ``None``/``False`` (off), ``True``,
    or ``{"compare_to": "<response id>" | None}``.

    Raises:
        ParamError: any other value (names ``param``).
    """
    if value is None or value is False:
        return None
    if value is True:
        return DiagnosticsRequest(anchors=anchors)
    if isinstance(value, dict) and set(value) <= {"compare_to"}:
        ref = value.get("compare_to")
        if ref is None or (isinstance(ref, str) and 0 < len(ref) <= 256):
            return DiagnosticsRequest(ref, anchors)
        raise ParamError(f"{param}.compare_to", "must be a response id (a string of 1 to "
                         "256 characters) or null")
    raise ParamError(param, "must be true, false or {\"compare_to\": \"<response id>\"}")


def message_anchors(messages: list[dict[str, Any]], tools: list | None = None,
                    system: Any = None) -> tuple[tuple[str, str], ...]:
    """Anchors of a chat: ``system`` (a separate system prompt, Anthropic's), the tools'
    names and descriptions (``"tools"``), then each message's text (``"messages[i]"``, or
    ``"messages[i].content[j]"`` per text block); a system message is ``"system"``."""
    out: list[tuple[str, str]] = []
    for j, block in enumerate(_blocks(system)):
        out.append(("system" if j == 0 or not isinstance(system, list)
                    else f"system[{j}]", block))
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        for key in ("name", "description"):
            if isinstance(fn, dict) and isinstance(fn.get(key), str):
                out.append(("tools", fn[key]))
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        label = "system" if isinstance(m, dict) and m.get("role") == "system" \
            else f"messages[{i}]"
        if isinstance(content, str):
            out.append((label, content))
        elif isinstance(content, list):
            for j, text in enumerate(_blocks(content)):
                out.append((f"{label}.content[{j}]", text))
    return tuple(out)


def _blocks(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [b.get("text", "") if isinstance(b, dict) else "" for b in content]
