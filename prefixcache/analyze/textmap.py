"""From token positions back to the prompt text (for showing where a prompt breaks)."""
from __future__ import annotations

from bisect import bisect_right

from prefixcache.analyze.records import TokenizedRequest
from prefixcache.text.tokenizer import Tokenizer

CONTEXT_CHARS = 40


def char_offset(tokenizer: Tokenizer, tr: TokenizedRequest, token_index: int) -> int | None:
    """Character offset in ``tr.prompt_text`` where token ``token_index`` starts
    (``len(text)`` at the end); ``None`` when the prompt has no text (token ids).

    Segmented prompts re-tokenize only the segment holding the token.
    """
    text = tr.prompt_text
    if text is None:
        return None
    if token_index >= len(tr.prompt_ids):
        return len(text)
    t0, c0, c1 = 0, 0, len(text)
    if tr.segmented and tr.boundaries:
        s = bisect_right(tr.boundaries, token_index)
        if s > 0:
            t0, c0 = tr.boundaries[s - 1], tr.char_ends[s - 1]
        if s < len(tr.char_ends):
            c1 = tr.char_ends[s]
    _, offsets = tokenizer.encode_offsets(text[c0:c1], add_special_tokens=False)
    k = token_index - t0
    if k >= len(offsets):
        return c1
    return c0 + offsets[k][0]


def around(text: str, at: int, width: int = CONTEXT_CHARS) -> str:
    """``width`` characters either side of ``at``, the split marked with ``⟦``."""
    lo, hi = max(0, at - width), min(len(text), at + width)
    return (("…" if lo > 0 else "") + text[lo:at] + "⟦" + text[at:hi]
            + ("…" if hi < len(text) else ""))


def prompt_context(tokenizer: Tokenizer, tr: TokenizedRequest, token_index: int,
                   width: int = CONTEXT_CHARS) -> tuple[int | None, str]:
    """The char offset of a token and the text around it (decoded ids when the prompt
    has no text)."""
    c = char_offset(tokenizer, tr, token_index)
    if c is None:  # token-id prompt: decoded text, or the ids if they do not decode
        ids = tr.prompt_ids
        head, tail = ids[max(0, token_index - 12):token_index], ids[token_index:token_index + 12]
        before = tokenizer.decode(head, skip_special_tokens=False)
        after = tokenizer.decode(tail, skip_special_tokens=False)
        if "\ufffd" in before + after:
            before = " ".join(map(str, head[-6:])) + " "
            after = " ".join(map(str, tail[:6]))
        return None, before[-width:] + "⟦" + after[:width]
    assert tr.prompt_text is not None  # char_offset found an offset in it
    return c, around(tr.prompt_text, c, width)
