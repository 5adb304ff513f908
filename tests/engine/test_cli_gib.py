"""GiB-valued engine flags (``--kv-cache-gib``, ``--host-cache-gib``, ``--disk-cache-gib``):
nan, inf, negatives and a host budget above the physical RAM are argparse errors naming the
flag, in every engine command."""
from __future__ import annotations

import subprocess
import sys

import pytest

from prefixcache.cli import build_parser
from prefixcache.engine import args as engine_args
from prefixcache.engine.args import GIB, config_from_args

FLAGS = ("--kv-cache-gib", "--host-cache-gib", "--disk-cache-gib")


def _error(capsys, command: str, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        build_parser([command]).parse_args([command, *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("value,why", [
    ("nan", "must be a finite number of GiB, got 'nan'"),
    ("inf", "must be a finite number of GiB, got 'inf'"),
    ("-inf", "must be a finite number of GiB, got '-inf'"),
    ("-1", "must be >= 0, got '-1'"),
    ("lots", "must be a number of GiB, got 'lots'")])
def test_bad_gib_values_name_the_flag(flag, value, why, capsys):
    line = _error(capsys, "serve", f"{flag}={value}")  # "=": "-1" is not an option
    assert line == f"prefixcache serve: error: argument {flag}: {why}"


@pytest.mark.parametrize("command", ["generate", "demo", "bench"])
def test_every_engine_command_checks_gib_flags(command, capsys):
    assert "argument --kv-cache-gib: must be a finite" in _error(
        capsys, command, "--kv-cache-gib", "nan")


def test_host_budget_above_physical_ram_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(engine_args, "physical_ram_bytes", lambda: 16 * GIB)
    line = _error(capsys, "serve", "--host-cache-gib", "100000")
    assert line == ("prefixcache serve: error: argument --host-cache-gib: 100000 GiB is "
                    "more than this machine's physical RAM (16.00 GiB)")
    args = build_parser(["serve"]).parse_args(["serve", "--host-cache-gib", "16"])
    assert config_from_args(args).host_cache_bytes == 16 * GIB  # the RAM itself is fine
    # A disk budget is not bounded by RAM (nor by free space: that only warns).
    args = build_parser(["serve"]).parse_args(["serve", "--disk-cache-gib", "100000"])
    assert config_from_args(args).disk_cache_bytes == 100000 * GIB


def test_physical_ram_is_the_sysconf_product():
    ram = engine_args.physical_ram_bytes()
    assert ram is not None and ram > 1 << 20


def test_cli_prints_one_usage_error_not_a_traceback():
    r = subprocess.run([sys.executable, "-m", "prefixcache.cli", "serve", "--host-cache-gib",
                        "inf"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "prefixcache serve: error: argument --host-cache-gib: must be a finite number of "
        "GiB, got 'inf'")
