"""Hugging Face hub ids (``Qwen/Qwen3-0.6B``) resolved to a local directory or GGUF file
through ``huggingface_hub``.

A model string is a hub id when it is not an existing local path and reads
``org/name`` with an optional ``:selector``. The selector picks a GGUF file inside the
repository, as llama.cpp and ollama accept it: a file name (``model-Q4_K_M.gguf``) or a
quantization tag (``Q4_K_M``, matched case-insensitively against the ``.gguf`` names).

Order: the local hub cache first (no network); then, unless offline
(``HF_HUB_OFFLINE``), a download with ``huggingface_hub``'s progress bar. The cache folder
is ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``, read once per
load (:func:`hub_cache_dir`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# org/name as the hub spells repository ids, then an optional :selector
_HUB_ID = re.compile(r"^([A-Za-z0-9][\w.-]*/[\w.-]+)(?::([\w.-]+))?$")
# files a safetensors model directory needs (weights, config, tokenizer, template)
_DIR_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken"]
_TRUE = ("1", "true", "yes", "on")


class HubModelError(FileNotFoundError):
    """A hub id that cannot be resolved; the message names the id and the cache folder."""


@dataclass(frozen=True)
class HubId:
    """A parsed hub model string.

    Attributes:
        repo_id: ``org/name``. selector: a GGUF file name or quantization tag, or ``None``.
    """

    repo_id: str
    selector: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f":{self.selector}" if self.selector else "")


def parse_hub_id(model: str) -> HubId | None:
    """The hub id ``model`` spells, or ``None`` (a local path, or not of the form
    ``org/name[:selector]``). A string naming an existing file or directory is a path."""
    if Path(model).expanduser().exists() or model.startswith((".", "/", "~")):
        return None
    m = _HUB_ID.match(model)
    if m is None or m.group(1).count("/") != 1:
        return None
    return HubId(m.group(1), m.group(2))


def hub_cache_dir() -> Path:
    """The hub cache folder: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub`` (``$XDG_CACHE_HOME`` respected, as the hub does)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids downloads."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def resolve_hub_id(hub_id: HubId, revision: str | None = None) -> Path:
    """The local snapshot directory of ``hub_id`` (a safetensors model), or the GGUF file
    its selector picks (or the repository's only GGUF file when it has no
    ``config.json``), downloading when not cached and online.

    Args:
        revision: a branch, tag or commit hash; ``None`` is ``main``.

    Raises:
        HubModelError: not cached while offline, not found on the hub, or no GGUF file
            matches the selector (the message names the id, the revision and the cache
            folder, and lists the GGUF files when the selector matches none or several).
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache = hub_cache_dir()
    where = f"{hub_id}" + (f" (revision {revision})" if revision else "")
    patterns = _patterns(hub_id.selector)
    try:
        snap = Path(snapshot_download(hub_id.repo_id, revision=revision, cache_dir=cache,
                                      local_files_only=True))
        found = _pick(snap, hub_id)
        if found is not None:
            return found
        if hub_offline():
            raise HubModelError(f"model {where}: the cached snapshot {snap} holds no "
                                f"{_wanted(hub_id)} and HF_HUB_OFFLINE is set")
    except LocalEntryNotFoundError:
        if hub_offline():
            raise HubModelError(
                f"model {where} is not in the Hugging Face cache {cache} and HF_HUB_OFFLINE "
                "is set; download it while online (hf download "
                f"{hub_id.repo_id}) or point HF_HUB_CACHE/HF_HOME at a cache holding it"
            ) from None
    try:
        snap = Path(snapshot_download(hub_id.repo_id, revision=revision, cache_dir=cache,
                                      allow_patterns=patterns))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        raise HubModelError(f"model {where} is no local path and not in the Hugging Face "
                            f"cache {cache}; downloading it failed: {e}") from e
    found = _pick(snap, hub_id)
    if found is None:
        raise HubModelError(f"model {where}: the repository holds no {_wanted(hub_id)}")
    return found


def _wanted(hub_id: HubId) -> str:
    return (f"GGUF file matching {hub_id.selector!r}" if hub_id.selector
            else "config.json or GGUF file")


def _patterns(selector: str | None) -> list[str] | None:
    """Download filters: a selector fetches only its GGUF file(s); no selector, the files
    of a model directory and any GGUF (a repository usually holds one or the other)."""
    if selector is None:
        return [*_DIR_PATTERNS, "*.gguf"]
    if selector.lower().endswith(".gguf"):
        return [selector, f"*/{selector}"]
    return [f"*{v}*.gguf" for v in {selector, selector.upper(), selector.lower()}]


def _pick(snap: Path, hub_id: HubId) -> Path | None:
    """The snapshot directory (no selector, ``config.json`` present), or the GGUF file
    the selector picks; ``None`` when the snapshot lacks it.

    Raises:
        HubModelError: several GGUF files match (listed), or several and no selector.
    """
    ggufs = sorted(p for p in snap.rglob("*.gguf") if p.is_file())
    if hub_id.selector is None:
        if (snap / "config.json").is_file():
            return snap
        if len(ggufs) > 1:
            raise HubModelError(
                f"model {hub_id}: the repository holds several GGUF files "
                f"({', '.join(p.name for p in ggufs)}); name one as {hub_id.repo_id}:FILE "
                f"or {hub_id.repo_id}:QUANT (e.g. Q4_K_M)")
        return ggufs[0] if ggufs else None
    sel = hub_id.selector.lower()
    if sel.endswith(".gguf"):
        matches = [p for p in ggufs if p.name.lower() == sel]
    else:
        matches = [p for p in ggufs if _has_tag(p.name.lower(), sel)]
    if len(matches) > 1:
        raise HubModelError(f"model {hub_id}: several GGUF files match "
                            f"({', '.join(p.name for p in matches)}); name the file")
    return matches[0] if matches else None


def _has_tag(name: str, tag: str) -> bool:
    """Whether a GGUF file name carries quantization ``tag`` as a whole word
    (``q4_k`` does not match ``q4_k_m``)."""
    return re.search(rf"(^|[^a-z0-9_]){re.escape(tag)}([^a-z0-9_]|$)", name) is not None
