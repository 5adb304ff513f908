"""load_model: errors, dtypes, and the builtin model."""
from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

from helpers.hf_models import make_hf_model, save_hf_model
from helpers.paged import PagedRunner, Seq
from prefixcache.model import load_model
from prefixcache.model.builtin import tiny_weights
from prefixcache.text.byte_tokenizer import ByteTokenizer

TINY_SHA256 = "d00f527d8a3581a92ef5529562a57bf49fc515bf2ca3f410b974018c956d8b36"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_hf_model(make_hf_model("llama"), tmp_path_factory.mktemp("llama"))


def copy_dir(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        load_model(str(tmp_path / "nope"))


def test_missing_config(llama_dir, tmp_path):
    d = copy_dir(llama_dir, tmp_path / "m")
    (d / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(d))


def test_missing_safetensors(llama_dir, tmp_path):
    d = copy_dir(llama_dir, tmp_path / "m")
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors weights in .*m"):
        load_model(str(d))
    (d / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="only PyTorch .bin"):
        load_model(str(d))


def test_missing_shard_named(llama_dir, tmp_path):
    d = save_hf_model(make_hf_model("llama"), tmp_path / "sharded", max_shard_size="40KB")
    shard = sorted(d.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        load_model(str(d))


def test_unknown_architecture(llama_dir, tmp_path):
    d = copy_dir(llama_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["BertForMaskedLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="BertForMaskedLM"):
        load_model(str(d))


def test_weights_not_matching_config(llama_dir, tmp_path):
    d = copy_dir(llama_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 3  # the file only has layers 0 and 1
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"missing weight 'model\.layers\.2\."):
        load_model(str(d))
    cfg["num_hidden_layers"], cfg["intermediate_size"] = 2, 96
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"mlp\.gate_proj\.weight.*shape"):
        load_model(str(d))


def test_unsupported_dtype_and_builtin_name(llama_dir):
    with pytest.raises(ValueError, match="float64"):
        load_model(str(llama_dir), dtype="float64")
    with pytest.raises(ValueError, match="builtin:huge"):
        load_model("builtin:huge")


def test_hf_dir_without_tokenizer_files(llama_dir):
    loaded = load_model(str(llama_dir))
    assert loaded.tokenizer is None and loaded.chat_template is None
    assert loaded.model_id == str(llama_dir)
    assert loaded.config.architecture == "LlamaForCausalLM"


@pytest.mark.parametrize("dtype,want", [(torch.bfloat16, torch.bfloat16), ("bf16", torch.bfloat16),
                                       ("half", torch.float16), ("fp32", torch.float32)])
def test_dtype_is_resolved_by_the_one_table(llama_dir, dtype, want):
    loaded = load_model(str(llama_dir), dtype=dtype)
    assert loaded.model.dtype == want and loaded.model.embed.dtype == want
    assert load_model("builtin:tiny", dtype=dtype).model.norm.dtype == want


def test_loader_keeps_no_dtype_table_of_its_own():
    import prefixcache.model.loader as loader

    assert not hasattr(loader, "_DTYPES")
    with pytest.raises(ValueError, match=r"^dtype: unsupported dtype torch\.int8"):
        load_model("builtin:tiny", dtype=torch.int8)


@pytest.mark.parametrize("archs", [[], None])
def test_empty_architectures_loads_by_model_type(llama_dir, tmp_path, archs):
    """As a GGUF-converted checkpoint writes it (``"architectures": []``)."""
    d = copy_dir(llama_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    cfg["architectures"] = archs
    (d / "config.json").write_text(json.dumps(cfg))
    ours, ref = load_model(str(d)), load_model(str(llama_dir))
    assert ours.config == ref.config and ours.config.architecture == "LlamaForCausalLM"
    assert torch.equal(ours.model.lm_head, ref.model.lm_head)


def test_builtin_tiny_is_identical_every_time():
    a, b = load_model("builtin:tiny"), load_model("builtin:tiny")
    assert a.model_id == "builtin:tiny"
    params = list(a.model.named_parameters())
    assert len(params) == 4 * 6 + 3  # 6 per layer; embedding, final norm, lm_head
    for (name, x), (_, y) in zip(params, b.model.named_parameters()):
        assert x.dtype == torch.float32
        assert x.numpy().tobytes() == y.numpy().tobytes(), name
    # pinned bits: the generator, seed and draw order never change silently
    weights = tiny_weights()
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(weights[name].numpy().tobytes())
    assert digest.hexdigest() == TINY_SHA256
    assert weights["model.embed_tokens.weight"][0, :3].tolist() == pytest.approx(
        [-0.0012880124, -0.038804412, 0.012510424], abs=1e-8)
    assert not weights["lm_head.weight"][263:].any()  # padding ids: logit exactly 0


def test_builtin_tiny_runs_and_chats():
    loaded = load_model("builtin:tiny")
    tok = loaded.tokenizer
    assert isinstance(tok, ByteTokenizer) and loaded.chat_template
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    runner = PagedRunner(loaded.model, seed=0)
    seq = Seq()
    logits = runner.prefill(seq, ids)
    assert logits.shape == (272,) and torch.isfinite(logits).all()
    assert (logits[263:] == 0).all()
    out = runner.greedy(seq, logits, 5)
    assert all(0 <= t < 263 for t in out)
