"""``prefixcache generate | serve | bench | bench-cache | analyze | demo``.

Each subcommand lives in its own package and is imported only when used, so
``prefixcache analyze`` never loads torch models. Engine flags are the same in every
command that builds an engine (``prefixcache/engine/args.py``).
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module exposing add_parser(subparsers) and run(args) -> int
SUBCOMMANDS = {
    "generate": "prefixcache.engine.cli",
    "demo": "prefixcache.engine.demo",
    "serve": "prefixcache.server.cli",
    "bench": "prefixcache.bench.cli",
    "bench-cache": "prefixcache.bench.cache_core",
    "bench-engine": "prefixcache.bench.engine_perf",
    "analyze": "prefixcache.analyze.cli",
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prefixcache", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, module in SUBCOMMANDS.items():
        if wanted in SUBCOMMANDS and name != wanted:
            sub.add_parser(name)  # listed, not loaded
            continue
        mod = importlib.import_module(module)  # a broken import shows its traceback
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand. A user error (a bad parameter, a missing file or data folder:
    ``ValueError``, ``OSError``) prints one line, ``prefixcache CMD: error: ...``, and
    returns 2, as argparse does; anything else is a bug and keeps its traceback."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (ValueError, OSError) as exc:
        print(f"prefixcache {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
