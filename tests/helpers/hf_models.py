"""Tiny random Hugging Face checkpoints written to disk, for reference tests.

Test scaffolding. Each kind is a (config class, model class, config kwargs) triple; weights
come from ``torch.manual_seed(seed)`` and HF's own initialisation with a wider
``initializer_range`` so that logits are well spread (greedy choices are not near-ties).
"""
from __future__ import annotations

from pathlib import Path

import torch
import transformers

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=512, rms_norm_eps=1e-5, initializer_range=0.1)

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

KINDS = {
    # untied embeddings, GQA (4 query heads over 2 KV heads)
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(BASE, tie_word_embeddings=False)),
    # tied embeddings, Llama 3 RoPE scaling, explicit head_dim != hidden / heads
    "llama3_tied": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                    dict(BASE, tie_word_embeddings=True, head_dim=32, rope_theta=10000.0,
                         rope_scaling=LLAMA3_ROPE)),
    # Llama with attention and MLP biases
    "llama_bias": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                   dict(BASE, tie_word_embeddings=False, attention_bias=True, mlp_bias=True)),
    # q/k/v bias, no o bias
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(BASE, tie_word_embeddings=False)),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(BASE, tie_word_embeddings=False, sliding_window=None)),
    # an 8-token attention window, far below max_position_embeddings
    "mistral_window": (transformers.MistralConfig, transformers.MistralForCausalLM,
                       dict(BASE, tie_word_embeddings=False, sliding_window=8)),
    # q/k RMSNorm per head; explicit head_dim (Qwen3's default is 128)
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(BASE, tie_word_embeddings=True, head_dim=16)),
    # 3 layers: two 8-token sliding layers (local RoPE base) and a global one (its own base,
    # linear scaling); query_pre_attn_scalar != head_dim; final logit soft-capping
    "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
               dict(BASE, num_hidden_layers=3, head_dim=16, tie_word_embeddings=True,
                    sliding_window=8, query_pre_attn_scalar=24, final_logit_softcapping=5.0,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                    rope_parameters={
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "linear", "factor": 2.0,
                                           "rope_theta": 1000000.0}})),
    # fused qkv_proj / gate_up_proj, LongRoPE (prompts stay below its original length)
    "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM,
             dict(BASE, tie_word_embeddings=False, pad_token_id=None, bos_token_id=1,
                  eos_token_id=2, max_position_embeddings=1024,
                  original_max_position_embeddings=256,
                  rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                   "original_max_position_embeddings": 256,
                                   "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
                                   "long_factor": [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]})),
    # Phi-4-mini: partial rotary (12 of 16 dimensions) under LongRoPE, tied embeddings
    "phi4_mini": (transformers.Phi3Config, transformers.Phi3ForCausalLM,
                  dict(BASE, tie_word_embeddings=True, pad_token_id=None, bos_token_id=1,
                       eos_token_id=2, max_position_embeddings=1024,
                       original_max_position_embeddings=256,
                       rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                        "partial_rotary_factor": 0.75,
                                        "original_max_position_embeddings": 256,
                                        "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0],
                                        "long_factor": [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]})),
}
# kinds whose norm weights are randomised too (Gemma's start at 0, others at 1)
NOISY_NORMS = ("qwen3", "gemma3", "phi3", "phi4_mini")


def make_hf_model(kind: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A float32 eval-mode HF model of ``kind`` with seeded random weights (sdpa attention)."""
    config_cls, model_cls, kwargs = KINDS[kind]
    torch.manual_seed(seed)
    config = config_cls(**kwargs)
    config._attn_implementation = "sdpa"
    model = model_cls(config).eval()
    if kwargs.get("attention_bias") or kind == "qwen2" or kwargs.get("mlp_bias"):
        with torch.no_grad():  # HF zero-initialises biases: make them matter
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0.0, 0.1)
    if kind in NOISY_NORMS:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.add_(torch.randn_like(p) * 0.2)
    return model


def save_hf_model(model: transformers.PreTrainedModel, out: Path,
                  max_shard_size: str | None = None) -> Path:
    """``save_pretrained`` as safetensors (sharded when ``max_shard_size`` is given)."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    return out


@torch.inference_mode()
def hf_logits(model: transformers.PreTrainedModel, ids: list[int]) -> torch.Tensor:
    """float32 logits ``[len(ids), vocab]`` of one full forward (no cache)."""
    return model(torch.tensor([ids])).logits[0].float()


@torch.inference_mode()
def hf_greedy(model: transformers.PreTrainedModel, ids: list[int], steps: int) -> list[int]:
    """Greedy continuation, recomputing the whole sequence each step (no cache)."""
    ids = list(ids)
    out = []
    for _ in range(steps):
        tok = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        out.append(tok)
        ids.append(tok)
    return out
