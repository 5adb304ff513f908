"""Command-line flags of the engine, generated once from :class:`EngineConfig`'s fields.

``generate``, ``demo``, ``serve``, ``bench`` and ``bench-engine`` all call
:func:`add_engine_args`, so a flag means the same everywhere and cannot drift: a field
``max_num_seqs`` becomes ``--max-num-seqs``, its help (with unit and default) comes from
the field's metadata. ``--seed`` is always the engine seed. Booleans that default to
``False`` are switches (``--deterministic``); ``enable_prefix_caching`` is switched off
by ``--no-prefix-caching``. ``kv_cache_bytes``, ``host_cache_bytes`` and ``disk_cache_bytes``
are given in GiB (``--kv-cache-gib``, ``--host-cache-gib``, ``--disk-cache-gib``): each must
be a finite number (nan, inf and negatives are an argparse error naming the flag),
``--kv-cache-gib`` and ``--disk-cache-gib`` > 0, ``--host-cache-gib`` >= 0 (0: no host tier)
and at most the machine's physical RAM. ``--disk-cache-gib`` needs ``--disk-cache-dir``.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from prefixcache.config import (
    COMPUTE_BACKENDS,
    GIB,
    KV_CACHE_DTYPES,
    EngineConfig,
    dtype_name,
    over_physical_ram,
)
from prefixcache.config import physical_ram_bytes as physical_ram_bytes  # re-exported


def gib_arg(text: str) -> float:
    """argparse type: a size in GiB, a finite number >= 0 (argparse names the flag)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of GiB, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of GiB, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def positive_gib_arg(text: str) -> float:
    """argparse type of ``--kv-cache-gib`` and ``--disk-cache-gib``: :func:`gib_arg`, > 0."""
    value = gib_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def host_gib_arg(text: str) -> float:
    """argparse type of ``--host-cache-gib``: :func:`gib_arg`, at most the physical RAM
    (the check :class:`EngineConfig` makes, :func:`~prefixcache.config.over_physical_ram`)."""
    value = gib_arg(text)
    excess = over_physical_ram(int(value * GIB), f"{text} GiB")
    if excess:
        raise argparse.ArgumentTypeError(excess)
    return value


def check_engine_args(args: argparse.Namespace) -> str | None:
    """The parser's check across engine flags (``CLIParser`` calls it after parsing): a
    usage error naming the flags, or ``None``. ``--disk-cache-gib`` other than its default
    without ``--disk-cache-dir`` would otherwise start with no disk tier."""
    gib = getattr(args, "disk_cache_gib", None)
    default = _default(_field("disk_cache_bytes")) / GIB
    if gib is not None and gib != default and not getattr(args, "disk_cache_dir", None):
        return "--disk-cache-gib needs --disk-cache-dir (no disk tier without a directory)"
    return None


# Fields whose flag differs from the field: flag (its dest is the flag's name), argparse
# type, field value per flag unit, unit.
_FLAG_OVERRIDES = {"kv_cache_bytes": ("--kv-cache-gib", positive_gib_arg, GIB, "GiB"),
                   "host_cache_bytes": ("--host-cache-gib", host_gib_arg, GIB, "GiB"),
                   "disk_cache_bytes": ("--disk-cache-gib", positive_gib_arg, GIB, "GiB")}
_NEGATED = {"enable_prefix_caching": "--no-prefix-caching"}
_TYPES = {"int": int, "float": float, "str": str}


