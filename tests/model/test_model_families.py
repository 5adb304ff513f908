"""Qwen3, Gemma 3 (text) and Phi-3 / Phi-4-mini against transformers on random-weight
configs (tests/helpers/hf_models.py), saved with ``save_pretrained`` and loaded through
``load_model``: cold and warm (a prefix from shared pages), chunked and unchunked, in
default mode (logits within ATOL) and deterministic mode (bit-identical cold, warm and
chunked, and within ATOL of transformers).

The Gemma 3 kind has two 8-token sliding-window layers around a global one, so every
prompt here is longer than the window and the warm runs hit a prefix longer than it.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from helpers.hf_models import hf_greedy, hf_logits, make_hf_model, save_hf_model
from helpers.paged import PagedRunner, Seq
from prefixcache.model import load_model

ATOL = 1e-4
FAMILIES = ["qwen3", "gemma3", "phi3", "phi4_mini"]
ARCHS = {"qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM",
         "phi3": "Phi3ForCausalLM", "phi4_mini": "Phi3ForCausalLM"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """kind -> (HF model, our LoadedModel)."""
    out = {}
    for kind in FAMILIES:
        hf = make_hf_model(kind)
        out[kind] = (hf, load_model(str(save_hf_model(hf, tmp_path_factory.mktemp(kind)))))
    return out


def prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def test_configs_are_read_per_family(models):
    for kind, arch in ARCHS.items():
        assert models[kind][1].config.architecture == arch
    g = models["gemma3"][1].config
    assert g.layer_sliding_windows == (8, 8, None)
    assert (g.hidden_act, g.qk_norm, g.sandwich_norms, g.norm_weight_offset) == (
        "gelu_pytorch_tanh", True, True, 1.0)
    assert g.embed_scale == 64 ** 0.5 and g.query_scale == 24 ** -0.5
    assert g.final_logit_softcapping == 5.0
    assert (g.rope_theta, g.local_rope_theta, g.rope_scaling.rope_type) == (
        1_000_000.0, 10_000.0, "linear")
    assert models["qwen3"][1].config.qk_norm and not models["qwen3"][1].config.qkv_bias
    p = models["phi4_mini"][1].config
    assert (p.rotary_dim, p.head_dim, p.rope_scaling.rope_type) == (12, 16, "longrope")
    assert p.rope_scaling.short_factor == (1.0, 1.2, 1.5, 2.0, 2.5, 3.0)
    assert p.rope_scaling.original_max_position_embeddings == 256
    expected = (1 + math.log(4) / math.log(256)) ** 0.5  # max 1024 over original 256
    assert p.rope_scaling.attention_factor == pytest.approx(expected)


@pytest.mark.parametrize("kind", FAMILIES)
def test_cold_prefill_and_greedy_decode_match_transformers(models, kind):
    hf, ours = models[kind]
    ids = prompt(53)
    ref = hf_logits(hf, ids)
    runner = PagedRunner(ours.model, seed=7)
    seq = Seq()
    got = runner.prefill(seq, ids, all_logits=True)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    assert runner.greedy(seq, got[-1], 8) == hf_greedy(hf, ids, 8)


@pytest.mark.parametrize("kind", FAMILIES)
def test_chunked_prefill_matches_transformers(models, kind):
    hf, ours = models[kind]
    ids = prompt(70, seed=1)
    got = PagedRunner(ours.model, seed=3).prefill(Seq(), ids, chunk=24, all_logits=True)
    torch.testing.assert_close(got, hf_logits(hf, ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", FAMILIES)
def test_warm_prefix_from_shared_pages_matches_transformers(models, kind):
    """A 48-token prefix (three pages, six Gemma windows) comes from the cache."""
    hf, ours = models[kind]
    ids = prompt(61, seed=2)
    runner = PagedRunner(ours.model, seed=4)
    first = Seq()
    runner.prefill(first, ids[:48])
    warm = runner.fork(first, 48)
    got = runner.step([(warm, ids[48:])], all_logits=True)[0]
    torch.testing.assert_close(got, hf_logits(hf, ids)[48:], atol=ATOL, rtol=0)
    assert warm.pages[:3] == first.pages[:3]


@pytest.mark.parametrize("kind", FAMILIES)
def test_deterministic_mode_is_bit_identical_cold_warm_and_chunked(models, kind):
    hf, ours = models[kind]
    ids = prompt(70, seed=5)

    def runner(seed: int) -> PagedRunner:
        return PagedRunner(ours.model, num_pages=64, seed=seed, deterministic=True)

    cold = runner(1).prefill(Seq(), ids, all_logits=True)
    torch.testing.assert_close(cold, hf_logits(hf, ids), atol=ATOL, rtol=0)
    assert torch.equal(runner(2).prefill(Seq(), ids, chunk=7, all_logits=True), cold)
    r = runner(3)
    first = Seq()
    r.prefill(first, ids[:48])
    warm = r.fork(first, 48)
    assert torch.equal(r.step([(warm, ids[48:])], all_logits=True)[0], cold[48:])


def test_gemma3_decode_past_the_window_matches_transformers(models):
    """Decode 12 tokens after a 40-token prompt: the sliding layers read 8 keys, the
    global layer all of them, from the same pages."""
    hf, ours = models["gemma3"]
    ids = prompt(40, seed=6)
    runner = PagedRunner(ours.model, seed=6)
    seq = Seq()
    assert runner.greedy(seq, runner.prefill(seq, ids), 12) == hf_greedy(hf, ids, 12)


def test_unknown_architecture_names_itself_and_the_supported_ones(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 64}))
    with pytest.raises(ValueError) as e:
        load_model(str(tmp_path))
    msg = str(e.value)
    assert "FalconForCausalLM" in msg and "falcon" in msg
    for arch in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM",
                 "Phi3ForCausalLM"):
        assert arch in msg


@pytest.mark.parametrize("key,value", [("attn_logit_softcapping", 50.0),
                                       ("hidden_activation", "relu")])
def test_unsupported_gemma_settings_are_refused_by_name(models, tmp_path, key, value):
    import json

    hf, _ = models["gemma3"]
    path = save_hf_model(hf, tmp_path / "g")
    cfg = json.loads((path / "config.json").read_text())
    cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=key):
        load_model(str(path))


def test_window_rule_counts_pages_kept_for_global_layers_only(models):
    g = models["gemma3"][1].config  # windows (8, 8, None)
    # the next query (position n) reads keys > n - 8: pages ending at or before n - 8
    assert [g.pages_for_global_layers_only(n, 16) for n in (8, 22, 23, 24, 39, 40, 100)] == [
        0, 0, 1, 1, 2, 2, 5]
    assert models["qwen3"][1].config.pages_for_global_layers_only(100, 16) == 0
    mistral = g.__class__(**{**g.__dict__, "layer_sliding_windows": (8, 8, 8)})
    assert mistral.pages_for_global_layers_only(100, 16) == 0  # no global layer


def test_engine_hit_longer_than_the_window_is_exact_and_counted(models):
    """Through the engine: a second request hits a 64-token prefix (eight windows) of
    the first; both continue as transformers does, and while the long request runs the
    engine counts its pages that only the global layer still reads."""
    from prefixcache.config import EngineConfig
    from prefixcache.engine.engine import LLMEngine
    from prefixcache.sampling_params import SamplingParams

    hf, ours = models["gemma3"]
    engine = LLMEngine(EngineConfig(model="gemma3", num_pages=32), loaded=ours)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    first, second = prompt(70, seed=8), prompt(70, seed=8)[:64] + prompt(9, seed=9)
    outs = {}
    for rid, ids in (("a", first), ("b", second)):
        req = engine.add_request(rid, ids, params)
        counted = []
        while engine.has_unfinished_requests():
            counted.append(engine.stats()["pages_kept_for_global_layers"])
            for out in engine.step():
                if out.finished:
                    outs[rid] = out
        # after the prefill (and the last decode) the request had n computed tokens
        assert max(counted) == ours.config.pages_for_global_layers_only(
            len(ids) + params.max_tokens - 1, 16) > 0
        assert req.num_cached_tokens == (0 if rid == "a" else 64)
    assert engine.stats()["pages_kept_for_global_layers"] == 0  # nothing running
    assert outs["a"].outputs[0].token_ids == hf_greedy(hf, first, 6)
    assert outs["b"].outputs[0].token_ids == hf_greedy(hf, second, 6)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("kind", FAMILIES)
def test_every_cpu_backend_matches_transformers(models, tmp_path, kind, backend):
    """The families on the plain-torch backend (the CUDA path) and the CPU backend without
    kernels (the module fixture runs the kernel backend the suite forces)."""
    hf, _ = models[kind]
    ours = load_model(str(save_hf_model(hf, tmp_path / kind)), compute_backend=backend)
    ids = prompt(40, seed=11)
    runner = PagedRunner(ours.model, seed=2)
    first = Seq()
    cold = runner.prefill(first, ids, chunk=24, all_logits=True)
    torch.testing.assert_close(cold, hf_logits(hf, ids), atol=ATOL, rtol=0)
    warm = runner.fork(first, 32)
    got = runner.step([(warm, ids[32:])], all_logits=True)[0]
    torch.testing.assert_close(got, hf_logits(hf, ids)[32:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", FAMILIES)
def test_gguf_written_from_the_random_model_matches_transformers(models, tmp_path,
                                                                  monkeypatch, kind):
    """Each family as a GGUF file laid out as llama.cpp writes it (F32), converted and
    loaded: the same logits as transformers, cold and warm. The Gemma 3 file uses
    llama.cpp's query scale (head_dim), so its reference model does too."""
    import transformers

    from helpers.family_gguf import write_family_gguf
    from helpers.hf_models import KINDS

    monkeypatch.setenv("PREFIXCACHE_CACHE_DIR", str(tmp_path / "cache"))
    hf, _ = models[kind]
    if kind == "gemma3":
        config_cls, model_cls, kwargs = KINDS[kind]
        config = config_cls(**{**kwargs, "query_pre_attn_scalar": 16})
        config._attn_implementation = "sdpa"
        hf = model_cls(config).eval()
        hf.load_state_dict(models[kind][0].state_dict())
        assert isinstance(hf, transformers.Gemma3ForCausalLM)
    ours = load_model(str(write_family_gguf(hf, tmp_path / f"{kind}.gguf")))
    assert ours.config.architecture == ARCHS[kind]
    assert ours.cache_id.startswith("gguf:")
    ids = prompt(61, seed=12)
    ref = hf_logits(hf, ids)
    runner = PagedRunner(ours.model, seed=9)
    first = Seq()
    torch.testing.assert_close(runner.prefill(first, ids, all_logits=True), ref, atol=ATOL,
                               rtol=0)
    warm = runner.fork(first, 48)
    torch.testing.assert_close(runner.step([(warm, ids[48:])], all_logits=True)[0], ref[48:],
                               atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", FAMILIES)
def test_quantized_gguf_runs_on_int4_codes_near_its_float_load(models, tmp_path,
                                                                monkeypatch, kind):
    """Each family as a Q8_0 GGUF file: ``quantization="auto"`` keeps every projection and
    ``lm_head`` as 8-bit codes (two int4 planes; Phi-3's fused qkv/gate_up included) and the
    embedding as codes (Gemma: times its embed_scale); its logits stay within 3% of the
    largest logit of the same file dequantized (``quantization="none"``), cold and warm;
    ``int8`` (codes from the dequantized weights, split by HF name: requantized, so
    within 5%)."""
    from helpers.family_gguf import write_family_gguf
    from prefixcache.model.quantized_linear import Int4Linear

    monkeypatch.setenv("PREFIXCACHE_CACHE_DIR", str(tmp_path / "cache"))
    path = str(write_family_gguf(models[kind][0], tmp_path / f"{kind}.gguf", qtype="Q8_0"))
    ours = load_model(path, quantization="auto")
    ref = load_model(path, quantization="none")
    assert ours.cache_id == ref.cache_id + ":gguf"
    net = ours.model
    for layer in net.decoder_layers:
        for handle in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj):
            assert isinstance(handle, Int4Linear) and handle.planes == 2
    assert isinstance(net._lm_head, Int4Linear)
    assert net.embed_codes is not None and net.embed.numel() == 0
    assert not isinstance(ref.model.decoder_layers[0].qkv_proj, Int4Linear)
    ids = prompt(61, seed=12)
    want = PagedRunner(ref.model, seed=9).prefill(Seq(), ids, all_logits=True)
    runner = PagedRunner(net, seed=9)
    first = Seq()
    got = runner.prefill(first, ids, all_logits=True)
    bound = 0.03 * want.abs().max().item()
    torch.testing.assert_close(got, want, atol=bound, rtol=0)
    warm = runner.fork(first, 48)
    torch.testing.assert_close(runner.step([(warm, ids[48:])], all_logits=True)[0],
                               want[48:], atol=bound, rtol=0)
    int8 = load_model(path, quantization="int8")  # min/max codes from the float weights
    assert int8.cache_id == ref.cache_id + ":int8"
    assert isinstance(int8.model.decoder_layers[0].gate_up_proj, Int4Linear)
    torch.testing.assert_close(PagedRunner(int8.model, seed=9).prefill(Seq(), ids,
                                                                       all_logits=True),
                               want, atol=bound * 5 / 3, rtol=0)  # twice quantized: 5%


def test_longrope_rotates_each_position_by_its_own_factors(models):
    """Below original_max_position_embeddings the short factors, from it on the long ones,
    per position (so cached KV stays valid as a sequence grows); cos/sin scaled by the
    attention factor."""
    from prefixcache.model.rope import RotaryEmbedding

    cfg = models["phi4_mini"][1].config
    s = cfg.rope_scaling
    rope = RotaryEmbedding(cfg.rotary_dim, cfg.rope_theta, s, "cpu")
    cos, sin = rope.table(300)
    exps = torch.arange(0, 12, 2).float() / 12
    for pos, factors in ((255, s.short_factor), (256, s.long_factor), (299, s.long_factor)):
        inv = 1.0 / (torch.tensor(factors) * cfg.rope_theta ** exps)
        angle = torch.cat([pos * inv, pos * inv])
        torch.testing.assert_close(cos[pos], angle.cos() * s.attention_factor)
        torch.testing.assert_close(sin[pos], angle.sin() * s.attention_factor)
