"""Write a random-weight Hugging Face model as a GGUF file the way llama.cpp's converter
lays it out (tensor names, metadata keys, the Llama Q/K row permutation, Gemma's ``1 + w``
norms, Phi-3's fused tensors and LongRoPE factor tensors), with the PyPI ``gguf`` package.
Test scaffolding: weights in ``F32``, ``F16`` or ``Q8_0`` (the gguf package's own
quantizer)."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import transformers

GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
          "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
ARCH_LAYER = {"gemma3": {"post_attention_layernorm": "post_attention_norm",
                         "pre_feedforward_layernorm": "ffn_norm",
                         "post_feedforward_layernorm": "post_ffw_norm"}}
ARCHS = {"mistral": "llama", "gemma3_text": "gemma3"}


def gguf_name(hf_key: str, arch: str = "llama") -> str:
    if hf_key in GLOBAL:
        return GLOBAL[hf_key]
    _, _, n, rest = hf_key.split(".", 3)  # model.layers.N.self_attn.q_proj.weight
    module, kind = rest.rsplit(".", 1)
    names = {**LAYER, **ARCH_LAYER.get(arch, {})}
    return f"blk.{n}.{names[module]}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Llama Q/K rows."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_family_gguf(hf: transformers.PreTrainedModel, path: Path, qtype: str = "F32"
                      ) -> Path:
    """Write ``hf`` (a Llama, Qwen2, Qwen3, Gemma 3 or Phi-3 model) to ``path``: 2-D
    weights in ``qtype``, norms and biases in F32."""
    c = hf.config
    arch = ARCHS.get(c.model_type, c.model_type)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if c.model_type != "gemma3_text":
        w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(c.vocab_size)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    rope = c.rope_parameters
    if arch == "gemma3":
        w.add_sliding_window(c.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
        if c.final_logit_softcapping is not None:
            w.add_final_logit_softcapping(c.final_logit_softcapping)
        rope = c.rope_parameters["full_attention"]
        w.add_rope_freq_base(rope["rope_theta"])
        if rope["rope_type"] == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rope["factor"])
    if arch == "phi3":
        rot = int(head_dim * rope.get("partial_rotary_factor", 1.0))
        w.add_rope_dimension_count(rot)
        if rope["rope_type"] == "longrope":
            original = c.original_max_position_embeddings
            w.add_rope_scaling_orig_ctx_len(original)
            factor = c.max_position_embeddings / original
            w.add_rope_scaling_attn_factors(
                (1 + np.log(factor) / np.log(original)) ** 0.5 if factor > 1 else 1.0)
            w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
            w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
    for hf_key, t in hf.state_dict().items():
        if hf_key == "lm_head.weight" and c.tie_word_embeddings:
            continue
        a = t.detach().float().numpy()
        if arch == "llama" and ".q_proj." in hf_key:
            a = permute(a, c.num_attention_heads)
        elif arch == "llama" and ".k_proj." in hf_key:
            a = permute(a, c.num_key_value_heads)
        if arch == "gemma3" and hf_key.endswith("norm.weight"):
            a = a + 1.0  # llama.cpp stores Gemma's (1 + w)
        if a.ndim == 2 and qtype == "F16":
            a = a.astype(np.float16)
        if a.ndim == 2 and qtype == "Q8_0":
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(gguf_name(hf_key, arch), gguf.quants.quantize(a, q8), raw_dtype=q8)
            continue
        w.add_tensor(gguf_name(hf_key, arch), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
