"""EngineConfig as the one definition of the engine's options: dtype aliases resolved once,
no process-global side effect unless asked, the hash seed visible in the config, and the
context length taken from (and checked against) the model's config."""
from __future__ import annotations

import logging

import pytest
import torch

from helpers.hf_models import make_hf_model, save_hf_model
from prefixcache import LLM, SamplingParams
from prefixcache.cache.hashing import DEFAULT_ROOT_SEED
from prefixcache.config import DEFAULT_HASH_ROOT_SEED, DTYPES, EngineConfig
from prefixcache.engine.engine import LLMEngine

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny HF Llama with max_position_embeddings 512."""
    return save_hf_model(make_hf_model("llama"), tmp_path_factory.mktemp("llama"))


@pytest.mark.parametrize("alias,canonical", [("bf16", "bfloat16"), ("BFloat16", "bfloat16"),
                                             ("fp16", "float16"), ("half", "float16"),
                                             ("float", "float32"), ("fp32", "float32")])
def test_dtype_aliases_are_canonicalized(alias, canonical):
    c = EngineConfig(dtype=alias)
    assert c.dtype == canonical and c.torch_dtype == DTYPES[canonical]


def test_engine_with_a_dtype_alias_runs_in_that_dtype():
    llm = LLM("builtin:tiny", dtype="bf16", num_pages=32)
    engine = llm.engine
    assert engine.config.dtype == "bfloat16"
    assert engine.model.dtype == torch.bfloat16 and engine.model.embed.dtype == torch.bfloat16
    assert engine.runner.kv.k[0].dtype == torch.bfloat16
    ref = LLM("builtin:tiny", dtype="bfloat16", num_pages=32)
    prompt = [{"prompt_token_ids": [1, 72, 101, 108, 108, 111]}]
    assert (llm.generate(prompt, GREEDY)[0].outputs[0].token_ids
            == ref.generate(prompt, GREEDY)[0].outputs[0].token_ids)


@pytest.mark.parametrize("bad", ["float64", "auto", "int8", torch.int8])
def test_unsupported_dtype_names_the_parameter(bad):
    with pytest.raises(ValueError, match=r"^dtype: unsupported dtype .*bf16"):
        EngineConfig(dtype=bad)


@pytest.mark.parametrize("field,value", [("num_threads", 0), ("max_waiting_requests", -1),
                                         ("hash_root_seed", ""), ("block_size", 0)])
def test_out_of_range_fields_are_named(field, value):
    with pytest.raises(ValueError, match=f"^{field}: "):
        EngineConfig(**{field: value})


def test_threads_are_set_only_when_asked():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        LLMEngine(EngineConfig(num_pages=8))
        assert torch.get_num_threads() == 1
        LLMEngine(EngineConfig(num_pages=8, num_threads=2))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_hash_seed_from_the_environment_shows_in_the_config(monkeypatch):
    monkeypatch.delenv("PREFIXCACHE_HASH_SEED", raising=False)
    assert EngineConfig().hash_root_seed == DEFAULT_HASH_ROOT_SEED
    assert DEFAULT_HASH_ROOT_SEED.encode() == DEFAULT_ROOT_SEED
    monkeypatch.setenv("PREFIXCACHE_HASH_SEED", "seed-a")
    config = EngineConfig(num_pages=8)
    assert config.hash_root_seed == "seed-a"
    assert EngineConfig(hash_root_seed="explicit").hash_root_seed == "explicit"
    # read when the config is built: a later change of the environment does not reach
    # an engine built from it, so the config alone determines the cache keys
    monkeypatch.setenv("PREFIXCACHE_HASH_SEED", "seed-b")
    engine = LLMEngine(config)
    assert engine.cache.hasher.root_seed == b"seed-a"


def test_hf_dir_context_length_is_the_default(llama_dir):
    engine = LLM(str(llama_dir)).engine
    assert engine.model_config.context_length == 512 and engine.max_model_len == 512
    # the KV pool still caps it, and says so
    small = LLM(str(llama_dir), num_pages=8, block_size=16).engine
    assert small.max_model_len == 128


def test_longer_max_model_len_is_refused_naming_both_numbers(llama_dir):
    with pytest.raises(ValueError) as e:
        LLM(str(llama_dir), max_model_len=1024)
    assert str(e.value).startswith("max_model_len: 1024 tokens is longer than the model's "
                                   "context length of 512 tokens")
    assert "allow_long_context" in str(e.value)


def test_allow_long_context_keeps_the_value_and_warns(llama_dir, caplog):
    with caplog.at_level(logging.WARNING):
        llm = LLM(str(llama_dir), max_model_len=1024, allow_long_context=True)
    assert llm.engine.max_model_len == 1024
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "1024" in warnings[0].message
    assert "512" in warnings[0].message
    out = llm.generate([{"prompt_token_ids": [5] * 600}], GREEDY)[0]
    assert len(out.prompt_token_ids) == 600 and len(out.outputs[0].token_ids) == 4
