"""``builtin:tiny``: a model that needs no files, so the demo and tests run anywhere.

The weights are **random** (seeded, identical on every run and machine): the model has
learnt nothing and its text is gibberish. It exercises the whole engine (paging, prefix
caching, sampling, streaming, chat) at the cost of a small Llama:
hidden 256, 4 layers, 8 heads, 4 KV heads, intermediate 704, vocab 272, 4,096 positions,
untied embeddings (3.09M parameters). Two touches keep its output visible: the
embedding and ``lm_head`` rows of the padding ids are zero (their logit is exactly 0, so
greedy decoding never picks them), and those of printable ASCII and newline are scaled by
3 (so more of the gibberish is readable characters rather than stray UTF-8 bytes).

Its tokenizer is byte-level: ids 0-255 are the UTF-8 bytes, then special tokens
``<bos>`` (256), ``<eos>`` (257), ``<|system|>`` (258), ``<|user|>`` (259),
``<|assistant|>`` (260), ``<|tool|>`` (261), ``<|end|>`` (262); ids 263-271 pad the
vocabulary to a multiple of 16 and decode to nothing. Chat template
(:data:`CHAT_TEMPLATE`)::

    <bos><|system|>{tools as JSON}<|end|><|user|>{content}<|end|><|assistant|>

one ``<|role|>content<|end|>`` block per message (the tools block only when tools are
given); ``<|assistant|>`` is appended for the generation prompt. ``<eos>`` and ``<|end|>``
both end generation.
"""
from __future__ import annotations

import torch

from prefixcache.model.backend import ComputeBackend
from prefixcache.model.config import ModelConfig
from prefixcache.model.llama import PagedLlama
from prefixcache.model.weights import expected_hf_keys, load_hf_weights
from prefixcache.text.byte_tokenizer import ByteTokenizer

SEED = 20240601
INIT_STD = 0.02
VOCAB_SIZE = 272   # 263 used ids, padded to a multiple of 16
NUM_USED_IDS = 263
PRINTABLE_SCALE = 3.0
SPECIAL_TOKENS = ("<bos>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>",
                  "<|end|>")
BOS_ID, EOS_ID, END_ID = 256, 257, 262

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>Tools: {{ tools | tojson }}<|end|>{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{{ part['text'] if part['text'] is defined else '' }}{% endfor %}{% endif %}"
    "{% if message['tool_calls'] is defined %}{{ message['tool_calls'] | tojson }}{% endif %}"
    "<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_config() -> ModelConfig:
    """The builtin model's hyper-parameters."""
    return ModelConfig(
        architecture="LlamaForCausalLM", hidden_size=256, intermediate_size=704,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
        vocab_size=VOCAB_SIZE,
        rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096,
        tie_word_embeddings=False, bos_token_id=BOS_ID, eos_token_ids=(EOS_ID, END_ID),
        torch_dtype="float32")


def tiny_weights() -> dict[str, torch.Tensor]:
    """HF-named float32 CPU weights: norms 1, everything else N(0, 0.02) drawn from one
    seeded generator in sorted-name order (so every run and machine gets the same bits);
    then the padding rows of the embedding and ``lm_head`` zeroed and their printable
    ASCII rows scaled."""
    gen = torch.Generator(device="cpu").manual_seed(SEED)
    shapes = _hf_shapes(tiny_config())
    out = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shapes[name])
        else:
            out[name] = torch.normal(0.0, INIT_STD, shapes[name], generator=gen)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        out[name][NUM_USED_IDS:] = 0.0
        out[name][[10, *range(32, 127)]] *= PRINTABLE_SCALE
    return out


def _hf_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, h, i = c.head_dim, c.hidden_size, c.intermediate_size
    shapes = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,),
              "lm_head.weight": (c.vocab_size, h)}
    for n in range(c.num_hidden_layers):
        pre = f"model.layers.{n}."
        shapes.update({
            pre + "input_layernorm.weight": (h,), pre + "post_attention_layernorm.weight": (h,),
            pre + "self_attn.q_proj.weight": (c.num_attention_heads * d, h),
            pre + "self_attn.k_proj.weight": (c.num_key_value_heads * d, h),
            pre + "self_attn.v_proj.weight": (c.num_key_value_heads * d, h),
            pre + "self_attn.o_proj.weight": (h, c.num_attention_heads * d),
            pre + "mlp.gate_proj.weight": (i, h), pre + "mlp.up_proj.weight": (i, h),
            pre + "mlp.down_proj.weight": (h, i)})
    return shapes


def build_tiny_model(device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.float32,
                     backend: ComputeBackend | None = None) -> PagedLlama:
    """The builtin model on ``device`` in ``dtype`` (weights generated on CPU, then moved),
    running on ``backend`` (default: plain torch)."""
    model = PagedLlama(tiny_config(), device, dtype, backend)
    weights = tiny_weights()
    assert set(weights) == expected_hf_keys(model)
    load_hf_weights(model, weights.__getitem__)
    return model


def tiny_tokenizer() -> ByteTokenizer:
    """The builtin model's tokenizer: bytes, :data:`SPECIAL_TOKENS` from id 256, padded to
    :data:`VOCAB_SIZE`; ``<bos>`` begins a sequence, ``<eos>`` and ``<|end|>`` end one;
    chat template :data:`CHAT_TEMPLATE`."""
    return ByteTokenizer(SPECIAL_TOKENS, bos_token="<bos>", eos_tokens=("<eos>", "<|end|>"),
                         vocab_size=VOCAB_SIZE, chat_template=CHAT_TEMPLATE,
                         name="builtin:tiny")
