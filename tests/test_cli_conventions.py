"""The command line's conventions: no abbreviated flags, the subcommand's usage
and the closest flag for a typo, defaults in every flag's help, the top-level help,
``--version``, ``python -m prefixcache`` and a quiet Ctrl-C."""
from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from prefixcache.cli import SUBCOMMANDS, build_parser, main

REPO = Path(__file__).resolve().parents[1]


def _subparsers(argv: list[str]) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser(argv)._actions
              if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_a_typo_shows_the_subcommands_usage_and_the_closest_flag(capsys):
    err = _error(["serve", "--prot", "8000"], capsys)
    assert err.startswith("usage: prefixcache serve ")
    assert err.strip().splitlines()[-1] == (
        "prefixcache serve: error: unrecognized arguments: --prot 8000; did you mean --port?")
    err = _error(["generate", "--max-token=3", "x"], capsys)
    assert err.startswith("usage: prefixcache generate ")
    assert "did you mean --max-tokens?" in err
    # nothing close: no hint, still the subcommand's usage
    err = _error(["analyze", "log.jsonl", "--zzzzzz"], capsys)
    assert err.startswith("usage: prefixcache analyze ") and "did you mean" not in err


@pytest.mark.parametrize("argv,unknown", [
    (["generate", "--max-token", "3", "x"], "--max-token"),
    (["serve", "--po", "8000"], "--po 8000"),
    (["bench", "--work", "agent"], "--work agent"),
    (["analyze", "log.jsonl", "--block", "8"], "--block 8")])
def test_abbreviations_are_errors(argv, unknown, capsys):
    err = _error(argv, capsys)
    assert f"error: unrecognized arguments: {unknown}" in err


def test_every_parser_refuses_abbreviations():
    parsers = _subparsers(["--help"])
    assert set(parsers) == set(SUBCOMMANDS)
    assert [n for n, p in parsers.items() if p.allow_abbrev] == []
    assert build_parser(["--help"]).allow_abbrev is False


def test_every_flag_shows_its_default():
    missing = []
    for name, parser in _subparsers(["--help"]).items():
        formatter = parser._get_formatter()
        for a in parser._actions:
            if not a.option_strings or a.nargs == 0:  # positionals, switches, --help
                continue
            text = formatter._get_help_string(a) if a.help else ""
            if "default" not in text.lower():
                missing.append(f"{name} {a.option_strings[0]}")
    assert missing == []
    serve = _subparsers(["serve"])["serve"].format_help()
    assert "TCP port to listen on (default: 8000)" in " ".join(serve.split())
    assert "largest request body, bytes (413 beyond) (default: 2097152)" in " ".join(
        serve.split())
    demo = " ".join(_subparsers(["demo"])["demo"].format_help().split())
    assert "longest answer (tokens) (default: 32)" in demo


def test_top_level_help_lists_every_subcommand_without_markup(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out
    listed = out.split("positional arguments:")[1].split("options:")[0]
    assert [n for n in SUBCOMMANDS if f"\n    {n}" not in listed] == []
    description = out.split("positional arguments:")[0]
    assert "bench-engine" in description and "analyze" in description


def test_version_comes_from_the_installed_metadata(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"prefixcache {importlib.metadata.version('prefixcache')}\n"


def test_python_dash_m_prefixcache_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "prefixcache", "--version"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert done.stdout == f"prefixcache {importlib.metadata.version('prefixcache')}\n"
    done = subprocess.run([sys.executable, "-m", "prefixcache", "serve", "--prot", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "did you mean --port?" in done.stderr


def test_ctrl_c_exits_130_without_a_traceback(monkeypatch, capsys):
    import prefixcache.engine.cli as generate

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "run", interrupted)
    assert main(["generate", "--model", "builtin:tiny", "x"]) == 130
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.err.strip() == ""
    assert captured.out == ""
