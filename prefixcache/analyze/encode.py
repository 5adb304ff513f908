"""Requests to token ids: render (:mod:`.render`), then tokenize.

With the builtin renderer each segment (one message) is tokenized once and reused by
every later request that repeats it, so an agent loop costs linear, not quadratic,
tokenizer time. That is exact when the tokenizer splits its input where a segment
starts: always when ``<|im_start|>`` is a special token (Qwen2, ``approx``, ``bytes``),
and for byte-level BPE pre-tokenizers (GPT-2), which split ``"\n"`` from ``"<|"``.
It is verified on the first requests (joined segments tokenized whole must give the
same ids); a tokenizer that fails the check gets each whole prompt tokenized instead.

The recorded response is tokenized on its own, as generated tokens appended after the
prompt, the way the engine publishes decode pages (whether they are published is the
replay's choice; they also count as output tokens for pricing).
"""
from __future__ import annotations

from dataclasses import dataclass

from prefixcache.analyze.records import Request, TokenizedRequest
from prefixcache.analyze.render import (
    TemplateRenderer,
    builtin_response,
    builtin_segments,
    message_ends,
)
from prefixcache.text.chat_template import ChatTemplateError
from prefixcache.text.tokenizer import Tokenizer

TEMPLATE_MODES = ("auto", "builtin", "tokenizer")
_CHECKED_REQUESTS = 3


@dataclass
class EncodeInfo:
    tokenizer: str
    renderer: str  # "builtin-chatml" | "tokenizer-template" | "none" (no chat requests)
    note: str | None = None
    segment_cache: bool = False

    def as_dict(self) -> dict:
        return {"tokenizer": self.tokenizer, "renderer": self.renderer, "note": self.note,
                "segment_cache": self.segment_cache}


class _SegmentEncoder:
    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.cache: dict[str, list[int]] = {}
        self.exact = True  # until a check below fails
        self.checked = 0

    def encode(self, segs: list[str]) -> tuple[list[int], list[int]]:
        """Token ids of the joined segments, and the token offset after each one."""
        if not self.exact:
            ids = self.tok.encode("".join(segs), add_special_tokens=False)
            return ids, self._ends_by_text(segs, ids)
        new = [s for s in dict.fromkeys(segs) if s not in self.cache]
        if new:
            encoded = self.tok.encode_batch(new, add_special_tokens=False)
            self.cache.update(zip(new, encoded))
        ids = []
        ends = []
        for s in segs:
            ids.extend(self.cache[s])
            ends.append(len(ids))
        if self.checked < _CHECKED_REQUESTS and len(segs) > 1:
            self.checked += 1
            whole = self.tok.encode("".join(segs), add_special_tokens=False)
            if whole != ids:
                self.exact = False
                return whole, self._ends_by_text(segs, whole)
        return ids, ends

    def _ends_by_text(self, segs: list[str], ids: list[int]) -> list[int]:
        text = "".join(segs)
        _, offsets = self.tok.encode_offsets(text, add_special_tokens=False)
        return _char_to_token_ends(offsets, _cumulative([len(s) for s in segs]))


def _cumulative(xs: list[int]) -> list[int]:
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out


def _char_to_token_ends(offsets: list[tuple[int, int]], char_ends: list[int]) -> list[int]:
    """For each char offset, the number of tokens that end at or before it."""
    out, t = [], 0
    for c in char_ends:
        while t < len(offsets) and offsets[t][1] <= c:
            t += 1
        out.append(t)
    return out


def _template_prompts(requests: list[Request], renderer: TemplateRenderer,
                      strict: bool) -> tuple[list[str | None], list[list[int] | None], str | None]:
    texts: list[str | None] = []
    ends: list[list[int] | None] = []
    for r in requests:
        if r.messages is None:
            texts.append(None)
            ends.append(None)
            continue
        try:
            text = renderer.render(r.messages, r.tools, True)
        except ChatTemplateError as exc:
            if strict:
                raise
            return [], [], f"the tokenizer's chat template failed on {r.request_id}: {exc}"
        found = message_ends(text, r.messages, r.tools)
        if found is None and not strict:
            return [], [], (f"the tokenizer's chat template drops content of "
                            f"{r.request_id} (e.g. tool messages or tool calls)")
        texts.append(text)
        ends.append(found)
    return texts, ends, None


