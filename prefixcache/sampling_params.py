"""Per-request sampling parameters, shaped like vLLM's ``SamplingParams``, and the
structured-output constraint they may carry (``StructuredOutputsParams``, vLLM's name).

Every field is validated in ``__post_init__``; a bad value raises ``ValueError`` whose
message starts with the parameter's name, so the server can map it to an OpenAI-style
error object with ``param`` set.
"""
from __future__ import annotations

import json as _json
import math
from dataclasses import dataclass, field
from typing import Any

MAX_STOP_STRINGS = 16
MAX_STOP_BYTES = 4096        # all stop strings together, UTF-8 bytes
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGPROBS = 20


class ParamError(ValueError):
    """A request parameter is invalid. ``param`` names it (OpenAI error ``param``)."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass
class SamplingParams:
    """How to sample one request's output.

    Attributes:
        n: number of completions; only ``1`` is supported.
        temperature: softmax temperature; ``0`` means greedy (argmax).
        top_p: nucleus sampling mass in (0, 1].
        top_k: keep the k most likely tokens; ``0`` or ``-1`` disables.
        min_p: drop tokens whose probability is below ``min_p`` times the top one.
        seed: per-request seed; the same seed gives the same tokens whatever the cache holds.
        max_tokens: most tokens to generate (>= 0); ``None`` means up to the context length.
            ``0`` prefills the prompt (publishing its pages) and generates nothing.
        min_tokens: generate at least this many tokens before EOS or stop ids count.
        stop: strings that end generation; not included in the output text unless
            ``include_stop_str_in_output``. Deduplicated (first occurrence kept); at most
            :data:`MAX_STOP_STRINGS` distinct strings of :data:`MAX_STOP_BYTES` UTF-8 bytes
            in all.
        stop_token_ids: token ids that end generation (besides EOS). Deduplicated (first
            occurrence kept); at most :data:`MAX_STOP_TOKEN_IDS` distinct ids.

        ignore_eos: keep generating after the EOS token.
        logprobs: return the log-probability of each generated token and of its top
            ``logprobs`` alternatives (vLLM format), ``None`` for none.
        prompt_logprobs: return prompt-token logprobs; such requests do not read cached
            pages (cached positions have no logits) but still publish theirs.
        skip_special_tokens: drop special tokens from the detokenized text.
        structured_outputs: a :class:`StructuredOutputsParams` the output must match (a
            token mask applied before sampling; EOS only where the grammar is complete; the
            request stops with ``"stop"`` when the grammar can take no further token).
            A dict is accepted and converted (vLLM's body shape).

    Raises:
        ParamError: a field is invalid; ``param`` names it.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    structured_outputs: StructuredOutputsParams | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._check_types()
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        _check(all(isinstance(s, str) and s for s in self.stop or []), "stop",
               "stop strings must be non-empty strings")
        self.stop = list(dict.fromkeys(self.stop or []))
        _check(all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                   for t in self.stop_token_ids or []),
               "stop_token_ids", "must be non-negative integers")
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))
        _check(self.n == 1, "n", f"only n=1 is supported, got {self.n}")
        _check(self.temperature >= 0.0, "temperature", f"must be >= 0, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= -1, "top_k", f"must be -1, 0 or positive, got {self.top_k}")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        _check(self.max_tokens is None or self.max_tokens >= 0, "max_tokens",
               f"must be at least 0 (0 prefills only), got {self.max_tokens}")
        _check(self.min_tokens >= 0, "min_tokens", f"must be >= 0, got {self.min_tokens}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        _check(len(self.stop) <= MAX_STOP_STRINGS, "stop",
               f"at most {MAX_STOP_STRINGS} distinct stop strings, got {len(self.stop)}")
        stop_bytes = sum(len(s.encode("utf-8")) for s in self.stop)
        _check(stop_bytes <= MAX_STOP_BYTES, "stop",
               f"stop strings may hold at most {MAX_STOP_BYTES} UTF-8 bytes in all, "
               f"got {stop_bytes}")
        _check(len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS, "stop_token_ids",
               f"at most {MAX_STOP_TOKEN_IDS} distinct stop token ids, "
               f"got {len(self.stop_token_ids)}")
        _check(self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
               f"must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        _check(self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
               "prompt_logprobs", f"must be in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs}")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]")
        _check(self.repetition_penalty > 0.0, "repetition_penalty", "must be > 0")
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        _check(self.structured_outputs is None
               or isinstance(self.structured_outputs, StructuredOutputsParams),
               "structured_outputs", "must be a StructuredOutputsParams, a dict or None, got "
               f"{type(self.structured_outputs).__name__}")

    def _check_types(self) -> None:
        """Every numeric field has its type (a bool is neither an int nor a float here),
        so the range checks compare numbers; ParamError names the field."""
        for name in _INT_FIELDS + _OPTIONAL_INT_FIELDS:
            v = getattr(self, name)
            _check((v is None and name in _OPTIONAL_INT_FIELDS) or _is_int(v), name,
                   f"must be an integer, got {v!r}")
        for name in _FLOAT_FIELDS:
            v = getattr(self, name)
            _check(isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v), name, f"must be a finite number, got {v!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


