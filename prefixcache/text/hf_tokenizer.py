"""A transformers tokenizer (``AutoTokenizer``), loaded offline from a folder.

For model folders (``tokenizer_config.json``), and folders only transformers can read
(``vocab.json`` + ``merges.txt``, SentencePiece models): it applies the folder's own
settings (BOS, normalizers) and renders chat templates with ``apply_chat_template``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from prefixcache.text import tool_prompt
from prefixcache.text.chat_template import ChatTemplateError
from prefixcache.text.tokenizer import Offsets, Tokenizer

_SENTENCEPIECE_SPACE = "\u2581"


class HFTokenizer(Tokenizer):
    """``transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)``.

    Args:
        path: the tokenizer folder.
        extra_eos_ids: ids that also end generation (``config.json``,
            ``generation_config.json``).

    Raises (constructor): OSError/ValueError from transformers if the files are unreadable.
    """

    def __init__(self, path: str | Path, extra_eos_ids: set[int] | frozenset[int] = frozenset()):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.name = Path(path).name
        self.bos_token_id = self._tok.bos_token_id
        eos = self._tok.eos_token_id
        self.eos_token_ids = set(extra_eos_ids) | ({eos} if eos is not None else set())
        template = getattr(self._tok, "chat_template", None)
        self.chat_template = template if isinstance(template, str) else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def encode_offsets(self, text: str,
                       add_special_tokens: bool = True) -> tuple[list[int], Offsets]:
        try:
            enc = self._tok(text, add_special_tokens=add_special_tokens,
                            return_offsets_mapping=True)
        except (NotImplementedError, ValueError):  # a slow tokenizer has no offsets
            ids = self.encode(text, add_special_tokens)
            return ids, [(0, 0)] * len(ids)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def encode_batch(self, texts: list[str],
                     add_special_tokens: bool = True) -> list[list[int]]:
        if not texts:
            return []
        return [list(ids) for ids in
                self._tok(texts, add_special_tokens=add_special_tokens)["input_ids"]]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text if isinstance(text, str) else "".join(text)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @property
    def backend(self) -> Any:
        """The transformers tokenizer itself (the grammar engine reads its vocabulary)."""
        return self._tok

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(set(self._tok.all_special_ids))

    @property
    def template_vars(self) -> dict[str, str]:
        return {k: v for k, v in self._tok.special_tokens_map.items() if isinstance(v, str)}

    def decode_token(self, token_id: int) -> str:
        text = self.decode([token_id], skip_special_tokens=False)
        piece = self._tok.convert_ids_to_tokens(token_id)
        # SentencePiece pieces start with U+2581 for a space that decode() strips.
        if isinstance(piece, str) and piece.startswith(_SENTENCEPIECE_SPACE) \
                and not text.startswith(" "):
            text = " " + text
        return text

    def render_chat(self, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template; send a plain prompt")
        def render(msgs: list[dict[str, Any]], schemas: Any) -> str:
            try:
                text = self._tok.apply_chat_template(
                    msgs, tools=cast(Any, schemas), tokenize=False,
                    add_generation_prompt=add_generation_prompt)
            except Exception as e:  # noqa: BLE001  (jinja raises anything; raise_exception())
                raise ChatTemplateError(f"chat template error: {e}") from None
            assert isinstance(text, str)  # tokenize=False
            return text
        return tool_prompt.render_with_fallback(self.chat_template, messages, tools, render)
