"""The optional config files of a Hugging Face tokenizer folder, read without
transformers: ``tokenizer_config.json`` (chat template, special-token strings),
``special_tokens_map.json``, ``chat_template.jinja``, ``generation_config.json``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TEMPLATE_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file as a dict; ``{}`` when it is absent, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_text(v: object) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def folder_chat_template(folder: Path) -> str | None:
    """``tokenizer_config.json``'s ``chat_template`` (a string, or the ``default`` of a
    list of named templates, else the first), else ``chat_template.jinja``, else ``None``."""
    template = read_json(folder / "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    jinja = folder / "chat_template.jinja"
    if not template and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    return template if isinstance(template, str) else None


def folder_template_tokens(folder: Path) -> dict[str, str]:
    """``{"bos_token": "<s>", ...}``: the special-token strings a chat template may use,
    from ``tokenizer_config.json``, else ``special_tokens_map.json``."""
    cfg = read_json(folder / "tokenizer_config.json")
    specials = read_json(folder / "special_tokens_map.json")
    out = {}
    for key in TEMPLATE_TOKEN_KEYS:
        text = _token_text(cfg.get(key)) or _token_text(specials.get(key))
        if text:
            out[key] = text
    return out


def generation_eos_ids(folder: Path) -> set[int]:
    """``generation_config.json``'s ``eos_token_id`` (one id or a list) as a set."""
    eos = read_json(folder / "generation_config.json").get("eos_token_id")
    if isinstance(eos, list):
        return {int(i) for i in eos}
    return {int(eos)} if isinstance(eos, int) else set()
