"""ModelConfig parsing of Hugging Face config.json files (both generations), and RoPE."""
from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch
import transformers

from prefixcache.model.config import ModelConfig, RopeScaling
from prefixcache.model.rope import RotaryEmbedding, apply_rope, inverse_frequencies

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "vocab_size": 1000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
         "bos_token_id": 1, "eos_token_id": [2, 7], "torch_dtype": "bfloat16"}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_llama_fields():
    c = ModelConfig.from_dict(dict(LLAMA, rope_theta=500000.0))
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim) == (256, 4, 8, 2, 32)
    assert c.num_queries_per_kv == 4
    assert c.rope_theta == 500000.0 and c.rope_scaling == RopeScaling()
    assert c.eos_token_ids == (2, 7) and c.bos_token_id == 1
    assert c.torch_dtype == "bfloat16" and not c.tie_word_embeddings
    assert not (c.qkv_bias or c.o_bias or c.mlp_bias)
    assert c.sliding_window is None and c.layer_sliding_windows == (None,) * 4


def test_explicit_head_dim_wins():
    assert ModelConfig.from_dict(dict(LLAMA, head_dim=64)).head_dim == 64


@pytest.mark.parametrize("style", ["rope_parameters", "legacy"])
def test_llama3_rope_both_generations(style):
    if style == "rope_parameters":
        cfg = dict(LLAMA, rope_parameters=dict(LLAMA3, rope_theta=500000.0))
    else:
        cfg = dict(LLAMA, rope_theta=500000.0, rope_scaling=dict(LLAMA3))
    c = ModelConfig.from_dict(cfg)
    assert c.rope_theta == 500000.0
    assert c.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)


def test_legacy_type_key_and_linear_scaling():
    c = ModelConfig.from_dict(dict(LLAMA, rope_scaling={"type": "linear", "factor": 2.0}))
    assert c.rope_scaling == RopeScaling("linear", 2.0)
    plain = ModelConfig.from_dict(dict(LLAMA, rope_parameters={"rope_type": "default",
                                                               "rope_theta": 1e4}))
    assert plain.rope_scaling.rope_type == "default"


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
def test_unsupported_rope_type_names_the_key(key):
    with pytest.raises(ValueError, match=rf"{key}\.rope_type.*yarn"):
        ModelConfig.from_dict(dict(LLAMA, **{key: {"rope_type": "yarn", "factor": 4.0}}))


def test_unsupported_architecture_and_activation():
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        ModelConfig.from_dict(dict(LLAMA, architectures=["GPT2LMHeadModel"]))
    with pytest.raises(ValueError, match="hidden_act"):
        ModelConfig.from_dict(dict(LLAMA, hidden_act="gelu"))
    with pytest.raises(ValueError, match="'vocab_size'"):
        ModelConfig.from_dict({k: v for k, v in LLAMA.items() if k != "vocab_size"})


def test_biases_per_architecture():
    qwen = ModelConfig.from_dict(dict(LLAMA, architectures=["Qwen2ForCausalLM"]))
    assert qwen.qkv_bias and not qwen.o_bias
    llama = ModelConfig.from_dict(dict(LLAMA, attention_bias=True, mlp_bias=True))
    assert llama.qkv_bias and llama.o_bias and llama.mlp_bias


def test_sliding_windows():
    mistral = dict(LLAMA, architectures=["MistralForCausalLM"])
    assert ModelConfig.from_dict(dict(mistral, sliding_window=None)).sliding_window is None
    assert ModelConfig.from_dict(dict(mistral, sliding_window=4096)).sliding_window is None
    c = ModelConfig.from_dict(dict(mistral, sliding_window=1024))
    assert c.sliding_window == 1024 and c.layer_sliding_windows == (1024,) * 4
    qwen = dict(LLAMA, architectures=["Qwen2ForCausalLM"], sliding_window=1024)
    assert ModelConfig.from_dict(qwen).sliding_window is None  # use_sliding_window false
    q = ModelConfig.from_dict(dict(qwen, use_sliding_window=True, max_window_layers=2))
    assert q.layer_sliding_windows == (None, None, 1024, 1024)


