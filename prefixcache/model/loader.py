"""Load a model: a Hugging Face directory (``config.json`` + ``*.safetensors``, single
file or sharded with ``model.safetensors.index.json``, plus tokenizer files), a GGUF file
(or a directory holding one; its config and tokenizer converted once through
``gguf_cache``, its quantized matrices read from the file itself), a registered name
(``registry``), a Hugging Face hub id (``hub``: ``Qwen/Qwen3-0.6B``,
``org/repo-GGUF:Q4_K_M``) or ``"builtin:tiny"``.
"""
from __future__ import annotations

import json
import logging
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

import prefixcache.model.builtin as builtin
import prefixcache.model.gguf as gguf
import prefixcache.model.gguf_cache as gguf_cache
import prefixcache.model.gguf_quant as gguf_quant
import prefixcache.model.hub as hub
import prefixcache.model.quantize as quantize
import prefixcache.model.registry as registry
from prefixcache.config import COMPUTE_BACKENDS, resolve_dtype
from prefixcache.model.backend import ComputeBackend, TorchBackend
from prefixcache.model.config import ModelConfig
from prefixcache.model.cpu import host_memory
from prefixcache.model.cpu.backend import CpuKernelBackend
from prefixcache.model.cpu.kernels import build as kernels
from prefixcache.model.llama import PagedLlama
from prefixcache.model.quantized_linear import AffineCodes
from prefixcache.model.weights import check_hf_keys, load_hf_weights
from prefixcache.progress import phase
from prefixcache.text.loading import tokenizer_for_model
from prefixcache.text.tokenizer import Tokenizer

BUILTIN_MODELS = ("builtin:tiny",)
CPU_KERNELS_ENV = "PREFIXCACHE_CPU_KERNELS"  # what ``auto`` means on a CPU: 0, 1 or auto

log = logging.getLogger(__name__)


