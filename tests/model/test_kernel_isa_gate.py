"""Which CPUs use the kernels by default: compute backend ``auto`` on a CPU picks the C++
kernels only where the CPU has AVX-512F (on AVX2 they ran slower than torch ops), unless
``PREFIXCACHE_CPU_KERNELS`` (read once, when the backend is chosen at load) says ``1`` (any
CPU) or ``0`` (none); anything else is an error naming the variable. ``cpu-kernels`` forces
them, ``cpu`` and ``torch`` never use them; a CPU backend on another device is refused."""
from __future__ import annotations

import pytest
import torch

from prefixcache.model.backend import TorchBackend
from prefixcache.model.cpu.backend import CpuKernelBackend
from prefixcache.model.cpu.kernels import build, small_gemm
from prefixcache.model.loader import make_backend

ZEN4 = ("flags\t\t: fpu vme de pse tsc msr pae mce cx8 sse sse2 avx fma avx2 avx512f avx512dq "
        "avx512cd avx512bw avx512vl")
ZEN3 = "flags\t\t: fpu vme de pse tsc msr pae mce cx8 sse sse2 avx fma avx2 bmi2"
NEON = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32"
KERNEL_SWITCHES = ("decode_kernel", "prefill_kernel", "small_gemm")


def test_isa_supported_reads_avx512f_as_a_whole_flag():
    assert build.isa_supported(ZEN4)
    assert not build.isa_supported(ZEN3)
    assert not build.isa_supported(NEON)
    assert not build.isa_supported("flags : avx512fp16x")  # a flag that only starts alike
    assert not build.isa_supported("")


@pytest.mark.parametrize("isa, mode, expected", [
    (True, None, "cpu-kernels"), (False, None, "cpu"), (True, "auto", "cpu-kernels"),
    (False, "auto", "cpu"), (False, "1", "cpu-kernels"), (True, "0", "cpu"),
    (False, " AUTO ", "cpu"), (True, "", "cpu-kernels")])
def test_auto_modes(monkeypatch, isa, mode, expected):
    monkeypatch.setattr(build, "isa_supported", lambda flags=None: isa)
    if mode is None:
        monkeypatch.delenv("PREFIXCACHE_CPU_KERNELS", raising=False)
    else:
        monkeypatch.setenv("PREFIXCACHE_CPU_KERNELS", mode)
    b = make_backend("auto", "cpu", torch.float32)
    assert isinstance(b, CpuKernelBackend) and b.name == expected
    on = expected == "cpu-kernels" and build.load() is not None
    assert [getattr(b, s) for s in KERNEL_SWITCHES] == [on] * 3


@pytest.mark.parametrize("isa", [True, False])
def test_named_backends_ignore_the_cpu(monkeypatch, isa):
    monkeypatch.setattr(build, "isa_supported", lambda flags=None: isa)
    monkeypatch.setenv("PREFIXCACHE_CPU_KERNELS", "0")  # only auto reads it
    assert type(make_backend("torch", "cpu")) is TorchBackend
    assert make_backend("cpu", "cpu").name == "cpu"
    forced = make_backend("cpu-kernels", "cpu")
    assert forced.name == ("cpu-kernels" if build.load() is not None else "cpu")
    assert type(make_backend("auto", "meta")) is TorchBackend  # off the CPU: plain torch


def test_bad_choices_name_the_setting(monkeypatch):
    monkeypatch.setenv("PREFIXCACHE_CPU_KERNELS", "yes")
    with pytest.raises(ValueError, match="PREFIXCACHE_CPU_KERNELS must be one of 0, 1, auto"):
        make_backend("auto", "cpu")
    with pytest.raises(ValueError, match="compute_backend: must be one of"):
        make_backend("fast", "cpu")
    with pytest.raises(ValueError, match="compute_backend: 'cpu-kernels' runs on the CPU"):
        make_backend("cpu-kernels", "meta")


def test_the_cpu_backend_without_kernels_runs_torch_ops(monkeypatch):
    b = CpuKernelBackend(torch.float32, kernels=False)
    assert b.name == "cpu" and not any(getattr(b, s) for s in (*KERNEL_SWITCHES, "fused_ops"))
    torch.manual_seed(0)
    w, bias, x = torch.randn(48, 40), torch.randn(48), torch.randn(3, 40)
    calls = []
    monkeypatch.setattr(small_gemm, "linear", lambda *a: calls.append(a))
    y = b.linear(x, b.prepare_linear(w, bias))  # 3 rows: the small-GEMM kernel's shape
    assert calls == []
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, bias), rtol=0, atol=1e-5)


def test_a_bad_value_fails_the_model_load_before_serving(monkeypatch):
    from prefixcache.model.loader import load_model

    monkeypatch.setenv("PREFIXCACHE_CPU_KERNELS", "on")
    with pytest.raises(ValueError, match="PREFIXCACHE_CPU_KERNELS must be one of"):
        load_model("builtin:tiny")
    with pytest.raises(ValueError, match="compute_backend"):
        load_model("builtin:tiny", compute_backend="gpu")
