"""Convert Karpathy's llama2.c ``stories260K`` checkpoint into a Hugging Face model dir.

Test scaffolding (not product code). Input: ``stories260K.bin`` (llama2.c legacy v0
format) and ``tok512.bin`` (llama2.c tokenizer), see the data folder's SOURCE.md. Output
directory: ``config.json`` (LlamaForCausalLM, tied embeddings), ``model.safetensors``,
``tokenizer.json`` + ``tokenizer_config.json``.

Two format differences matter:

* RoPE: llama2.c rotates adjacent pairs ``(x[2i], x[2i+1])`` of a head; Hugging Face
  rotates ``(x[i], x[i + d/2])``. Reordering the rows of ``wq``/``wk`` inside each head
  (even rows first, then odd rows) makes the two equivalent; ``q.k`` is unchanged since
  both q and k are reordered the same way.
* Tokenizer: llama2.c prepends a space, maps characters to tokens (bytes ``<0xNN>`` =
  id ``3 + byte`` when a character is unknown) and greedily merges the adjacent pair whose
  concatenation has the highest score. A ``tokenizers`` BPE model with byte fallback and
  merges ordered by the merged token's score does the same.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

SPACE = "\u2581"  # SentencePiece's visible space


def read_checkpoint(path: Path) -> tuple[dict[str, int], dict[str, torch.Tensor]]:
    """Header and HF-named float32 weights of a llama2.c v0 checkpoint."""
    raw = path.read_bytes()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack_from("<7i", raw)
    shared = vocab > 0
    vocab = abs(vocab)
    head_dim = dim // heads
    data = np.frombuffer(raw, dtype="<f4", offset=28)
    pos = 0

    def take(*shape: int) -> torch.Tensor:
        nonlocal pos
        n = int(np.prod(shape))
        out = torch.from_numpy(data[pos:pos + n].copy()).reshape(shape)
        pos += n
        return out

    embed = take(vocab, dim)
    rms_att = take(layers, dim)
    wq = take(layers, heads * head_dim, dim)
    wk = take(layers, kv_heads * head_dim, dim)
    wv = take(layers, kv_heads * head_dim, dim)
    wo = take(layers, dim, heads * head_dim)
    rms_ffn = take(layers, dim)
    w1 = take(layers, hidden, dim)
    w2 = take(layers, dim, hidden)
    w3 = take(layers, hidden, dim)
    rms_final = take(dim)
    take(seq_len, head_dim // 2)  # freq_cis_real (recomputed by the model)
    take(seq_len, head_dim // 2)  # freq_cis_imag
    classifier = None if shared else take(vocab, dim)
    assert pos == data.size, f"{path}: {data.size - pos} unread float32 values"

    def to_rotate_half(w: torch.Tensor, n_heads: int) -> torch.Tensor:
        return (w.view(n_heads, head_dim // 2, 2, dim).transpose(1, 2)
                .reshape(n_heads * head_dim, dim).contiguous())

    weights = {"model.embed_tokens.weight": embed, "model.norm.weight": rms_final}
    if classifier is not None:
        weights["lm_head.weight"] = classifier
    for i in range(layers):
        pre = f"model.layers.{i}."
        weights.update({
            pre + "input_layernorm.weight": rms_att[i],
            pre + "post_attention_layernorm.weight": rms_ffn[i],
            pre + "self_attn.q_proj.weight": to_rotate_half(wq[i], heads),
            pre + "self_attn.k_proj.weight": to_rotate_half(wk[i], kv_heads),
            pre + "self_attn.v_proj.weight": wv[i],
            pre + "self_attn.o_proj.weight": wo[i],
            pre + "mlp.gate_proj.weight": w1[i],
            pre + "mlp.down_proj.weight": w2[i],
            pre + "mlp.up_proj.weight": w3[i],
        })
    header = dict(dim=dim, hidden_dim=hidden, n_layers=layers, n_heads=heads,
                  n_kv_heads=kv_heads, vocab_size=vocab, seq_len=seq_len, shared=shared)
    return header, {k: v.contiguous() for k, v in weights.items()}


def read_tokenizer(path: Path, vocab_size: int) -> list[tuple[bytes, float]]:
    """``(piece bytes, score)`` per token id of a llama2.c ``tokenizer.bin``."""
    raw = path.read_bytes()
    off = 4  # int32 max_token_length
    out = []
    for _ in range(vocab_size):
        score, length = struct.unpack_from("<fi", raw, off)
        off += 8
        out.append((raw[off:off + length], score))
        off += length
    assert off == len(raw), f"{path}: trailing bytes"
    return out


def build_tokenizer(pieces: list[tuple[bytes, float]]):
    """A ``tokenizers.Tokenizer`` reproducing llama2.c's encode (BOS = id 1 added)."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE

    specials = {0: "<unk>", 1: "<s>", 2: "</s>"}
    vocab, scores = {}, {}
    for i, (piece, score) in enumerate(pieces):
        text = specials.get(i) or piece.decode("utf-8").replace(" ", SPACE)
        vocab[text] = i
        scores[text] = score
    # Merge (a, b) for every way of splitting a multi-character token into two tokens,
    # highest merged score first (llama2.c merges the best-scoring pair first).
    merges = []
    for token, i in vocab.items():
        if i in specials or token.startswith("<0x") or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            a, b = token[:cut], token[cut:]
            if a in vocab and b in vocab:
                merges.append((-scores[token], i, vocab[a], vocab[b], (a, b)))
    merges.sort()
    tok = Tokenizer(BPE(vocab=vocab, merges=[m[-1] for m in merges], unk_token="<unk>",
                        byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in specials.values()])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE),
                                           normalizers.Replace(" ", SPACE)])
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


def convert(data_dir: Path, out_dir: Path) -> Path:
    """Write the HF-format model dir for ``data_dir/stories260K.bin`` + ``tok512.bin``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    header, weights = read_checkpoint(data_dir / "stories260K.bin")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": header["dim"], "intermediate_size": header["hidden_dim"],
        "num_hidden_layers": header["n_layers"], "num_attention_heads": header["n_heads"],
        "num_key_value_heads": header["n_kv_heads"], "vocab_size": header["vocab_size"],
        "max_position_embeddings": header["seq_len"], "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": header["shared"],
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    pieces = read_tokenizer(data_dir / "tok512.bin", header["vocab_size"])
    build_tokenizer(pieces).save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": header["seq_len"],
        "clean_up_tokenization_spaces": False}, indent=1))
    return out_dir