def encode_requests(requests: list[Request], tokenizer: Tokenizer, template: str = "auto",
                    responses: bool = True) -> tuple[list[TokenizedRequest], EncodeInfo]:
    """Render and tokenize every request.

    Args:
        template: ``auto`` (the tokenizer's chat template when it has one that renders
            every request completely, else builtin), ``builtin`` or ``tokenizer``.
        responses: tokenize recorded responses too.

    Raises:
        ValueError: unknown ``template``, or ``tokenizer`` without a chat template.
        ChatTemplateError: ``template="tokenizer"`` and the template fails on a request.
    """
    if template not in TEMPLATE_MODES:
        raise ValueError(f"template must be one of {TEMPLATE_MODES}, got {template!r}")
    name = tokenizer.name or type(tokenizer).__name__
    has_chat = any(r.messages is not None for r in requests)
    info = EncodeInfo(tokenizer=name, renderer="builtin-chatml" if has_chat else "none")
    texts: list[str | None] = []
    char_ends: list[list[int] | None] = []
    tmpl = tokenizer.chat_template
    if template == "tokenizer" and not tmpl:
        raise ValueError(f"tokenizer {name!r} has no chat template")
    renderer = None
    if has_chat and tmpl and template in ("auto", "tokenizer"):
        renderer = TemplateRenderer(tokenizer)
        texts, char_ends, why = _template_prompts(requests, renderer, template == "tokenizer")
        if why:
            renderer, info.note = None, why + "; using the builtin ChatML rendering"
        else:
            info.renderer = "tokenizer-template"
    seg = _SegmentEncoder(tokenizer)
    out = []
    for i, r in enumerate(requests):
        resp_text = None
        tr = TokenizedRequest(request=r, prompt_ids=[])
        if r.messages is None:  # completions
            if isinstance(r.prompt, list):
                tr.prompt_ids = list(r.prompt)
            else:
                tr.prompt_text = r.prompt or ""
                tr.prompt_ids = tokenizer.encode(tr.prompt_text, add_special_tokens=False)
                tr.char_ends = [len(tr.prompt_text)]
            tr.boundaries, tr.boundary_roles = [len(tr.prompt_ids)], ["prompt"]
            if r.response is not None:
                resp_text = r.response if isinstance(r.response, str) else \
                    (r.response.get("content") or "")
        elif renderer is not None:
            text = texts[i]
            assert text is not None  # the renderer rendered every chat request
            tr.prompt_text = text
            tr.prompt_ids, offsets = tokenizer.encode_offsets(text, add_special_tokens=False)
            tr.char_ends = char_ends[i] or []
            tr.boundaries = _char_to_token_ends(offsets, tr.char_ends)
            tr.boundary_roles = [m["role"] for m in r.messages][:len(tr.boundaries)]
            if r.response is not None:
                resp_text = renderer.response_text(r.messages, r.tools, text, r.response)
        else:
            segs = builtin_segments(r.messages, r.tools)
            ids, ends = seg.encode(segs)
            tr.prompt_ids = ids
            tr.segmented = seg.exact
            tr.boundaries = ends[:-1]  # not the generation prompt
            tr.boundary_roles = (["tools"] if r.tools else []) + [m["role"] for m in r.messages]
            tr.char_ends = _cumulative([len(s) for s in segs])[:-1]
            tr.prompt_text = "".join(segs)
            if r.response is not None:
                resp_text = builtin_response(r.response)
        if responses and resp_text:
            tr.response_ids = tokenizer.encode(resp_text, add_special_tokens=False)
        out.append(tr)
    info.segment_cache = renderer is None and has_chat and seg.exact
    return out, info