def test_transformers_written_configs_parse(tmp_path):
    for cfg in (transformers.LlamaConfig(num_hidden_layers=2, rope_scaling=dict(LLAMA3)),
                transformers.Qwen2Config(num_hidden_layers=2),
                transformers.MistralConfig(num_hidden_layers=2)):
        arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "mistral": "MistralForCausalLM"}[cfg.model_type]
        cfg.architectures = [arch]
        cfg.save_pretrained(tmp_path / arch)
        c = ModelConfig.from_file(tmp_path / arch / "config.json")
        assert c.architecture == arch
        assert c.hidden_size == cfg.hidden_size and c.num_hidden_layers == 2
        assert c.rope_theta == cfg.rope_parameters["rope_theta"]
        raw = json.loads((tmp_path / arch / "config.json").read_text())
        assert "rope_parameters" in raw


def test_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_file(tmp_path / "config.json")


@pytest.mark.parametrize("scaling", [None, LLAMA3, {"rope_type": "linear", "factor": 4.0}])
def test_inverse_frequencies_match_transformers(scaling):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hc = transformers.LlamaConfig(hidden_size=512, num_attention_heads=4,
                                  max_position_embeddings=131072, rope_theta=500000.0,
                                  rope_scaling=dict(scaling) if scaling else None)
    cfg = hc.to_dict()
    ours = ModelConfig.from_dict(dict(cfg, architectures=["LlamaForCausalLM"]))
    got = inverse_frequencies(ours.head_dim, ours.rope_theta, ours.rope_scaling)
    if scaling is None:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        ref = LlamaRotaryEmbedding.compute_default_rope_parameters(hc)[0]
    else:
        ref = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hc, "cpu")[0]
    torch.testing.assert_close(got, ref.float(), atol=0, rtol=1e-6)


def test_apply_rope_matches_rotate_half():
    torch.manual_seed(0)
    x = torch.randn(5, 3, 8)
    cos, sin = RotaryEmbedding(8, 10000.0, RopeScaling(), "cpu").cos_sin(
        torch.tensor([0, 3, 7, 100, 5000]), 5000, torch.float32)
    rotated = torch.cat([-x[..., 4:], x[..., :4]], dim=-1)
    ref = x * cos[:, None] + rotated * sin[:, None]
    assert torch.equal(apply_rope(x, cos, sin), ref)
    assert torch.equal(apply_rope(x[:1], cos[:1], sin[:1]), x[:1])  # position 0


def test_rope_table_bits_do_not_depend_on_growth():
    small = RotaryEmbedding(16, 10000.0, RopeScaling(), "cpu")
    small.table(10)
    big = RotaryEmbedding(16, 10000.0, RopeScaling(), "cpu")
    big.table(3000)
    small.table(3000)
    assert torch.equal(small.table(3000)[0][:3000], big.table(3000)[0][:3000])
    assert torch.equal(small.table(3000)[1][:3000], big.table(3000)[1][:3000])


@pytest.mark.parametrize("model_type,arch", [("llama", "LlamaForCausalLM"),
                                             ("mistral", "MistralForCausalLM"),
                                             ("qwen2", "Qwen2ForCausalLM")])
@pytest.mark.parametrize("archs", ["missing", "empty", "null"])
def test_architecture_from_model_type_when_architectures_is_empty(model_type, arch, archs):
    cfg = {k: v for k, v in LLAMA.items() if k != "architectures"}
    if archs != "missing":
        cfg["architectures"] = [] if archs == "empty" else None
    c = ModelConfig.from_dict(dict(cfg, model_type=model_type))
    named = ModelConfig.from_dict(dict(LLAMA, architectures=[arch]))
    assert c.architecture == arch and c == named


