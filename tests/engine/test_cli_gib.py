"""GiB-valued engine flags (``--kv-cache-gib``, ``--host-cache-gib``, ``--disk-cache-gib``):
nan, inf, negatives, 0 for the KV pool or disk, a host budget above the physical RAM and a
disk budget without a directory are argparse errors naming the flag, in every engine command;
the same checks hold for ``EngineConfig`` (``LLM(**kwargs)``), naming the field."""
from __future__ import annotations

import subprocess
import sys

import pytest

from prefixcache import config
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
    return err.strip().splitlines()[0]  # the error first, then a one-line usage


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
    monkeypatch.setattr(config, "physical_ram_bytes", lambda: 16 * GIB)
    line = _error(capsys, "serve", "--host-cache-gib", "100000")
    assert line == ("prefixcache serve: error: argument --host-cache-gib: 100000 GiB is "
                    "more than this machine's physical RAM (16.00 GiB)")
    args = build_parser(["serve"]).parse_args(["serve", "--host-cache-gib", "16"])
    assert config_from_args(args).host_cache_bytes == 16 * GIB  # the RAM itself is fine
    # A disk budget is not bounded by RAM (nor by free space: that only warns).
    args = build_parser(["serve"]).parse_args(["serve", "--disk-cache-gib", "100000",
                                               "--disk-cache-dir", "/tmp/unused"])
    assert config_from_args(args).disk_cache_bytes == 100000 * GIB


def test_physical_ram_is_the_sysconf_product():
    ram = engine_args.physical_ram_bytes()
    assert ram is not None and ram > 1 << 20


def test_cli_prints_one_usage_error_not_a_traceback():
    r = subprocess.run([sys.executable, "-m", "prefixcache.cli", "serve", "--host-cache-gib",
                        "inf"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[0] == (
        "prefixcache serve: error: argument --host-cache-gib: must be a finite number of "
        "GiB, got 'inf'")


@pytest.mark.parametrize("flag", ["--kv-cache-gib", "--disk-cache-gib"])
def test_zero_kv_or_disk_budget_names_the_flag(flag, capsys):
    line = _error(capsys, "serve", flag, "0", "--disk-cache-dir", "/tmp/unused")
    assert line == f"prefixcache serve: error: argument {flag}: must be > 0, got '0'"


def test_zero_host_budget_is_no_host_tier():
    args = build_parser(["serve"]).parse_args(["serve", "--host-cache-gib", "0"])
    assert config_from_args(args).host_cache_bytes == 0


@pytest.mark.parametrize("command,extra", [("serve", []), ("generate", ["hi"]),
                                           ("demo", [])])
def test_disk_budget_without_a_directory_is_a_usage_error(command, extra, capsys):
    line = _error(capsys, command, *extra, "--disk-cache-gib", "5")
    assert line == (f"prefixcache {command}: error: --disk-cache-gib needs --disk-cache-dir "
                    "(no disk tier without a directory)")
    args = build_parser([command]).parse_args([command, *extra, "--disk-cache-gib", "5",
                                               "--disk-cache-dir", "/tmp/unused"])
    assert config_from_args(args).disk_cache_bytes == 5 * GIB


def test_config_disk_budget_without_a_directory():
    with pytest.raises(ValueError) as e:
        config.EngineConfig(disk_cache_bytes=5 * GIB)
    assert str(e.value) == ("disk_cache_bytes: needs disk_cache_dir (no disk tier without a "
                            "directory)")
    assert config.EngineConfig(disk_cache_bytes=8 * GIB).disk_cache_dir is None  # the default
    assert config.EngineConfig(disk_cache_bytes=GIB, disk_cache_dir="/x").disk_cache_bytes == GIB


def test_config_host_budget_above_physical_ram(monkeypatch):
    monkeypatch.setattr(config, "physical_ram_bytes", lambda: 16 * GIB)
    with pytest.raises(ValueError) as e:
        config.EngineConfig(host_cache_bytes=1 << 50)
    assert str(e.value) == (f"host_cache_bytes: {1 << 50} bytes is more than this machine's "
                            "physical RAM (16.00 GiB)")
    assert config.EngineConfig(host_cache_bytes=16 * GIB).host_cache_bytes == 16 * GIB
