"""Bad values found when the project was tried as a new user would: each is a clear error
naming the flag or parameter (exit 2 on the command line), never a traceback."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

from prefixcache.cli import main
from prefixcache.config import EngineConfig
from prefixcache.http.flags import check_port
from prefixcache.model import gguf_cache


@pytest.mark.parametrize("argv,flag", [
    (["demo", "--model", "builtin:tiny", "--burst", "0"], "--burst"),
    (["demo", "--model", "builtin:tiny", "--max-tokens", "-1"], "--max-tokens"),
    (["bench-cache", "hash-speed", "--block-size", "0"], "--block-size"),
    (["bench-cache", "hash-speed", "--prompt-tokens", "0"], "--prompt-tokens"),
    (["bench-cache", "hash-speed", "--runs", "0"], "--runs"),
    (["bench-cache", "mooncake", "--limit", "0"], "--limit"),
    (["bench-cache", "mooncake", "--concurrency", "0"], "--concurrency"),
    (["bench", "--concurrency", "0"], "--concurrency/-c"),
    (["bench", "--threads", "-1"], "--threads"),  # 0: each engine's default
])
def test_counts_below_one_are_argparse_errors_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be >= 1" in err and "Traceback" not in err


@pytest.mark.parametrize("device", ["meta", "xla"])
def test_devices_other_than_cpu_and_cuda_are_refused(device):
    with pytest.raises(ValueError, match="^device: "):
        EngineConfig(device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_device_error():
    with pytest.raises(ValueError, match="device: 'cuda' asked for, but .* no CUDA"):
        EngineConfig(device="cuda")


@pytest.mark.parametrize("seed", [1 << 64, -(1 << 63) - 1])
def test_the_engine_seed_must_fit_in_64_bits(seed):
    with pytest.raises(ValueError, match="^seed: must fit in 64 bits"):
        EngineConfig(seed=seed)
    EngineConfig(seed=(1 << 64) - 1)  # the largest torch accepts


def test_generate_names_a_seed_that_does_not_fit(capsys):
    assert main(["generate", "--model", "builtin:tiny", "--seed", str(1 << 70), "x"]) == 2
    assert "seed: must fit in 64 bits" in capsys.readouterr().err


@pytest.mark.parametrize("port", [65536, 99999, -1])
def test_a_port_out_of_range_is_named(port):
    with pytest.raises(ValueError, match=f"--port must be 0-65535, got {port}"):
        check_port("127.0.0.1", port)


@pytest.mark.parametrize("index", ["[]", '"x"', "3", '{"%s": []}', '{"%s": {"size": 1}}'])
def test_a_damaged_sha_index_is_rebuilt(tmp_path, index):
    f = tmp_path / "weights.gguf"
    f.write_bytes(b"GGUF" + bytes(60))
    root = tmp_path / "cache"
    root.mkdir()
    text = index % str(f.resolve()) if "%s" in index else index
    (root / "sha256.json").write_text(text)
    sha = gguf_cache.file_sha256(f, root)
    assert sha == gguf_cache.file_sha256(f, root)
    assert sha == hashlib.sha256(f.read_bytes()).hexdigest()
    entry = json.loads((root / "sha256.json").read_text())[str(f.resolve())]
    assert entry["sha256"] == sha and entry["size"] == 64
