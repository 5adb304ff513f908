"""Price sheets: data files (``prices/*.json``), never code.

A sheet::

    {"provider", "title", "source" (URL), "as_of" (date), "note", "currency",
     "per_tokens": 1000000,             # prices are per this many tokens
     "default_model": NAME,
     "modes": [MODE, ...],              # how the provider caches; one estimate each
     "models": {NAME: PRICES, ...}}

PRICES: ``input``, ``output``, and ``cached_input`` (read price) or the mode's
``read_multiplier``; for self-hosted, ``accelerator_hour`` with
``prefill_tokens_per_second`` / ``decode_tokens_per_second`` instead of
``input`` / ``output``; optionally ``min_cached_tokens``, ``min_cacheable_tokens``,
``storage_per_mtok_hour`` (overriding the mode's).

MODE ``kind``:

- ``automatic``: the provider caches prefixes itself (OpenAI, DeepSeek, Gemini
  implicit, a self-hosted prefix cache). Fields: ``unit_tokens`` (cache granularity;
  ``null`` = the analysis block size), ``min_cached_tokens`` (shorter hits are billed
  as misses), ``ttl_seconds`` (idle expiry; ``null`` = none), ``use_analysis_cache``
  (replay with the analysis capacity instead of an unlimited cache).
- ``breakpoints``: explicit ``cache_control`` breakpoints (Anthropic):
  ``max_breakpoints``, ``ttl_seconds``, ``write_multiplier``, ``read_multiplier``.
- ``explicit``: explicit caches billed for storage (Gemini): as ``automatic``, plus
  ``storage_per_mtok_hour`` for the cached pages over their lifetime and ``ttl_seconds``.

``--prices`` takes ``NAME`` (a built-in sheet: openai, anthropic, deepseek, gemini,
self-hosted), ``PATH`` (a sheet file), either with ``:MODEL``, or ``all``. Without
``:MODEL`` each request is priced at its own model's row (:mod:`.model_rows`); with it,
every request at that row.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

KINDS = ("automatic", "breakpoints", "explicit")


class PriceSheetError(ValueError):
    """A sheet that cannot be read, or a model it does not have."""


def builtin_sheet_names() -> list[str]:
    root = resources.files("prefixcache.analyze") / "prices"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def load_sheet(name_or_path: str) -> dict:
    """A sheet by built-in name or path, validated.

    Raises:
        PriceSheetError: not found, not JSON, or missing required fields.
    """
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        try:
            sheet = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PriceSheetError(f"price sheet {path}: {exc}") from None
    else:
        res = resources.files("prefixcache.analyze") / "prices" / f"{name_or_path}.json"
        if not res.is_file():
            raise PriceSheetError(f"no built-in price sheet {name_or_path!r} (built-in: "
                                  f"{', '.join(builtin_sheet_names())}; or pass a path)")
        sheet = json.loads(res.read_text(encoding="utf-8"))
    validate_sheet(sheet, str(name_or_path))
    return sheet


def validate_sheet(sheet: dict, where: str = "sheet") -> None:
    """Raises :class:`PriceSheetError` naming the first problem."""
    def bad(msg: str):
        raise PriceSheetError(f"{where}: {msg}")
    if not isinstance(sheet, dict):
        bad("not a JSON object")
    for key in ("provider", "source", "as_of", "models", "modes"):
        if key not in sheet:
            bad(f"missing {key!r}")
    if not isinstance(sheet["models"], dict) or not sheet["models"]:
        bad("'models' must be a non-empty object")
    if not isinstance(sheet["modes"], list) or not sheet["modes"]:
        bad("'modes' must be a non-empty list")
    for mode in sheet["modes"]:
        if mode.get("kind") not in KINDS:
            bad(f"mode {mode.get('name')!r}: kind must be one of {KINDS}")
        if mode["kind"] == "breakpoints":
            for k in ("write_multiplier", "read_multiplier", "max_breakpoints"):
                if not isinstance(mode.get(k), (int, float)):
                    bad(f"mode {mode.get('name')!r}: breakpoints need {k!r}")
    for name, m in sheet["models"].items():
        if not isinstance(m, dict):
            bad(f"model {name!r} is not an object")
        if "input" not in m and not ("accelerator_hour" in m
                                     and "prefill_tokens_per_second" in m):
            bad(f"model {name!r}: needs 'input' (or 'accelerator_hour' and "
                "'prefill_tokens_per_second')")
        for mode in sheet["modes"]:
            if mode["kind"] != "breakpoints" and "cached_input" not in m \
                    and "read_multiplier" not in mode:
                bad(f"model {name!r}: mode {mode.get('name')!r} needs 'cached_input' "
                    "or a 'read_multiplier'")
            if mode["kind"] == "explicit" and "storage_per_mtok_hour" not in m \
                    and "storage_per_mtok_hour" not in mode:
                bad(f"model {name!r}: explicit mode needs 'storage_per_mtok_hour'")


@dataclass(frozen=True)
class Prices:
    """Per-token prices (currency units per token) of one model under one mode."""

    provider: str
    model: str
    mode: str
    kind: str
    input: float
    read: float
    output: float
    write: float = 0.0  # breakpoints: cache-write price per token
    storage_per_token_hour: float = 0.0
    unit_tokens: int | None = None
    min_cached_tokens: int = 0
    ttl_seconds: float | None = None
    max_breakpoints: int = 4
    use_analysis_cache: bool = False
    currency: str = "USD"
    source: str = ""
    as_of: str = ""

    @property
    def label(self) -> str:
        return f"{self.provider}/{self.model}/{self.mode}"

    @property
    def read_ratio(self) -> float:
        """r: read price over input price."""
        return self.read / self.input if self.input else 0.0


def _model_prices(m: dict, per: float) -> tuple[float, float]:
    if "input" in m:
        return m["input"] / per, m.get("output", 0.0) / per
    hour = m["accelerator_hour"]
    inp = hour / (m["prefill_tokens_per_second"] * 3600.0)
    dec = m.get("decode_tokens_per_second")
    return inp, (hour / (dec * 3600.0) if dec else 0.0)


def resolve(sheet: dict, model: str | None = None, overrides: dict | None = None
            ) -> list[Prices]:
    """One :class:`Prices` per mode for ``model`` (default: the sheet's default).

    Args:
        overrides: model fields to replace (e.g. ``accelerator_hour``).

    Raises:
        PriceSheetError: the sheet has no such model.
    """
    name = model or sheet.get("default_model") or next(iter(sheet["models"]))
    if name not in sheet["models"]:
        raise PriceSheetError(f"{sheet['provider']}: no model {name!r} (models: "
                              f"{', '.join(sheet['models'])})")
    m = {**sheet["models"][name], **(overrides or {})}
    per = float(sheet.get("per_tokens", 1_000_000))
    inp, out = _model_prices(m, per)
    result = []
    for mode in sheet["modes"]:
        kind = mode["kind"]
        if "cached_input" in m and kind != "breakpoints":
            read = m["cached_input"] / per
        else:
            read = inp * mode.get("read_multiplier", 1.0)
        storage = m.get("storage_per_mtok_hour", mode.get("storage_per_mtok_hour", 0.0))
        min_cached = m.get("min_cached_tokens", mode.get("min_cached_tokens", 0)) or 0
        if kind == "breakpoints":
            min_cached = m.get("min_cacheable_tokens", mode.get("min_cacheable_tokens", 0))
        result.append(Prices(
            provider=sheet["provider"], model=name, mode=mode.get("name", kind), kind=kind,
            input=inp, read=read, output=out,
            write=inp * mode.get("write_multiplier", 0.0) if kind == "breakpoints" else 0.0,
            storage_per_token_hour=storage / 1_000_000.0 if kind == "explicit" else 0.0,
            unit_tokens=mode.get("unit_tokens"), min_cached_tokens=int(min_cached or 0),
            ttl_seconds=mode.get("ttl_seconds"),
            max_breakpoints=int(mode.get("max_breakpoints", 4)),
            use_analysis_cache=bool(mode.get("use_analysis_cache", False)),
            currency=sheet.get("currency", "USD"), source=sheet["source"],
            as_of=sheet["as_of"]))
    return result


def load_price_specs(specs: list[str] | None) -> list[tuple[dict, str | None]]:
    """``--prices`` values to ``(sheet, pinned model or None)`` pairs. ``None``/``[]``/
    ``["all"]``: every built-in sheet, no model pinned.

    Raises:
        PriceSheetError: unknown sheet, or a pinned model the sheet does not have.
    """
    out: list[tuple[dict, str | None]] = []
    for spec in specs or ["all"]:
        if spec == "all":
            out.extend((load_sheet(n), None) for n in builtin_sheet_names())
            continue
        source, model = spec, None
        if ":" in spec and not Path(spec).exists():
            source, model = spec.rsplit(":", 1)
        sheet = load_sheet(source)
        if model and model not in sheet["models"]:
            raise PriceSheetError(f"--prices {spec}: {sheet['provider']} has no model "
                                  f"{model!r} (models: {', '.join(sheet['models'])})")
        out.append((sheet, model or None))
    return out


def sheet_overrides(sheet: dict, overrides: dict | None) -> dict | None:
    """The command-line overrides that apply to ``sheet`` (self-hosted sheets only)."""
    return overrides if sheet["provider"] == "self-hosted" else None


def parse_price_specs(specs: list[str] | None, overrides: dict | None = None) -> list[Prices]:
    """``--prices`` values to prices of each sheet's pinned (else default) model.
    ``None``/``[]``/``["all"]``: every built-in sheet's default model.

    Raises:
        PriceSheetError: unknown sheet or model.
    """
    return [p for sheet, model in load_price_specs(specs)
            for p in resolve(sheet, model, sheet_overrides(sheet, overrides))]
