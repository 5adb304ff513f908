"""The GGUF conversion cache: the first load of a GGUF file writes a Hugging Face directory
(``config.json``, tokenizer files) and ``tensors.json`` (where each tensor lies in the
file, :func:`prefixcache.model.gguf.tensor_index`), which later loads read in a moment
instead of parsing the GGUF file (its tokenizer metadata alone takes seconds). A load that
keeps the file's quantized layout reads the weights from the GGUF file itself, memory-
mapped; only a float load (``--quantization none|int4|int8``) or a peer that needs a
Hugging Face checkpoint (transformers, vLLM) adds ``model.safetensors``, the weights
dequantized to float32 (:func:`converted_dir` with ``float_weights``).

Layout: ``cache_root()/<sha256 of the file>-v<FORMAT_VERSION>/``, plus ``sha256.json``
(file sha256 by (path, size, mtime), so an unchanged file is hashed once). Publish after
write, as for KV tiers: an entry is built in a temporary directory and renamed into place;
its ``manifest.json`` lists every file's size and sha256, and an entry that fails the check
(corrupt, truncated, half-deleted) is removed and rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

import prefixcache.model.gguf as gguf

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
FLOAT_WEIGHTS = "model.safetensors"
TENSOR_INDEX = "tensors.json"
_CHUNK = 1 << 22
log = logging.getLogger(__name__)


def cache_root() -> Path:
    """``$PREFIXCACHE_CACHE_DIR/gguf`` if that variable is set, else
    ``$XDG_CACHE_HOME/prefixcache/gguf`` (``~/.cache/prefixcache/gguf``)."""
    if os.environ.get("PREFIXCACHE_CACHE_DIR"):
        return Path(os.environ["PREFIXCACHE_CACHE_DIR"]).expanduser() / "gguf"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "prefixcache" / "gguf"


def find_gguf(path: Path) -> Path | None:
    """The GGUF file that ``path`` names: ``path`` itself when it ends in ``.gguf``, or
    the one ``*.gguf`` in a directory without ``config.json``; else ``None``.

    Raises:
        ValueError: a directory holding several GGUF files (they are listed).
    """
    if path.suffix == ".gguf":
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    files = sorted(path.glob("*.gguf"))
    if len(files) > 1:
        raise ValueError(f"{path} holds several GGUF files ({', '.join(f.name for f in files)})"
                         "; pass the file's path as the model")
    return files[0] if files else None


def file_sha256(path: Path, root: Path | None = None) -> str:
    """Hex sha256 of ``path``, remembered under ``root`` by (resolved path, size, mtime)."""
    root = root or cache_root()
    path = path.resolve()
    st = path.stat()
    index_file = root / "sha256.json"
    try:
        index = json.loads(index_file.read_text())
    except (OSError, ValueError):
        index = {}
    if not isinstance(index, dict):
        index = {}  # not ours or damaged: rebuilt below
    known = index.get(str(path))
    if (isinstance(known, dict) and known.get("size") == st.st_size
            and known.get("mtime_ns") == st.st_mtime_ns and "sha256" in known):
        return str(known["sha256"])
    sha = _sha256(path)
    index[str(path)] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
    root.mkdir(parents=True, exist_ok=True)
    _atomic_write(index_file, json.dumps(index, indent=1))
    return sha


def converted_dir(gguf_path: Path, root: Path | None = None,
                  float_weights: bool = True) -> Path:
    """The HF directory converted from ``gguf_path``, built on first use (with progress
    bars), checked against its manifest on every later use and rebuilt if it fails. With
    ``float_weights`` it holds ``model.safetensors`` (float32; added to an entry built
    without it); without, only the config, tokenizer and tensor index.

    Raises:
        FileNotFoundError: ``gguf_path`` does not exist.
        ValueError: not a GGUF file, or an unsupported architecture, tensor type or RoPE
            scaling (named); nothing is left in the cache then.
    """
    root = root or cache_root()
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    entry = root / f"{file_sha256(gguf_path, root)}-v{FORMAT_VERSION}"
    if entry.is_dir():
        problem = verify(entry)
        if problem is None:
            if float_weights and not has_float_weights(entry):
                _add_float_weights(gguf_path, entry)
            return entry
        log.warning("GGUF cache entry %s is damaged (%s); rebuilding it", entry, problem)
        shutil.rmtree(entry, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=root))
    try:
        convert(gguf_path, tmp, float_weights)
        try:
            os.rename(tmp, entry)
        except OSError:  # another process published the same entry first
            if verify(entry) is not None:
                raise
            if float_weights and not has_float_weights(entry):
                _add_float_weights(gguf_path, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def has_float_weights(entry: Path) -> bool:
    """Whether the (verified) entry's manifest lists ``model.safetensors``."""
    try:
        return FLOAT_WEIGHTS in json.loads((entry / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def tensor_index(entry: Path) -> dict:
    """The entry's ``tensors.json`` (:func:`prefixcache.model.gguf.tensor_index`).

    Raises:
        OSError, ValueError: missing or unreadable (an entry that :func:`verify` passed
            has it).
    """
    return dict(json.loads((entry / TENSOR_INDEX).read_text()))


FLOAT_TYPES = ("F32", "F16", "BF16")


def is_quantized(gguf_path: Path, root: Path | None = None) -> bool:
    """Whether any matrix (2-D tensor) of the GGUF file has a quantized type (not
    F32/F16/BF16); remembered beside the cache entries by the file's sha256, so the
    file's metadata is parsed once.

    Raises:
        FileNotFoundError / ValueError: as :func:`converted_dir`.
    """
    root = root or cache_root()
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    path = root / f"{file_sha256(gguf_path, root)}-types.json"
    try:
        types = json.loads(path.read_text())
    except (OSError, ValueError):
        reader = gguf.open_reader(gguf_path)
        types = sorted({t.tensor_type.name for t in reader.tensors if len(t.shape) == 2})
        root.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, json.dumps(types))
    return any(t not in FLOAT_TYPES for t in types)


def convert(gguf_path: Path, out: Path, float_weights: bool = True) -> None:
    """Write the HF directory of ``gguf_path`` into ``out`` (``model.safetensors`` only
    with ``float_weights``) and, last, its manifest.

    Raises:
        ValueError: see :func:`converted_dir`.
    """
    reader = gguf.open_reader(gguf_path)
    gguf.check_supported(reader)
    config = gguf.hf_config(reader)
    if float_weights:
        _write_float_weights(gguf_path, reader, config, out / FLOAT_WEIGHTS)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / TENSOR_INDEX).write_text(json.dumps(gguf.tensor_index(reader)))
    gguf.write_tokenizer(reader, gguf_path, out)
    _write_manifest(out, gguf_path.name)


