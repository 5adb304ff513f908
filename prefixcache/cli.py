"""``prefixcache COMMAND``: the command line (``python -m prefixcache`` too).

Each subcommand lives in its own package and is imported only when used, so
``prefixcache analyze`` never loads torch models. Engine flags are the same in every
command that builds an engine (``prefixcache/engine/args.py``). Every parser is a
:class:`CLIParser`: no abbreviated flags, each flag's help shows its default, and a
usage error is two lines on stderr, the error with its hint first, then a one-line usage
(``--help`` gives the full one); the exit status is 2. The hint for an unknown flag is the
closest flag of that subcommand (difflib), or, when the flag belongs to other subcommands
only, which ones.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.metadata
import sys
from typing import Any, NoReturn

import prefixcache.progress  # noqa: F401  (first import: the start-up clock starts)

# subcommand -> module exposing add_parser(subparsers) and run(args) -> int
SUBCOMMANDS = {
    "generate": "prefixcache.engine.cli",
    "demo": "prefixcache.engine.demo",
    "serve": "prefixcache.server.cli",
    "router": "prefixcache.router.cli",
    "deploy-ray": "prefixcache.deploy.ray.cli",
    "bench": "prefixcache.bench.cli",
    "bench-cache": "prefixcache.bench.cache_core",
    "bench-engine": "prefixcache.bench.engine_perf",
    "gateway": "prefixcache.gateway.cli",
    "analyze": "prefixcache.analyze.cli",
}

DESCRIPTION = ("An LLM inference engine and OpenAI-compatible server built around automatic "
               "prefix caching, with its benchmarks and a request-log analyzer. Commands: "
               + ", ".join(SUBCOMMANDS) + ". Run `prefixcache COMMAND --help` for a "
               "command's flags.")
INTERRUPTED = 130  # the shell's status for SIGINT (128 + 2)


def version() -> str:
    """The installed distribution's version (``"unknown"`` when run from a bare tree)."""
    try:
        return importlib.metadata.version("prefixcache")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to a flag's help unless the help already names its
    default; switches (``store_true`` and the like) are off unless given and show none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text.lower() or action.default is argparse.SUPPRESS
                or not action.option_strings or action.nargs == 0):
            return text
        shown = "none" if action.default is None else "%(default)s"
        return f"{text} (default: {shown})" if text else f"default: {shown}"


class RawDefaultsFormatter(DefaultsFormatter, argparse.RawDescriptionHelpFormatter):
    """:class:`DefaultsFormatter` keeping the description's own line breaks."""


class CLIParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` with no abbreviations (``--max-token`` is an error, not
    ``--max-tokens``), the defaults in the help, and a hint for an unknown flag.
    ``formatter_class=RawDescriptionHelpFormatter`` becomes :class:`RawDefaultsFormatter`,
    any other :class:`DefaultsFormatter`."""

    def __init__(self, *args: Any, **kwargs: Any):
        raw = kwargs.get("formatter_class") is argparse.RawDescriptionHelpFormatter
        kwargs["formatter_class"] = RawDefaultsFormatter if raw else DefaultsFormatter
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Prints ``PROG: error: MESSAGE`` then the one-line usage, exits 2."""
        sys.stderr.write(f"{self.prog}: error: {message}\n{self.short_usage()}\n")
        sys.exit(2)

    def short_usage(self) -> str:
        """``usage: PROG REQUIRED... [flags] POSITIONALS (PROG --help lists the flags)``."""
        fmt = self._get_formatter()
        words = [self.prog]
        for a in self._actions:
            if a.option_strings and a.required:
                metavar = fmt._format_args(a, fmt._get_default_metavar_for_optional(a))
                words.append(f"{a.option_strings[0]} {metavar}".strip())
        words.append("[flags]")
        for a in self._actions:
            if not a.option_strings:
                words.append(fmt._format_args(a, fmt._get_default_metavar_for_positional(a)))
        return f"usage: {' '.join(words)} (`{self.prog} --help` lists the flags)"

    def parse_known_args(self, args=None, namespace=None):
        # Extra arguments are this parser's error (its usage, not the top level's).
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self.unknown_message(extras))
        check = getattr(ns, "_check_args", None)  # checks across flags (engine/args.py)
        problem = check(ns) if callable(check) else None
        if problem:
            self.error(problem)
        return ns, extras

    def unknown_message(self, extras: list[str]) -> str:
        """``unrecognized arguments: ...`` with a hint for the first unknown flag: the
        flag of another subcommand only (``--max-tokens is a flag of generate, not of
        serve``), else ``did you mean --x?`` for the closest flag of this parser
        (difflib)."""
        msg = "unrecognized arguments: " + " ".join(extras)
        known = [s for a in self._actions for s in a.option_strings]
        for word in extras:
            if not word.startswith("-"):
                continue
            flag = word.split("=", 1)[0]
            command = self.prog.split()[-1]
            owners = [c for c in _flag_owners(flag) if c != command]
            if owners and command in SUBCOMMANDS:
                return f"{msg}; {flag} is a flag of {', '.join(owners)}, not of {command}"
            close = difflib.get_close_matches(flag, known, n=1)
            if close:
                return f"{msg}; did you mean {close[0]}?"
        return msg


def _flag_owners(flag: str) -> list[str]:
    """The subcommands that have ``flag`` (each is loaded: called on a usage error only)."""
    owners = []
    for name, module in SUBCOMMANDS.items():
        sub = CLIParser(prog="prefixcache").add_subparsers(parser_class=CLIParser)
        try:
            parser = importlib.import_module(module).add_parser(sub)
        except ImportError:  # an optional part that is not installed
            continue
        if flag in parser._option_string_actions:
            owners.append(name)
    return owners


def build_parser(argv: list[str]) -> CLIParser:
    """The parser of ``argv``'s subcommand; the other subcommands are listed, not loaded
    (a ``--help`` without one loads them all)."""
    parser = CLIParser(prog="prefixcache", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"prefixcache {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=CLIParser)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, module in SUBCOMMANDS.items():
        if wanted in SUBCOMMANDS and name != wanted:
            sub.add_parser(name)  # listed, not loaded
            continue
        mod = importlib.import_module(module)  # a broken import shows its traceback
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def _named(exc: BaseException) -> str:
    """``exc``'s message; an engine field's error also names its flag (when an engine
    command ran, so ``engine/args.py`` is loaded; other commands never import torch)."""
    args_mod = sys.modules.get("prefixcache.engine.args")
    return args_mod.flag_message(str(exc)) if args_mod else str(exc)


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand. A user error (a bad parameter, a missing file or data folder:
    ``ValueError``, ``OSError``) prints one line, ``prefixcache CMD: error: ...``, and
    returns 2, as argparse does; Ctrl-C (``KeyboardInterrupt``) returns 130 with no
    traceback; anything else is a bug and keeps its traceback."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)
        try:
            return int(args._run(args) or 0)
        except (ValueError, OSError) as exc:
            print(f"prefixcache {args.command}: error: {_named(exc)}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)  # end the line the terminal's ^C is on
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
