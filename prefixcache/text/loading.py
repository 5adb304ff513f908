"""Which tokenizer a model folder or a ``--tokenizer`` value gets. Nothing is downloaded.

=====================  ===============================================================
``--tokenizer``        tokenizer
=====================  ===============================================================
(absent), ``approx``   :class:`~.approx_tokenizer.ApproxTokenizer`: no file needed,
                       counts close to a BPE tokenizer's, ids not a real model's
``bytes``              one token per UTF-8 byte, ChatML markers as single tokens
``qwen2``, ``gpt2``    the shared tokenizers, ``<data root>/tokenizers/NAME``
                       (:func:`prefixcache.paths.data_root`)
``FILE.json``          a Hugging Face ``tokenizer.json`` (``tokenizers`` library)
``DIR``                ``DIR/tokenizer.json`` through the ``tokenizers`` library, else
                       anything ``AutoTokenizer`` loads offline (``vocab.json`` +
                       ``merges.txt``, SentencePiece models)
=====================  ===============================================================

A model folder (:func:`tokenizer_for_model`) is read the way the model's own stack reads
it: ``tokenizer_config.json`` present -> transformers, only ``tokenizer.json`` -> the
``tokenizers`` library.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from prefixcache.paths import data_root
from prefixcache.text.approx_tokenizer import ApproxTokenizer
from prefixcache.text.byte_tokenizer import chatml_byte_tokenizer
from prefixcache.text.hf_tokenizer import HFTokenizer
from prefixcache.text.json_tokenizer import JSONTokenizer
from prefixcache.text.tokenizer import Tokenizer
from prefixcache.text.tokenizer_files import generation_eos_ids

BUILTIN_SPECS = ("approx", "bytes")
# end-of-turn markers of the supported families' chat templates
END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|end|>", "<|eot_id|>")
SHARED_ALIASES = ("qwen2", "gpt2")


class TokenizerError(ValueError):
    """The tokenizer cannot be found or loaded; the message names the ``--tokenizer``
    value and the path tried."""


def tokenizer_for_model(path: str | Path, bos_token_id: int | None = None,
                        eos_token_ids: set[int] | tuple[int, ...] = ()) -> Tokenizer | None:
    """The tokenizer of a model folder, or ``None`` if it holds no tokenizer files.

    ``bos_token_id``/``eos_token_ids`` (from ``config.json``) complete what the tokenizer
    files say; ``generation_config.json`` EOS ids are added.

    Raises: OSError/ValueError from the backend if the files are unreadable.
    """
    path = Path(path)
    eos = set(eos_token_ids) | generation_eos_ids(path)
    tok: Tokenizer
    if (path / "tokenizer_config.json").is_file():
        tok = HFTokenizer(path, eos)
        if tok.bos_token_id is None:
            tok.bos_token_id = bos_token_id
    elif (path / "tokenizer.json").is_file():
        tok = JSONTokenizer(path, bos_token_id, eos)
    else:
        return None
    tok.eos_token_ids |= end_of_turn_ids(tok)
    return tok


def end_of_turn_ids(tok: Tokenizer) -> set[int]:
    """Ids of the end-of-turn markers (:data:`END_OF_TURN_TOKENS`: ChatML/Qwen
    ``<|im_end|>``, Gemma ``<end_of_turn>``, Phi ``<|end|>``, Llama 3 ``<|eot_id|>``) that
    the tokenizer's chat template writes and its vocabulary holds as one token:
    a chat reply ends there, so generation stops on them, whether or not
    ``generation_config.json`` lists them."""
    template = tok.chat_template or ""
    out = set()
    for marker in END_OF_TURN_TOKENS:
        if marker not in template:
            continue
        ids = tok.encode(marker, add_special_tokens=False)
        if len(ids) == 1 and tok.decode_token(ids[0]) == marker:
            out.add(ids[0])
    return out


def resolve_tokenizer_path(spec: str) -> Path | None:
    """The file or folder a ``--tokenizer`` value names (``None`` for the built-ins).

    Raises:
        TokenizerError: no such file or folder, or a shared alias whose folder is missing.
    """
    if spec in BUILTIN_SPECS:
        return None
    path = Path(spec).expanduser()
    if not path.exists() and spec in SHARED_ALIASES:
        try:
            path = data_root() / "tokenizers" / spec
        except FileNotFoundError as e:
            raise TokenizerError(f"tokenizer {spec!r}: {e}") from None
        if not path.exists():
            raise TokenizerError(
                f"tokenizer {spec!r}: {path} not found (set PREFIXCACHE_DATA to the "
                "shared data folder, or pass a tokenizer path)")
    if not path.exists():
        raise TokenizerError(f"tokenizer {spec!r}: no such file or folder (built-ins: "
                             f"{', '.join(BUILTIN_SPECS)}; shared: {', '.join(SHARED_ALIASES)})")
    return path


def load_tokenizer(spec: str | None = None) -> Tokenizer:
    """Load a tokenizer from a ``--tokenizer`` value (see the module docstring).

    Raises:
        TokenizerError: not found, or not a tokenizer that loads offline.
    """
    spec = spec or "approx"
    if spec == "approx":
        return ApproxTokenizer()
    if spec == "bytes":
        return chatml_byte_tokenizer()
    path = resolve_tokenizer_path(spec)
    assert path is not None
    try:
        return _load_path(path.resolve())
    except Exception as exc:  # noqa: BLE001  (tokenizers/transformers raise many kinds)
        raise TokenizerError(f"cannot load tokenizer {spec!r} from {path}: {exc}") from None


@lru_cache(maxsize=8)
def _load_path(path: Path) -> Tokenizer:
    # loading a vocab.json + merges.txt folder through transformers takes seconds: once
    # per process (these tokenizers hold no per-call state)
    if path.is_file() or (path / "tokenizer.json").is_file():
        return JSONTokenizer(path)
    return HFTokenizer(path)