def _write_manifest(out: Path, source: str) -> None:
    """List every file of ``out`` (size, mtime, sha256) in its manifest, atomically."""
    files = {p.name: {"size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns,
                      "sha256": _sha256(p)}
             for p in sorted(out.iterdir()) if p.is_file() and p.name != MANIFEST
             and not p.name.startswith(".")}
    manifest = {"format_version": FORMAT_VERSION, "source": source, "files": files}
    _atomic_write(out / MANIFEST, json.dumps(manifest, indent=2))


def _write_float_weights(gguf_path: Path, reader, config: dict, path: Path) -> None:
    """The file's tensors dequantized to float32, under HF names, into ``path``."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm

    if not sys.stderr.isatty():  # the bar is off: say why this load takes a while
        print(f"converting {gguf_path.name} to float32 into {path.parent.parent} "
              "(once, for float loads)", file=sys.stderr, flush=True)
    tensors = {}
    bar = tqdm(gguf.hf_tensors(reader, config), total=len(reader.tensors), unit="tensor",
               desc=f"dequantizing {gguf_path.name}", disable=None, leave=False)
    for name, w in bar:
        tensors[name] = torch.from_numpy(np.require(w, requirements="W"))
    save_file(tensors, str(path), metadata={"format": "pt"})


def _add_float_weights(gguf_path: Path, entry: Path) -> None:
    """Add ``model.safetensors`` to a published entry: written beside it under a hidden
    name, renamed into place, then listed in a rewritten manifest (until then a float
    load does not see it)."""
    reader = gguf.open_reader(gguf_path)
    config = json.loads((entry / "config.json").read_text())
    fd, tmp = tempfile.mkstemp(prefix=f".{FLOAT_WEIGHTS}.", dir=entry)
    os.close(fd)
    try:
        _write_float_weights(gguf_path, reader, config, Path(tmp))
        os.replace(tmp, entry / FLOAT_WEIGHTS)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _write_manifest(entry, gguf_path.name)


def verify(entry: Path) -> str | None:
    """``None`` if every file of ``entry``'s manifest is there with its size and sha256;
    else what is wrong. A file whose size and modification time are those recorded at
    conversion is not hashed again (as for the source file's sha, :func:`file_sha256`):
    a load does not re-read the weights twice; a rewritten or truncated file is
    re-hashed or caught by its size."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest ({e})"
    if manifest.get("format_version") != FORMAT_VERSION:
        return f"format version {manifest.get('format_version')}"
    if TENSOR_INDEX not in files:
        return f"{TENSOR_INDEX} not listed"
    for name, want in files.items():
        p = entry / name
        if not p.is_file():
            return f"{name} missing"
        st = p.stat()
        if st.st_size != want["size"]:
            return f"{name} has {st.st_size} bytes, expected {want['size']}"
        if want.get("mtime_ns") != st.st_mtime_ns and _sha256(p) != want["sha256"]:
            return f"{name} checksum mismatch"
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
