"""Write a random-weight Hugging Face model as a GGUF file the way llama.cpp's converter
lays it out (tensor names, metadata keys, the Llama Q/K row permutation), with the PyPI
``gguf`` package. Test scaffolding: float weights only (``F32`` or ``F16``)."""
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
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf_key: str) -> str:
    if hf_key in GLOBAL:
        return GLOBAL[hf_key]
    _, _, n, rest = hf_key.split(".", 3)  # model.layers.N.self_attn.q_proj.weight
    module, kind = rest.rsplit(".", 1)
    return f"blk.{n}.{LAYER[module]}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Llama Q/K rows."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_family_gguf(hf: transformers.PreTrainedModel, path: Path, qtype: str = "F32"
                      ) -> Path:
    """Write ``hf`` (a llama or qwen2 model) to ``path``: 2-D weights in ``qtype``, norms
    and biases in F32."""
    c = hf.config
    arch = c.model_type if c.model_type != "mistral" else "llama"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(c.vocab_size)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    for hf_key, t in hf.state_dict().items():
        if hf_key == "lm_head.weight" and c.tie_word_embeddings:
            continue
        a = t.detach().float().numpy()
        if arch == "llama" and ".q_proj." in hf_key:
            a = permute(a, c.num_attention_heads)
        elif arch == "llama" and ".k_proj." in hf_key:
            a = permute(a, c.num_key_value_heads)
        if a.ndim == 2 and qtype == "F16":
            a = a.astype(np.float16)
        w.add_tensor(gguf_name(hf_key), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
