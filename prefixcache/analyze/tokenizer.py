"""Choosing and loading the tokenizer (``--tokenizer``), offline.

=====================  ===============================================================
``--tokenizer``        tokenizer
=====================  ===============================================================
(absent), ``approx``   :class:`~.simple_tokenizers.ApproxTokenizer`: no file needed,
                       counts close to a BPE tokenizer's, ids not a real model's
``bytes``              one token per UTF-8 byte
``qwen2``, ``gpt2``    the shared tokenizers, ``$PREFIXCACHE_DATA/tokenizers/NAME`` or
                       ``<repo>/../shared/data/tokenizers/NAME``
``FILE.json``          a Hugging Face ``tokenizer.json``
``DIR``                a Hugging Face tokenizer folder: ``tokenizer.json``, or
                       ``vocab.json`` + ``merges.txt`` (byte-level BPE; the Qwen2
                       pre-tokenizer when ``tokenizer_config.json`` names a Qwen2
                       tokenizer, else GPT-2's), or anything ``AutoTokenizer`` loads
                       with ``local_files_only=True``
=====================  ===============================================================

A folder's chat template (``tokenizer_config.json`` ``chat_template``, or
``chat_template.jinja``) is kept for rendering (:mod:`.render`). Nothing is downloaded.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from prefixcache.analyze.simple_tokenizers import (QWEN2_PATTERN, ApproxTokenizer,
                                                   ByteTokenizer, Offsets)

SHARED_ALIASES = ("qwen2", "gpt2")
REPO_ROOT = Path(__file__).resolve().parents[2]


class TokenizerError(ValueError):
    """The tokenizer cannot be found or loaded."""


def data_root() -> Path:
    """The shared data folder: ``$PREFIXCACHE_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("PREFIXCACHE_DATA")
    return Path(env) if env else (REPO_ROOT.parent / "shared" / "data").resolve()


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_text(v: object) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer``, encoding without added BOS/EOS (a
    rendered chat template already holds them, as ``apply_chat_template`` does)."""

    def __init__(self, tok, name: str, folder: Path | None = None):
        self._tok = tok
        self.name = name
        self.folder = folder
        cfg = _read_json(folder / "tokenizer_config.json") if folder else {}
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            named = {t.get("name"): t.get("template") for t in template
                     if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja = folder / "chat_template.jinja" if folder else None
        if not template and jinja and jinja.exists():
            template = jinja.read_text(encoding="utf-8")
        self.chat_template: str | None = template if isinstance(template, str) else None
        specials = _read_json(folder / "special_tokens_map.json") if folder else {}
        self.template_vars = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            text = _token_text(cfg.get(key)) or _token_text(specials.get(key))
            if text:
                self.template_vars[key] = text
        self.special_tokens = tuple(t.content for t in tok.get_added_tokens_decoder()
                                    .values() if t.special)

    def encode_offsets(self, text: str) -> tuple[list[int], Offsets]:
        enc = self._tok.encode(text, add_special_tokens=False)
        return list(enc.ids), list(enc.offsets)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def _bpe_from_vocab(folder: Path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    cfg = _read_json(folder / "tokenizer_config.json")
    tok = Tokenizer(BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    if str(cfg.get("tokenizer_class", "")).startswith("Qwen2"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    added: dict[int, AddedToken] = {}
    for tid, spec in (cfg.get("added_tokens_decoder") or {}).items():
        if isinstance(spec, dict) and "content" in spec:
            added[int(tid)] = AddedToken(spec["content"], special=spec.get("special", True),
                                         normalized=spec.get("normalized", False))
    for text, tid in _read_json(folder / "added_tokens.json").items():
        added.setdefault(int(tid), AddedToken(text, special=True, normalized=False))
    if added:
        tok.add_special_tokens([added[i] for i in sorted(added)])
        got = {t: i for i, t in ((i, a.content) for i, a in added.items())}
        for text, tid in got.items():
            if tok.token_to_id(text) != tid:
                raise TokenizerError(f"{folder}: added token {text!r} should be id {tid}")
    return tok


class TransformersTokenizer(HFTokenizer):
    """Anything else ``AutoTokenizer`` loads offline (e.g. SentencePiece models)."""

    def __init__(self, folder: Path):
        from transformers import AutoTokenizer

        self._hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.name = folder.name
        self.folder = folder
        self.chat_template = getattr(self._hf, "chat_template", None)
        self.template_vars = {k: v for k, v in self._hf.special_tokens_map.items()
                              if isinstance(v, str)}
        self.special_tokens = tuple(self._hf.all_special_tokens)

    def encode_offsets(self, text: str) -> tuple[list[int], Offsets]:
        try:
            enc = self._hf(text, add_special_tokens=False, return_offsets_mapping=True)
            return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        except (NotImplementedError, ValueError):  # slow tokenizer: no offsets
            ids = self.encode(text)
            return ids, [(0, 0)] * len(ids)

    def encode(self, text: str) -> list[int]:
        return list(self._hf.encode(text, add_special_tokens=False))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: list[int]) -> str:
        return self._hf.decode(ids)


def resolve_tokenizer_path(spec: str) -> Path | None:
    """The file or folder a ``--tokenizer`` value names (``None`` for the built-ins)."""
    if spec in ("approx", "bytes"):
        return None
    path = Path(spec).expanduser()
    if not path.exists() and spec in SHARED_ALIASES:
        path = data_root() / "tokenizers" / spec
        if not path.exists():
            raise TokenizerError(
                f"tokenizer {spec!r}: {path} not found (set PREFIXCACHE_DATA to the "
                "shared data folder, or pass a tokenizer path)")
    if not path.exists():
        raise TokenizerError(f"tokenizer {spec!r}: no such file or folder "
                             f"(built-ins: approx, bytes; shared: {', '.join(SHARED_ALIASES)})")
    return path


def load_tokenizer(spec: str | None = None):
    """Load a tokenizer from a ``--tokenizer`` value (see the module docstring).

    Raises:
        TokenizerError: not found, or not a tokenizer this reader can load offline.
    """
    spec = spec or "approx"
    if spec == "approx":
        return ApproxTokenizer()
    if spec == "bytes":
        return ByteTokenizer()
    path = resolve_tokenizer_path(spec)
    assert path is not None
    from tokenizers import Tokenizer

    try:
        if path.is_file():
            return HFTokenizer(Tokenizer.from_file(str(path)), path.parent.name, path.parent)
        if (path / "tokenizer.json").exists():
            return HFTokenizer(Tokenizer.from_file(str(path / "tokenizer.json")), path.name,
                               path)
        if (path / "vocab.json").exists() and (path / "merges.txt").exists():
            return HFTokenizer(_bpe_from_vocab(path), path.name, path)
        return TransformersTokenizer(path)
    except TokenizerError:
        raise
    except Exception as exc:  # tokenizers/transformers raise many kinds
        raise TokenizerError(f"cannot load tokenizer from {path}: {exc}") from None
