"""bench-engine's decode suite on a tiny random checkpoint: the rows it measures, the
step breakdown's parts, the bandwidth bound's byte count, the report and the plot."""
from __future__ import annotations

import torch

from prefixcache.bench import decode_perf, decode_report
from prefixcache.model.loader import load_model
from tests.helpers.hf_models import make_hf_model, save_hf_model


def test_tpot_rows_cover_every_impl_context_and_batch():
    hf = make_hf_model("llama")
    from prefixcache.model.config import ModelConfig
    from prefixcache.model.weights import load_hf_weights
    from tests.helpers.paged import cpu_model

    cfg = ModelConfig.from_dict({**hf.config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    ours = cpu_model(cfg)
    load_hf_weights(ours, hf.state_dict().__getitem__)
    rows = decode_perf.tpot_vs_context(ours, hf, contexts=(32, 80), repeats=2,
                                       no_cache_max_ctx=32)
    got = sorted((r["impl"], r["seqs"], r["ctx"]) for r in rows)
    assert got == sorted([(i, n, c) for i in ("ours", "transformers-cache") for n in (1, 8)
                          for c in (32, 80)] + [("transformers-no-cache", 1, 32)])
    assert all(0 < r["min"] <= r["median"] <= r["max"] for r in rows)


def test_weight_bytes_counts_a_tied_head_once(tmp_path):
    hf = make_hf_model("llama3_tied")
    m = load_model(str(save_hf_model(hf, tmp_path / "m")), "cpu", torch.float32).model
    params = sum(p.numel() for p in hf.parameters())  # HF lists the tied tensor once
    assert decode_perf.weight_bytes(m) == 4 * params


def test_step_breakdown_measures_only_full_decode_steps(tmp_path):
    path = save_hf_model(make_hf_model("llama"), tmp_path / "m")
    res = decode_perf.step_breakdown(path, "float32", steps=5, nseq=3, ctx=64)
    # 7 tokens each. Step 1: the first request prefills 64 tokens (and samples), the
    # others follow its 48-token prefix; step 2: they prefill their 16 tokens while it
    # decodes; steps 3..7: all three decode (the first finishes in step 7), then one
    # step is left for the other two.
    assert res["seqs"] == 3 and res["steps_measured"] == 5
    med = res["median_s"]
    assert set(med) == {"schedule", "build_batch", "forward", "sample", "total",
                        "other (publish, outputs)"}
    assert 0 < med["forward"] < med["total"] and 0 < res["host_share"] < 1


def test_markdown_and_plot(tmp_path):
    rows = [{"ctx": c, "seqs": n, "impl": "ours", "median": 0.01 * n, "min": 0.009 * n,
             "max": 0.012 * n} for c in (512, 8192) for n in (1, 8)]
    res = {"tpot_vs_context": rows, "tpot_8k_over_512": {"1": 1.0, "8": 1.0},
           "batched_8_over_1_tok_s": 1.0,
           "step_breakdown": {"seqs": 8, "ctx": 1024, "steps_measured": 3, "host_share": 0.05,
                              "median_s": {"schedule": 0.001, "forward": 0.019,
                                           "total": 0.02}},
           "bandwidth_gbs": {"gemv": {"median": 20.0, "min": 19.0, "max": 21.0},
                             "sum": {"median": 10.0, "min": 9.0, "max": 11.0}},
           "bandwidth_bound": {"float32": {"weight_bytes": 2e8, "bound_s": 0.01,
                                           "step_s": {"median": 0.02, "min": 0.02,
                                                      "max": 0.03}}},
           "goals": {"8 seqs >= 5x tokens/s of 1 at 1k": False}}
    meta = {"model": "m", "dtype": "float32", "threads": 1, "date": "2026-12-01"}
    text = "\n".join(decode_report.render_markdown(res, meta))
    assert "| 8192 | 10.0 [9-12] | 80.0 [72-96] |" in text
    assert "| schedule | 1.00 | 5.0% |" in text
    assert "| float32 | 200 MB | 10.0 ms | 20.0 ms [20.0-30.0] | 2.00x |" in text
    assert "8 seqs >= 5x tokens/s of 1 at 1k: missed" in text
    decode_report.plot_tpot(res, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_packed_ab_measures_both_ways_and_restores_packing():
    hf = make_hf_model("llama")
    from prefixcache.model.config import ModelConfig
    from prefixcache.model.weights import load_hf_weights
    from tests.helpers.paged import cpu_model

    cfg = ModelConfig.from_dict({**hf.config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    m = cpu_model(cfg)
    load_hf_weights(m, hf.state_dict().__getitem__)
    before = [layer.qkv_proj.enabled for layer in m.decoder_layers]
    rows = decode_perf.packed_ab(m, seqs=(1, 3), ctx=40, repeats=2)
    assert [r["seqs"] for r in rows] == [1, 3]
    assert all(set(r) == {"seqs", "packed", "f_linear", "ratio"} for r in rows)
    assert [layer.qkv_proj.enabled for layer in m.decoder_layers] == before
    if before[0]:  # oneDNN present: 3-row steps packed each projection once
        assert all(layer.down_proj.num_packs == 1 for layer in m.decoder_layers)


def _tiny_ours():
    from tests.helpers.paged import paged_copy

    return paged_copy(make_hf_model("llama"))


def test_kernel_prefill_and_split_ab_measure_both_ways_and_restore_the_backend():
    from prefixcache.model.cpu.kernels import build

    ours = _tiny_ours()
    before = ours.backend
    built = before.name == "cpu-kernels" and build.load() is not None
    rows = decode_perf.kernel_ab(ours, cases=((2, 64),), repeats=2)
    if built:  # the kernel built: both paths measured
        assert [(r["seqs"], r["ctx"]) for r in rows] == [(2, 64)]
        assert rows[0]["in_place"]["min"] > 0 and rows[0]["gathered"]["min"] > 0
    assert ours.backend is before
    split = decode_perf.split_ab(ours, cases=((8, 40),), repeats=2)
    assert [(r["new"], r["ctx"]) for r in split] == [(8, 40)]
    assert split[0]["ratio"]["min"] > 0 and ours.backend is before
    assert before.split_prefix and (before.prefill_kernel or not built)
    prefill = decode_perf.prefill_ab(ours, cases=((16, 16), (8, 40)), repeats=2)
    if built:
        assert [(r["new"], r["ctx"]) for r in prefill] == [(16, 16), (8, 40)]
        assert all(r["in_place"]["min"] > 0 and r["torch"]["min"] > 0 for r in prefill)
    assert ours.backend is before
    assert all(layer.backend is before for layer in ours.decoder_layers)


def test_fused_and_small_gemm_ab_measure_both_ways_and_restore_the_backend():
    from prefixcache.model.cpu.kernels import build, fused_ops

    ours = _tiny_ours()
    before = ours.backend
    built = before.name == "cpu-kernels" and build.load() is not None
    fused = decode_perf.fused_ab(ours, decode_cases=((2, 64),), prefill_cases=((16, 40),),
                                 repeats=2)
    if built and fused_ops.available():
        assert [(r.get("seqs"), r.get("new"), r["ctx"]) for r in fused] == [
            (2, None, 64), (None, 16, 40)]
        assert all(r["fused"]["min"] > 0 and r["torch"]["min"] > 0 for r in fused)
    assert ours.backend is before
    small = decode_perf.small_gemm_ab(ours, decode_cases=((1, 32), (4, 32)), repeats=2)
    if built:
        assert [(r["seqs"], r["ctx"]) for r in small] == [(1, 32), (4, 32)]
        assert all(r["small"]["min"] > 0 and r["onednn"]["min"] > 0 for r in small)
    assert ours.backend is before and ours.backend.small_gemm == built


def test_report_renders_the_ab_tables_and_server_series(tmp_path):
    import json

    spread = {"median": 0.02, "min": 0.01, "max": 0.03}
    res = {"kernel_ab": [{"seqs": 8, "ctx": 4096, "in_place": spread, "gathered": spread,
                          "ratio": {"median": 1.5, "min": 1.4, "max": 1.6}}],
           "split_ab": [{"new": 900, "ctx": 7500, "split": spread, "masked": spread,
                         "ratio": {"median": 1.2, "min": 1.1, "max": 1.3}}],
           "prefill_ab": [{"new": 2048, "ctx": 2048, "in_place": spread, "torch": spread,
                           "ratio": {"median": 1.3, "min": 1.25, "max": 1.35}}],
           "fused_ab": [{"seqs": 8, "ctx": 1024, "fused": spread, "torch": spread,
                         "ratio": {"median": 1.06, "min": 1.02, "max": 1.19}},
                        {"new": 256, "ctx": 2048, "fused": spread, "torch": spread,
                         "ratio": {"median": 1.05, "min": 1.03, "max": 1.11}}],
           "small_gemm_ab": [{"seqs": 4, "ctx": 1024, "small": spread, "onednn": spread,
                              "ratio": {"median": 1.14, "min": 1.08, "max": 1.25}}]}
    base = {"tpot_vs_context": [{"ctx": 512, "seqs": 1, "impl": "ours", **spread}],
            "tpot_8k_over_512": {"1": 1.0, "8": 1.0}, "batched_8_over_1_tok_s": 1.0,
            "step_breakdown": {"seqs": 8, "ctx": 1024, "steps_measured": 3, "host_share": 0.1,
                               "median_s": {"total": 0.02}},
            "bandwidth_gbs": {"gemv": spread, "sum": spread}, "bandwidth_bound": {},
            "goals": {}}
    meta = {"model": "m", "dtype": "float32", "threads": 1, "date": "d"}
    text = "\n".join(decode_report.render_markdown({**base, **res}, meta))
    assert "| 8 x 4096 | 20.0 [10-30] | 20.0 [10-30] | 1.50x [1.40-1.60] |" in text
    assert "| 900 over 7500 | 20.0 [10-30] | 20.0 [10-30] | 1.20x [1.10-1.30] |" in text
    assert "| 2048 over 2048 | 20.0 [10-30] | 20.0 [10-30] | 1.30x [1.25-1.35] |" in text
    assert "| 8 x 1024 decode | 20.0 [10-30] | 20.0 [10-30] | 1.06x [1.02-1.19] |" in text
    assert "| 256 over 2048 prefill | 20.0 [10-30] | 20.0 [10-30] | 1.05x [1.03-1.11] |" in text
    assert "| 4 | 20.0 [10-30] | 20.0 [10-30] | 1.14x [1.08-1.25] |" in text
    (tmp_path / "tpot_server_vllm.json").write_text(json.dumps(
        {"label": "vllm", "rows": [{"ctx": 512, "seqs": 1, **spread},
                                   {"ctx": 1024, "seqs": 1, **spread}]}))
    servers = decode_report.server_series(tmp_path)
    assert [s["label"] for s in servers] == ["vllm"]
    decode_report.plot_tpot(base, tmp_path / "p.png", servers)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
