"""The compute backend is chosen once, at load, from ``EngineConfig.compute_backend``
(``--compute-backend``): the engine's model runs on it, its KV pool is allocated by it,
bad choices are refused naming the setting, and no ``PREFIXCACHE_*`` environment variable
is read while requests run."""
from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.cli import build_parser
from prefixcache.config import EngineConfig
from prefixcache.engine.args import config_from_args
from prefixcache.model.backend import TorchBackend
from prefixcache.model.cpu.backend import CpuKernelBackend
from prefixcache.model.cpu.kernels import build

PARAMS = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": list(range(3, 40))}, {"prompt_token_ids": list(range(5, 22))}]


class SpyEnviron(MutableMapping[str, str]):
    """``os.environ`` recording every key read (``[]``, ``get``, ``in``)."""

    def __init__(self, env: MutableMapping[str, str]):
        self.env = env
        self.read: list[str] = []

    def __getitem__(self, key: str) -> str:
        self.read.append(key)
        return self.env[key]

    def __contains__(self, key: object) -> bool:
        self.read.append(str(key))
        return key in self.env

    def __setitem__(self, key: str, value: str) -> None:
        self.env[key] = value

    def __delitem__(self, key: str) -> None:
        del self.env[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.env)

    def __len__(self) -> int:
        return len(self.env)

    def copy(self) -> dict[str, str]:
        return dict(self.env)


@pytest.mark.parametrize("backend", ["torch", "cpu", "cpu-kernels"])
def test_no_environment_variable_is_read_after_load(hf_models, monkeypatch, backend):
    llm = LLM(hf_models["llama"].path, block_size=16, num_pages=64, compute_backend=backend)
    want = llm.generate(PROMPTS, PARAMS)  # warm: anything done once is done
    spy = SpyEnviron(os.environ)
    monkeypatch.setattr(os, "environ", spy)
    got = llm.generate(PROMPTS, PARAMS)
    monkeypatch.undo()
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert len(got[0].outputs[0].token_ids) == 5
    assert [k for k in spy.read if k.startswith("PREFIXCACHE_")] == []
    # the spy sees reads: the same call at load time reads the kernel switch
    monkeypatch.setattr(os, "environ", spy)
    from prefixcache.model.loader import make_backend
    make_backend("auto", "cpu")
    monkeypatch.undo()
    assert "PREFIXCACHE_CPU_KERNELS" in spy.read


@pytest.mark.parametrize("backend, kind", [("torch", TorchBackend),
                                           ("cpu", CpuKernelBackend),
                                           ("cpu-kernels", CpuKernelBackend)])
def test_the_engine_runs_on_the_configured_backend(hf_models, backend, kind):
    llm = LLM(hf_models["llama"].path, block_size=16, num_pages=64, compute_backend=backend)
    model = llm.engine.model
    assert type(model.backend) is kind
    want = backend if backend != "cpu-kernels" or build.load() is not None else "cpu"
    assert model.backend.name == want
    assert all(layer.backend is model.backend for layer in model.decoder_layers)
    assert llm.engine.runner.kv.k[0].shape[0] == 64


def test_greedy_tokens_are_the_same_on_every_backend(hf_models):
    tokens = {}
    for backend in ("torch", "cpu", "cpu-kernels"):
        llm = LLM(hf_models["llama"].path, block_size=16, num_pages=64,
                  compute_backend=backend)
        tokens[backend] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]
    assert tokens["cpu"] == tokens["torch"] and tokens["cpu-kernels"] == tokens["torch"]
    ref = hf_models["llama"].greedy(PROMPTS[0]["prompt_token_ids"], 5)[0]
    assert tokens["torch"][0] == ref


def test_bad_choices_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match="compute_backend: must be one of auto, torch, cpu, "
                                         "cpu-kernels, got 'fast'"):
        EngineConfig(compute_backend="fast")
    assert EngineConfig(compute_backend="cpu-kernels").compute_backend == "cpu-kernels"


def test_the_flag_sets_the_field():
    parser = build_parser(["generate"])
    args = parser.parse_args(["generate", "--compute-backend", "torch", "hi"])
    assert config_from_args(args).compute_backend == "torch"
    assert config_from_args(parser.parse_args(["generate", "hi"])).compute_backend == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--compute-backend", "fast", "hi"])