def test_unknown_model_type_and_named_architecture_win():
    with pytest.raises(ValueError, match=r"'model_type' is 'gpt2'.*model_type llama"):
        ModelConfig.from_dict(dict(LLAMA, architectures=[], model_type="gpt2"))
    with pytest.raises(ValueError, match="'model_type' is None"):
        ModelConfig.from_dict(dict(LLAMA, architectures=[]))
    # a named, unsupported architecture is refused even when model_type is a Llama
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        ModelConfig.from_dict(dict(LLAMA, architectures=["GPT2LMHeadModel"], model_type="llama"))


def test_context_length_from_positions_rope_window_and_tokenizer():
    assert ModelConfig.from_dict(LLAMA).context_length == 4096
    # linear RoPE checkpoints state the unscaled length; llama3 files the scaled one
    linear = ModelConfig.from_dict(dict(LLAMA, rope_scaling={"type": "linear", "factor": 4.0}))
    assert linear.context_length == 16384
    assert ModelConfig.from_dict(dict(LLAMA, rope_scaling=LLAMA3)).context_length == 4096
    # the model masks a sliding window exactly over the full KV: it does not shorten it
    mistral = ModelConfig.from_dict(dict(LLAMA, architectures=["MistralForCausalLM"],
                                         sliding_window=1024))
    assert mistral.sliding_window == 1024 and mistral.context_length == 4096
    capped = dataclasses.replace(linear, model_max_length=8192)
    assert capped.context_length == 8192
    assert dataclasses.replace(linear, model_max_length=20000).context_length == 16384


def test_max_model_len_is_checked_against_the_context_length(caplog):
    c = ModelConfig.from_dict(LLAMA)
    assert c.check_max_model_len(None) == 4096 and c.check_max_model_len(4096) == 4096
    assert c.check_max_model_len(100) == 100
    with pytest.raises(ValueError) as e:
        c.check_max_model_len(4097)
    msg = str(e.value)
    assert msg.startswith("max_model_len: 4097 tokens") and "4096 tokens" in msg
    assert "allow_long_context" in msg
    with caplog.at_level(logging.WARNING, logger="prefixcache.model.config"):
        assert c.check_max_model_len(8192, allow_long_context=True) == 8192
    (rec,) = caplog.records
    assert rec.levelno == logging.WARNING and "8192" in rec.message and "4096" in rec.message
    linear = ModelConfig.from_dict(dict(LLAMA, rope_scaling={"type": "linear", "factor": 2.0}))
    with pytest.raises(ValueError, match=r"8192 tokens \(max_position_embeddings 4096 x "
                                         r"linear RoPE factor 2\)"):
        linear.check_max_model_len(9000)


def test_from_dir_reads_model_max_length(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    assert ModelConfig.from_dir(tmp_path).model_max_length is None  # no tokenizer_config
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1e30}))
    assert ModelConfig.from_dir(tmp_path).model_max_length is None  # transformers' "unbounded"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 2048}))
    c = ModelConfig.from_dir(tmp_path)
    assert c.model_max_length == 2048 and c.context_length == 2048
    with pytest.raises(ValueError, match=r"max_model_len: 3000 tokens .* 2048 tokens \(the "
                                         r"tokenizer's model_max_length\)"):
        c.check_max_model_len(3000)
    (tmp_path / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="tokenizer_config.json is not a JSON object"):
        ModelConfig.from_dir(tmp_path)


def test_context_check_needs_only_the_model_config():
    """As a GGUF loader builds it: ``context_length`` metadata in max_position_embeddings."""
    c = ModelConfig(architecture="LlamaForCausalLM", hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=2, num_attention_heads=9, num_key_value_heads=3,
                    head_dim=64, vocab_size=49152, max_position_embeddings=8192)
    assert c.context_length == 8192 and c.check_max_model_len(None) == 8192
    with pytest.raises(ValueError, match=r"^max_model_len: 8193 tokens .* 8192 tokens"):
        c.check_max_model_len(8193)
