"""Load a model: a Hugging Face directory (``config.json`` + ``*.safetensors``, single
file or sharded with ``model.safetensors.index.json``, plus tokenizer files), a GGUF file
(or a directory holding one; converted once through ``gguf_cache``), a registered name
(``registry``), a Hugging Face hub id (``hub``: ``Qwen/Qwen3-0.6B``,
``org/repo-GGUF:Q4_K_M``) or ``"builtin:tiny"``.
"""
from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

import prefixcache.model.builtin as builtin
import prefixcache.model.host_memory as host_memory
import prefixcache.model.hub as hub
import prefixcache.model.registry as registry
from prefixcache.config import resolve_dtype
from prefixcache.model.config import ModelConfig
from prefixcache.model.kernels import build as kernels
from prefixcache.model.llama import PagedLlama
from prefixcache.model.weights import check_hf_keys, load_hf_weights
from prefixcache.text.loading import tokenizer_for_model
from prefixcache.text.tokenizer import Tokenizer

BUILTIN_MODELS = ("builtin:tiny",)


@dataclass
class LoadedModel:
    """A model ready to run.

    Attributes:
        model: the network. config: its hyper-parameters.
        tokenizer: or ``None`` when the directory has no tokenizer files.
        model_id: the name the model was loaded by (``"builtin:tiny"`` or the path as
            given), for display and logs.
        chat_template: Jinja source of the chat template, or ``None``.
        path: the model directory (``None`` for builtin models).
        cache_id: the model's part of the prefix-cache hash chain root. For a GGUF file
            it is the conversion cache entry's name (the file's sha256 and our format
            version), so the same weights get the same pages by any name or path and
            other weights under the same name never do; otherwise ``model_id``.
    """

    model: PagedLlama
    config: ModelConfig
    tokenizer: Tokenizer | None
    model_id: str
    chat_template: str | None
    path: Path | None = None
    cache_id: str = ""

    def __post_init__(self) -> None:
        self.cache_id = self.cache_id or self.model_id


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a model directory.

    Raises:
        FileNotFoundError: no safetensors weights, or a shard named by the index is missing.
        ValueError: the index is not valid JSON or lacks ``weight_map``.
    """
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: not a safetensors index with 'weight_map' ({e})") from e
        files = [path / name for name in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"weight shard {f.name} named in {index} not found")
        return files
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        hint = " (only PyTorch .bin weights found; convert them to safetensors)" if any(
            path.glob("*.bin")) else ""
        raise FileNotFoundError(f"no *.safetensors weights in {path}{hint}")
    return files


def load_weights(model: PagedLlama, files: list[Path]) -> None:
    """Fill ``model`` from safetensors ``files``. Raises ValueError naming a missing,
    unexpected or mis-shaped tensor."""
    with ExitStack() as stack:
        owner = {}
        for f in files:
            handle = stack.enter_context(safe_open(str(f), framework="pt", device="cpu"))
            owner.update({key: handle for key in handle.keys()})
        source = str(files[0].parent)
        check_hf_keys(model, set(owner), source)
        load_hf_weights(model, lambda key: owner[key].get_tensor(key))


def load_model(model: str, device: torch.device | str = "cpu",
               dtype: torch.dtype | str = torch.float32,
               revision: str | None = None) -> LoadedModel:
    """Load ``model`` (a directory, a ``.gguf`` file, a registered name such as
    ``"smollm2-135m-instruct-q4_1"``, a hub id such as ``"Qwen/Qwen3-0.6B"`` at
    ``revision``, or ``"builtin:tiny"``) onto ``device`` in ``dtype``
    (a ``torch.dtype``, as ``EngineConfig.torch_dtype`` gives it; a name or alias is
    resolved through the same table, ``prefixcache.config.DTYPES``).

    Raises:
        FileNotFoundError: the directory, ``config.json`` or the weights are missing;
            ``registry.ModelNotInstalledError`` (says how to install) for a registered
            name whose package is missing; ``hub.HubModelError`` (names the id and the
            cache folder) for a hub id not cached while offline.
        ValueError: unknown builtin name, ``revision`` for a model that is not a hub id,
            unsupported architecture (named, with the supported ones)/RoPE/dtype/GGUF tensor
            type, or weights that do not match the config (the message names the file or
            key); on the CPU, ``PREFIXCACHE_CPU_KERNELS`` other than ``0``, ``1``, ``auto``.
    """
    dtype = resolve_dtype(dtype)
    if torch.device(device).type == "cpu":
        host_memory.keep_freed_memory()
        if kernels.enabled():  # raises on a bad PREFIXCACHE_CPU_KERNELS, before serving
            kernels.load()  # built once per machine (about 30 s), not in the first decode step
    if model.startswith("builtin:"):
        if model not in BUILTIN_MODELS:
            raise ValueError(f"unknown builtin model {model!r}; "
                             f"available: {', '.join(BUILTIN_MODELS)}")
        net = builtin.build_tiny_model(device, dtype)
        return LoadedModel(net, net.config, builtin.tiny_tokenizer(), model,
                           builtin.CHAT_TEMPLATE)
    path = _model_path(model, revision)
    config = ModelConfig.from_dir(path)
    files = weight_files(path)
    net = PagedLlama(config, device, dtype)
    load_weights(net, files)
    net.eval()
    net.prepack()
    tokenizer = tokenizer_for_model(path, config.bos_token_id, config.eos_token_ids)
    cache_id = _cache_id(model, path)
    return LoadedModel(net, config, tokenizer, model.rstrip("/") or model,
                       tokenizer.chat_template if tokenizer else None, path, cache_id)


def load_tokenizer(model: str, revision: str | None = None) -> tuple[Tokenizer | None, str]:
    """The tokenizer of ``model`` (as :func:`load_model` gives it, chat template
    included) and its ``cache_id``, without loading the weights: what a router needs to
    compute the engines' page hashes.

    Raises:
        FileNotFoundError / ValueError: as :func:`load_model`.
    """
    if model.startswith("builtin:"):
        if model not in BUILTIN_MODELS:
            raise ValueError(f"unknown builtin model {model!r}; "
                             f"available: {', '.join(BUILTIN_MODELS)}")
        return builtin.tiny_tokenizer(), model
    path = _model_path(model, revision)
    config = ModelConfig.from_dir(path)
    tokenizer = tokenizer_for_model(path, config.bos_token_id, config.eos_token_ids)
    cache_id = _cache_id(model, path)
    return tokenizer, cache_id or (model.rstrip("/") or model)


def _model_path(model: str, revision: str | None) -> Path:
    """The directory to load for ``model``; FileNotFoundError when it does not exist."""
    path = registry.model_dir(model, revision)
    if not path.is_dir():
        raise FileNotFoundError(
            f"model directory not found: {path} (a model is a directory, a .gguf file, a "
            "Hugging Face hub id such as Qwen/Qwen3-0.6B, or builtin:tiny)")
    return path


def _cache_id(model: str, path: Path) -> str:
    """``LoadedModel.cache_id`` of ``model`` loaded from ``path``: a GGUF's conversion
    entry, a hub snapshot's repository and commit (``hf:org/name@<commit>``: another
    revision is other weights), else ``""`` (the model string)."""
    if registry.is_converted(path):
        return f"gguf:{path.name}"
    hub_id = hub.parse_hub_id(model)
    if hub_id is not None and path.parent.name == "snapshots":
        return f"hf:{hub_id.repo_id}@{path.name}"
    return ""