def make_backend(name: str, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> ComputeBackend:
    """The compute backend ``name`` (one of :data:`prefixcache.config.COMPUTE_BACKENDS`)
    for a model on ``device`` in ``dtype``; called once per model, at load.

    * ``torch``: :class:`TorchBackend`, plain torch ops (any device).
    * ``cpu``: :class:`CpuKernelBackend` without the C++ kernels (oneDNN-prepacked
      linears, the prefix split, huge pages).
    * ``cpu-kernels``: :class:`CpuKernelBackend` with the C++ kernels, on any CPU (built
      here, once per machine; a failed build is logged and runs as ``cpu``).
    * ``auto``: ``torch`` off the CPU; on the CPU, ``cpu-kernels`` where the CPU has
      AVX-512F (the kernels' tiles are sized for it; on AVX2 they were slower than torch
      ops), else ``cpu``. ``$PREFIXCACHE_CPU_KERNELS`` (``1``: kernels on any CPU, ``0``:
      never, ``auto``) overrides that choice; it is read here, once.

    Raises:
        ValueError: an unknown ``name``, a CPU backend for another device, or a bad
            ``$PREFIXCACHE_CPU_KERNELS`` (the message names it).
    """
    dev = torch.device(device)
    if name not in COMPUTE_BACKENDS:
        raise ValueError(f"compute_backend: must be one of {', '.join(COMPUTE_BACKENDS)}, "
                         f"got {name!r}")
    if name == "auto":
        if dev.type != "cpu":
            return TorchBackend()
        raw = os.environ.get(CPU_KERNELS_ENV)
        mode = (raw or "auto").strip().lower() or "auto"
        if mode not in ("0", "1", "auto"):
            raise ValueError(f"{CPU_KERNELS_ENV} must be one of 0, 1, auto, not {raw!r}")
        use = kernels.isa_supported() if mode == "auto" else mode == "1"
        if mode == "auto" and not use:
            log.info("CPU kernels off: this CPU has no AVX-512F, where they run slower than "
                     "torch ops (--compute-backend cpu-kernels forces them)")
        name = "cpu-kernels" if use else "cpu"
    if name == "torch":
        return TorchBackend()
    if dev.type != "cpu":
        raise ValueError(f"compute_backend: {name!r} runs on the CPU only, not on {dev}")
    return CpuKernelBackend(dtype, kernels=name == "cpu-kernels")


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


def load_weights(model: PagedLlama, files: list[Path], bits: int | None = None) -> int:
    """Fill ``model`` from safetensors ``files``; with ``bits``, its projections and
    ``lm_head`` become ``bits``-wide codes (:func:`quantize.apply`, min/max per 32
    columns), read and quantized one matrix at a time (build ``model`` with
    ``float_linears=False``: no float copy of them is ever held). Returns the bytes the
    quantized layers hold (0 without ``bits``).

    Raises:
        ValueError: naming a missing, unexpected or mis-shaped tensor.
    """
    with ExitStack() as stack:
        owner = {}
        for f in files:
            handle = stack.enter_context(safe_open(str(f), framework="pt", device="cpu"))
            owner.update({key: handle for key in handle.keys()})
        source = str(files[0].parent)
        check_hf_keys(model, set(owner), source)

        def get(key: str) -> torch.Tensor:
            return owner[key].get_tensor(key)

        if bits is None:
            load_hf_weights(model, get)
            return 0
        matrices = quantize.matrix_names(model) - {"model.embed_tokens.weight"}
        load_hf_weights(model, get, skip=lambda key: key in matrices)
        return quantize.apply(model, lambda key: AffineCodes.from_float(get(key), bits))


def load_gguf_quantized(model: PagedLlama, gguf_file: Path, entry: Path) -> int:
    """Fill ``model`` (built with ``float_linears=False``) from a GGUF file, its matrices
    kept in the file's layout (:mod:`prefixcache.model.gguf_quant`, via
    :func:`quantize.apply`), read from the memory-mapped file one matrix at a time, the
    other tensors (norms, biases) dequantized; ``entry`` is the file's conversion cache
    entry (its tensor index and config). On the CPU the token embedding is kept as codes
    too (``PagedLlama.embed_codes``). No float copy of a matrix is written or held.
    Returns the bytes the quantized layers hold.

    Raises:
        ValueError: a missing, unexpected or mis-shaped tensor (named).
    """
    index = gguf_cache.tensor_index(entry)
    config = json.loads((entry / "config.json").read_text())
    src = gguf_quant.GGUFWeights(gguf.mapped_tensors(gguf_file, index),
                                 index["architecture"], config)
    check_hf_keys(model, src.names, str(gguf_file))
    load_hf_weights(model, src.float, skip=lambda key: key in src.matrices)
    total = quantize.apply(model, src.codes)
    embed = "model.embed_tokens.weight"
    if model.device.type == "cpu":  # the embedding as codes too: rows read per token
        model.embed_codes = src.codes(embed)
        model.embed.data = torch.empty(0, dtype=model.dtype)
    else:
        model.embed.copy_(src.codes(embed).dequantize())
    return total


def weights_layout(model: str, quantization: str, revision: str | None = None) -> str:
    """How ``model``'s linear weights are held under ``quantization``
    (:data:`quantize.MODES`): ``"float"``, ``"gguf"`` (a GGUF file's own layout, when
    ``auto`` and the file has quantized matrices; an F32/F16/BF16 file stays float),
    ``"int4"`` or ``"int8"``. Part of the model's ``cache_id`` when not ``"float"``: other
    weights give other KV.

    Raises:
        ValueError: an unknown ``quantization`` (named).
    """
    quantize.check_mode(quantization)
    if quantization in quantize.BITS:
        return quantization
    if quantization != "auto" or model.startswith("builtin:"):
        return "float"
    gguf_file = gguf_cache.find_gguf(registry.resolve(model, revision))
    return "gguf" if gguf_file is not None and gguf_cache.is_quantized(gguf_file) else "float"


def load_model(model: str, device: torch.device | str = "cpu",
               dtype: torch.dtype | str = torch.float32,
               quantization: str = "auto",
               compute_backend: str | ComputeBackend = "auto",
               revision: str | None = None) -> LoadedModel:
    """Load ``model`` (a directory, a ``.gguf`` file, a registered name such as
    ``"smollm2-135m-instruct-q4_1"``, a hub id such as ``"Qwen/Qwen3-0.6B"`` at
    ``revision``, or ``"builtin:tiny"``) onto ``device`` in ``dtype``
    (a ``torch.dtype``, as ``EngineConfig.torch_dtype`` gives it; a name or alias is
    resolved through the same table, ``prefixcache.config.DTYPES``), its linear layers
    as ``quantization`` says (:mod:`prefixcache.model.quantize`: ``auto`` keeps a GGUF
    file's quantized layout, ``none``, ``int4``, ``int8``), running on the
    compute backend ``compute_backend``: a name (:func:`make_backend`, chosen here once) or
    a backend built already (A/B benchmarks).

    Raises:
        FileNotFoundError: the directory, ``config.json`` or the weights are missing;
            ``registry.ModelNotInstalledError`` (says how to install) for a registered
            name whose package is missing; ``hub.HubModelError`` (names the id and the
            cache folder) for a hub id not cached while offline.
        ValueError: unknown builtin name, ``revision`` for a model that is not a hub id,
            unsupported architecture (named, with the supported ones)/RoPE/dtype/GGUF tensor
            type, or weights that do not match the config (the message names the file or
            key); a bad ``compute_backend`` (see :func:`make_backend`); an unknown
            ``quantization``.
    """
    dtype = resolve_dtype(dtype)
    layout = weights_layout(model, quantization, revision)
    with phase("kernels and compute backend") as note:
        backend = (compute_backend if isinstance(compute_backend, ComputeBackend)
                   else make_backend(compute_backend, device, dtype))  # builds CPU kernels
        note["detail"] = type(backend).__name__
    if torch.device(device).type == "cpu":
        host_memory.keep_freed_memory()
    if model.startswith("builtin:"):
        if model not in BUILTIN_MODELS:
            raise ValueError(f"unknown builtin model {model!r}; "
                             f"available: {', '.join(BUILTIN_MODELS)}")
        with phase("weights") as note:
            net = builtin.build_tiny_model(device, dtype, backend)
            if layout in quantize.BITS:
                quantize.from_float(net, quantize.BITS[layout])
            net.prepack()
            note["detail"] = f"{model}, {layout}"
        with phase("tokenizer"):
            tiny_tokenizer = builtin.tiny_tokenizer()
        return LoadedModel(net, net.config, tiny_tokenizer, model,
                           builtin.CHAT_TEMPLATE, cache_id=_with_layout(model, layout))
    path = _model_path(model, revision, float_weights=layout != "gguf")
    config = ModelConfig.from_dir(path)
    with phase("weights") as note:
        net = PagedLlama(config, device, dtype, backend, float_linears=layout == "float")
        if layout == "gguf":
            gguf_file = gguf_cache.find_gguf(registry.resolve(model, revision))
            assert gguf_file is not None
            load_gguf_quantized(net, gguf_file, path)
            note["detail"] = f"{gguf_file.name}, {layout}"
        else:
            files = weight_files(path)
            load_weights(net, files, quantize.BITS.get(layout))
            note["detail"] = f"{len(files)} files, {layout}"
        net.eval()
        net.prepack()
    with phase("tokenizer"):
        tokenizer = tokenizer_for_model(path, config.bos_token_id, config.eos_token_ids)
    cache_id = _cache_id(model, path)
    return LoadedModel(net, config, tokenizer, model.rstrip("/") or model,
                       tokenizer.chat_template if tokenizer else None, path,
                       _with_layout(cache_id or model.rstrip("/") or model, layout))


def _with_layout(base: str, layout: str) -> str:
    return base if layout == "float" else f"{base}:{layout}"


def load_tokenizer(model: str, revision: str | None = None,
                   quantization: str = "auto") -> tuple[Tokenizer | None, str]:
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
        return builtin.tiny_tokenizer(), _with_layout(
            model, weights_layout(model, quantization))
    path = _model_path(model, revision, float_weights=False)
    config = ModelConfig.from_dir(path)
    tokenizer = tokenizer_for_model(path, config.bos_token_id, config.eos_token_ids)
    cache_id = _cache_id(model, path)
    return tokenizer, _with_layout(cache_id or (model.rstrip("/") or model),
                                   weights_layout(model, quantization, revision))


def _model_path(model: str, revision: str | None, float_weights: bool = True) -> Path:
    """The directory to load for ``model`` (:func:`registry.model_dir`);
    FileNotFoundError when it does not exist."""
    path = registry.model_dir(model, revision, float_weights)
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