_INT_FIELDS = ("n", "top_k", "min_tokens")
_OPTIONAL_INT_FIELDS = ("seed", "max_tokens", "logprobs", "prompt_logprobs")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_namespace(**values: object) -> None:
    """``tenant`` and ``cache_salt`` (the cache namespace) must be strings or ``None``;
    raises :class:`ParamError` naming the first that is not."""
    for name, v in values.items():
        _check(v is None or isinstance(v, str), name,
               f"must be a string or None, got {type(v).__name__}")


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise ParamError(param, message)


# -- structured outputs ------------------------------------------------------------------
KINDS = ("json", "regex", "choice", "grammar", "json_object")
MAX_SPEC_BYTES = 1 << 20     # a schema, regex or grammar: at most 1 MiB of UTF-8 text
MAX_CHOICES = 4096


@dataclass(frozen=True, eq=False)
class StructuredOutputsParams:
    """Exactly one of the constraint kinds (vLLM's field names).

    Attributes:
        json: a JSON schema, as a dict or as JSON text; the output is one JSON value that
            validates against it (``additionalProperties`` is honoured as written).
        regex: a regular expression the whole output matches.
        choice: non-empty strings; the output is exactly one of them.
        grammar: a grammar in xgrammar's EBNF dialect (GBNF-like, ``root ::= ...``); the
            output is a sentence of its ``root`` rule. Literal text and JSON rules mix
            freely (see ``text/grammar_ebnf.py``'s helpers that build such grammars).
        json_object: ``True``: the output is any JSON object (``response_format``
            ``{"type": "json_object"}``).
        disable_any_whitespace: JSON kinds only: emit JSON without free whitespace
            (one space after ``:`` and ``,``, none elsewhere) instead of allowing any.

    The stored ``json`` is the parsed schema (a dict); :meth:`key` is a canonical text
    of the whole specification (the compiled-grammar cache key).

    Raises:
        ParamError: not exactly one kind set, a field of the wrong type, an empty or
            oversized value, or ``json`` text that is not a JSON object; ``param`` is
            ``structured_outputs.<field>`` (or ``structured_outputs`` when the count of
            kinds is wrong).
    """

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        set_kinds = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(set_kinds) != 1:
            raise ParamError("structured_outputs", "exactly one of "
                             f"{', '.join(KINDS)} must be set, got "
                             f"{', '.join(set_kinds) if set_kinds else 'none'}")
        if not isinstance(self.disable_any_whitespace, bool):
            raise ParamError("structured_outputs.disable_any_whitespace", "must be a boolean")
        kind = set_kinds[0]
        param = f"structured_outputs.{kind}"
        value = getattr(self, kind)
        if kind == "json":
            object.__setattr__(self, "json", _schema(value, param))
        elif kind in ("regex", "grammar"):
            if not isinstance(value, str) or not value.strip():
                raise ParamError(param, "must be a non-empty string")
            _check_size(value, param)
        elif kind == "choice":
            if (not isinstance(value, (list, tuple)) or not value
                    or not all(isinstance(c, str) and c for c in value)):
                raise ParamError(param, "must be a non-empty list of non-empty strings")
            if len(value) > MAX_CHOICES:
                raise ParamError(param, f"at most {MAX_CHOICES} choices, got {len(value)}")
            _check_size("".join(value), param)
            object.__setattr__(self, "choice", list(dict.fromkeys(value)))
        elif value is not True:
            raise ParamError(param, f"must be true or unset, got {value!r}")

    @property
    def kind(self) -> str:
        """The constraint kind: one of :data:`KINDS`."""
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def param(self) -> str:
        """The field's name for error messages: ``structured_outputs.<kind>``."""
        return f"structured_outputs.{self.kind}"

    def key(self) -> str:
        """A canonical text of the specification: equal specifications (a schema's keys in
        any order) give equal keys."""
        value = getattr(self, self.kind)
        body = _json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return f"{self.kind}|{int(self.disable_any_whitespace)}|{body}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StructuredOutputsParams) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    @classmethod
    def from_dict(cls, d: Any, param: str = "structured_outputs") -> StructuredOutputsParams:
        """Build from a request body's object (vLLM's ``structured_outputs`` field).

        Raises:
            ParamError: ``d`` is not an object, has an unknown key (named), or a field
                is invalid.
        """
        if not isinstance(d, dict):
            raise ParamError(param, "must be an object")
        fields = set(KINDS) | {"disable_any_whitespace"}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ParamError(f"{param}.{unknown[0]}", "is not supported (supported: "
                             f"{', '.join(sorted(fields))})")
        return cls(**d)


def _schema(value: Any, param: str) -> dict[str, Any]:
    if isinstance(value, str):
        _check_size(value, param)
        try:
            value = _json.loads(value)
        except ValueError as exc:
            raise ParamError(param, f"is not valid JSON: {exc}") from None
    if isinstance(value, bool):  # JSON Schema allows true/false schemas
        value = {} if value else {"not": {}}
    if not isinstance(value, dict):
        raise ParamError(param, f"must be a JSON schema object, got {type(value).__name__}")
    try:
        text = _json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ParamError(param, f"is not JSON-serializable: {exc}") from None
    _check_size(text, param)
    return value


def _check_size(text: str, param: str) -> None:
    n = len(text.encode("utf-8"))
    if n > MAX_SPEC_BYTES:
        raise ParamError(param, f"is {n} bytes; at most {MAX_SPEC_BYTES} are accepted")
