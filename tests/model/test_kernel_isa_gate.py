"""Which CPUs use the kernels by default: ``PREFIXCACHE_CPU_KERNELS`` unset (``auto``) uses
them only where the CPU has AVX-512F (on AVX2 they ran slower than torch ops), ``1`` on any
CPU, ``0`` nowhere; anything else is an error naming the variable. Under ``auto`` on a CPU
without AVX-512F every kernel reports itself off, the model's dispatch picks torch ops, and
the library is not built."""
from __future__ import annotations

import pytest
import torch

from prefixcache.model.kernels import build, fused_ops, paged_decode, paged_prefill, small_gemm
from prefixcache.model.packed_linear import PackedLinear

ZEN4 = ("flags\t\t: fpu vme de pse tsc msr pae mce cx8 sse sse2 avx fma avx2 avx512f avx512dq "
        "avx512cd avx512bw avx512vl")
ZEN3 = "flags\t\t: fpu vme de pse tsc msr pae mce cx8 sse sse2 avx fma avx2 bmi2"
NEON = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32"


def test_isa_supported_reads_avx512f_as_a_whole_flag():
    assert build.isa_supported(ZEN4)
    assert not build.isa_supported(ZEN3)
    assert not build.isa_supported(NEON)
    assert not build.isa_supported("flags : avx512fp16x")  # a flag that only starts alike
    assert not build.isa_supported("")
    assert build._this_cpu_supported() is build.isa_supported()  # this CPU's flags


@pytest.mark.parametrize("isa, mode, expected", [
    (True, None, True), (False, None, False), (True, "auto", True), (False, "auto", False),
    (False, "1", True), (True, "0", False), (False, " AUTO ", False), (True, "", True)])
def test_modes(monkeypatch, isa, mode, expected):
    monkeypatch.setattr(build, "_this_cpu_supported", lambda: isa)
    if mode is None:
        monkeypatch.delenv("PREFIXCACHE_CPU_KERNELS", raising=False)
    else:
        monkeypatch.setenv("PREFIXCACHE_CPU_KERNELS", mode)
    assert build.enabled() is expected
    for kernel in (paged_decode, paged_prefill, fused_ops, small_gemm):
        assert kernel.enabled() is expected


def test_a_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("PREFIXCACHE_CPU_KERNELS", "yes")
    with pytest.raises(ValueError, match="PREFIXCACHE_CPU_KERNELS must be one of 0, 1, auto"):
        build.enabled()


def test_auto_without_avx512_runs_torch_ops_and_builds_nothing(monkeypatch):
    monkeypatch.setattr(build, "_this_cpu_supported", lambda: False)
    monkeypatch.delenv("PREFIXCACHE_CPU_KERNELS", raising=False)
    monkeypatch.setattr(build, "_module", None)
    monkeypatch.setattr(build, "_failed", None)
    assert build.load() is None and build.failure() is None  # off, not failed
    assert not fused_ops.available()
    torch.manual_seed(0)
    w, b, x = torch.randn(48, 40), torch.randn(48), torch.randn(3, 40)
    calls = []
    monkeypatch.setattr(small_gemm, "linear", lambda *a: calls.append(a))
    y = PackedLinear(w, b)(x)  # 3 rows: the small-GEMM kernel's shape, were it on
    assert calls == []
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), rtol=0, atol=1e-5)


def test_a_bad_value_fails_the_model_load_before_serving(monkeypatch):
    from prefixcache.model.loader import load_model

    monkeypatch.setenv("PREFIXCACHE_CPU_KERNELS", "on")
    with pytest.raises(ValueError, match="PREFIXCACHE_CPU_KERNELS must be one of"):
        load_model("builtin:tiny")