def _dtype_arg(text: str) -> str:
    try:
        return dtype_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (argparse names the flag in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def engine_fields(include: Iterable[str] | None = None) -> list[dataclasses.Field]:
    """The :class:`EngineConfig` fields that have a flag (all but test-only ones), in
    declaration order; ``include`` keeps only those names (ValueError for an unknown one)."""
    fields = [f for f in dataclasses.fields(EngineConfig) if f.metadata.get("cli", True)]
    if include is None:
        return fields
    wanted = set(include)
    unknown = wanted - {f.name for f in fields}
    if unknown:
        raise ValueError(f"include: no engine flag for {sorted(unknown)}")
    return [f for f in fields if f.name in wanted]


def _field(name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(EngineConfig) if f.name == name)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    factory = f.default_factory  # every EngineConfig field has a default or a factory
    return factory() if callable(factory) else None


def _help(f: dataclasses.Field, default: Any, unit: str) -> str:
    text = f.metadata.get("help", "")
    if unit:
        text += f" ({unit})"
    shown = f.metadata.get("default_text") or default
    return f"{text}; default: {shown}"


def add_engine_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                    include: Iterable[str] | None = None,
                    defaults: dict[str, Any] | None = None) -> None:
    """Add one flag per :class:`EngineConfig` field to ``parser``.

    Args:
        parser: a parser or an argument group.
        include: field names to add (default: every field with a flag).
        defaults: field values replacing the dataclass defaults for this command
            (``kv_cache_bytes`` in bytes; ``generate``, ``demo`` and ``serve`` give
            ``model`` the registry's ``DEFAULT_MODEL``).

    Raises:
        ValueError: ``include`` or ``defaults`` names an unknown field.
    """
    defaults = dict(defaults or {})
    fields = engine_fields(include)
    unknown = set(defaults) - {f.name for f in fields}
    if unknown:
        raise ValueError(f"defaults: no engine flag for {sorted(unknown)}")
    if any(f.name == "disk_cache_bytes" for f in fields):  # run by CLIParser.parse_known_args
        parser.set_defaults(_check_args=check_engine_args)
    for f in fields:
        default = defaults.get(f.name, _default(f))
        if f.name in _NEGATED:
            parser.add_argument(_NEGATED[f.name], dest=f.name, action="store_false",
                                default=default, help=f"do not {f.metadata['help']}")
            continue
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            if default:  # a switch can only turn a False default on
                raise ValueError(f"defaults: {f.name} has no --no- flag; add it to _NEGATED")
            parser.add_argument(flag, dest=f.name, action="store_true", default=default,
                                help=f.metadata["help"])
            continue
        unit = f.metadata.get("unit", "")
        kw: dict[str, Any] = {"dest": f.name}
        if f.name in _FLAG_OVERRIDES:
            flag, kind, scale, unit = _FLAG_OVERRIDES[f.name]
            kw["type"], kw["dest"], default = kind, _dest(flag), default / scale
        elif f.name == "dtype":
            kw["type"], kw["metavar"] = _dtype_arg, "DTYPE"
        elif f.name == "compute_backend":
            kw["type"], kw["choices"], kw["metavar"] = str, COMPUTE_BACKENDS, "BACKEND"
        elif f.name == "kv_cache_dtype":
            kw["type"], kw["choices"], kw["metavar"] = str, KV_CACHE_DTYPES, "DTYPE"
        else:
            kw["type"] = _TYPES[str(f.type).split(" |")[0]]
        kw.setdefault("metavar", unit.upper() if unit else
                      ("N" if kw["type"] is int else f.name.split("_")[-1].upper()))
        if f.default is dataclasses.MISSING:
            # default_factory fields (hash_root_seed): resolved when the config is built,
            # not when the parser is, so the flag's absence keeps the field's own default.
            kw["default"] = None
        else:
            kw["default"] = default
        parser.add_argument(flag, help=_help(f, default, unit), **kw)


def flag_message(message: str) -> str:
    """A ``field: why`` message (a ValueError of :class:`EngineConfig` or of the engine)
    naming the field's flag too where its name differs from the field's,
    ``--host-cache-gib (host_cache_bytes): why``; any other message unchanged."""
    name, sep, why = message.partition(": ")
    flags = {f.name: f.metadata["flag"] for f in engine_fields() if f.metadata.get("flag")}
    flags.update({field: over[0] for field, over in _FLAG_OVERRIDES.items()})
    return f"{flags[name]} ({name}): {why}" if sep and name in flags else message


def config_from_args(args: argparse.Namespace, **overrides: Any) -> EngineConfig:
    """The :class:`EngineConfig` of parsed engine flags (those :func:`add_engine_args`
    added), with ``overrides`` (field values) on top.

    Raises:
        ValueError: an invalid value (the message names the field).
    """
    kwargs: dict[str, Any] = {}
    for f in engine_fields():
        override = _FLAG_OVERRIDES.get(f.name)
        dest = _dest(override[0]) if override else f.name
        if not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        if value is None and f.default is dataclasses.MISSING:
            continue  # the field's default_factory decides
        kwargs[f.name] = int(value * override[2]) if override else value
    kwargs.update(overrides)
    return EngineConfig(**kwargs)


__all__ = ["add_engine_args", "config_from_args", "engine_fields", "flag_message"]
