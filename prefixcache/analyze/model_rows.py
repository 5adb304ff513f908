"""Which row of a price sheet prices each request: the request's own ``model``.

A request is priced by the sheet row named like its ``model`` field, also when the log
names a provider-prefixed, dated or ``-latest`` snapshot of it (``openai/gpt-4o``,
``gpt-4o-2024-08-06``, ``claude-3-5-sonnet-latest``). ``--price-model LOG=ROW`` maps a
log model to a row explicitly; ``NAME:MODEL`` on ``--prices`` pins one row for every
request. Anything else falls back to the sheet's default row, and the report names that
substitution per model with its request count (:func:`choose_rows`).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# how a row was chosen
OWN, SNAPSHOT, MAPPED, PINNED, DEFAULT = ("own model", "snapshot", "--price-model",
                                          "pinned by --prices", "default row")
_DATE = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


@dataclass(frozen=True)
class RowChoice:
    """The sheet row that prices requests of one log model (``model`` ``None``: the log
    does not say), how it was chosen, and for how many requests."""

    model: str | None
    row: str
    how: str
    requests: int = 0

    @property
    def substituted(self) -> bool:
        """Priced at another model's rates (not the request's own model)."""
        return self.how in (MAPPED, PINNED, DEFAULT)

    def as_dict(self) -> dict:
        return {"model": self.model, "row": self.row, "how": self.how,
                "requests": self.requests, "substituted": self.substituted}


def parse_model_map(items: list[str] | None) -> dict[str, str]:
    """``["LOG=ROW", ...]`` (``--price-model``) as a dict.

    Raises:
        ValueError: an item without ``=`` or with an empty side (names ``--price-model``).
    """
    out: dict[str, str] = {}
    for item in items or []:
        log, sep, row = item.partition("=")
        if not sep or not log.strip() or not row.strip():
            raise ValueError(f"--price-model {item!r}: expected LOG_MODEL=SHEET_MODEL "
                             "(e.g. gpt-4o=gpt-4.1)")
        out[log.strip()] = row.strip()
    return out


def _own_row(model: str, rows: dict) -> tuple[str, str] | None:
    if model in rows:
        return model, OWN
    name = model.rsplit("/", 1)[-1]
    for cand in (name, _DATE.sub("", name)):
        if cand in rows:
            return cand, SNAPSHOT
    return None


def choose_row(sheet: dict, model: str | None, model_map: dict[str, str] | None = None,
               pinned: str | None = None) -> tuple[str, str]:
    """``(row, how)`` for one request of ``model`` under ``sheet``.

    Args:
        model_map: log model -> row (``--price-model``); used when the sheet has the row.
        pinned: the row named on ``--prices NAME:MODEL`` (wins over everything).
    """
    rows = sheet["models"]
    if pinned:
        return pinned, PINNED
    if model is not None:
        mapped = (model_map or {}).get(model)
        if mapped is not None and mapped in rows:
            return mapped, MAPPED
        own = _own_row(model, rows)
        if own is not None:
            return own
    return sheet.get("default_model") or next(iter(rows)), DEFAULT


def choose_rows(sheet: dict, models: list[str | None],
                model_map: dict[str, str] | None = None, pinned: str | None = None
                ) -> tuple[list[str], list[RowChoice]]:
    """The row of every request (``models``: each request's ``model``), and one
    :class:`RowChoice` per distinct log model, most requests first."""
    counts = Counter(models)
    picks = {m: choose_row(sheet, m, model_map, pinned) for m in counts}
    choices = [RowChoice(m, *picks[m], requests=n) for m, n in counts.most_common()]
    return [picks[m][0] for m in models], choices


def check_model_map(model_map: dict[str, str], sheets: list[dict]) -> None:
    """Raises ValueError (naming ``--price-model``) for a row no chosen sheet has."""
    for log, row in model_map.items():
        if not any(row in s["models"] for s in sheets):
            known = sorted({m for s in sheets for m in s["models"]})
            raise ValueError(f"--price-model {log}={row}: no chosen price sheet has a "
                             f"model {row!r} (models: {', '.join(known)})")
