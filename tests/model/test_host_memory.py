"""Freed activation memory stays in the heap: a step's large temporaries reuse pages
instead of faulting in fresh ones (glibc only)."""
from __future__ import annotations

import platform
import subprocess
import sys

import pytest

PROBE = r"""
import resource, sys, torch
from prefixcache.model.cpu import host_memory
set_ = host_memory.keep_freed_memory() if sys.argv[1] == "1" else False
x = torch.empty(5 * 1024 * 1024)                  # the process's first 20 MiB block
addr = x.data_ptr()
heap = [l for l in open("/proc/self/maps") if l.rstrip().endswith("[heap]")]
lo, hi = (int(v, 16) for v in heap[0].split()[0].split("-")) if heap else (0, 0)
del x
MIB = 1024 * 1024 // 4
def cycle():  # a step's activations: sizes of 2-12 MiB alive at once, then freed
    xs = [torch.empty(n * MIB) for n in (6, 12, 2, 12, 8, 12, 4, 12, 10, 12)]
    for x in xs:
        x.fill_(1.0)                   # touch every page
    del xs
for _ in range(5):  # past glibc's warm-up
    cycle()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
print(int(set_), int(lo <= addr < hi), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def probe(keep: bool) -> tuple[int, int, int]:
    """(thresholds set, first 20 MiB block inside [heap], page faults of 5 steady cycles)"""
    out = subprocess.run([sys.executable, "-c", PROBE, "1" if keep else "0"], check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_large_temporaries_come_from_the_heap_and_reuse_its_pages():
    set_, in_heap, faults = probe(True)
    assert set_ == 1 and in_heap == 1
    assert faults <= 5 * 90 * 1024 * 1024 // 4096 * 0.02   # the same pages again
    # glibc's default serves the first 20 MiB block with mmap, outside the heap
    assert probe(False)[:2] == (0, 0)


def test_opt_out_leaves_the_defaults(monkeypatch):
    from prefixcache.model.cpu import host_memory

    monkeypatch.setenv("PREFIXCACHE_KEEP_HEAP", "0")
    monkeypatch.setattr(host_memory, "_done", None)
    assert host_memory.keep_freed_memory() is False
    monkeypatch.setattr(host_memory, "_done", None)  # leave the next caller a fresh state


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "absent"
    return text.split("[")[1].split("]")[0]


def _smaps_kib(addr: int, field: str = "AnonHugePages") -> int | None:
    """``field`` (KiB) of the mapping holding ``addr`` in /proc/self/smaps; None when
    unmapped."""
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(v, 16) for v in head.split("-"))
            if lo <= addr < hi:
                for row in lines[i + 1:]:
                    if row.startswith(field + ":"):
                        return int(row.split()[1])
    return None


needs_thp = pytest.mark.skipif(
    not sys.platform.startswith("linux") or _thp_mode() not in ("always", "madvise"),
    reason="transparent huge pages disabled on this machine "
           "(/sys/kernel/mm/transparent_hugepage/enabled)")


@needs_thp
def test_large_tensors_sit_on_huge_pages_from_their_first_write():
    import torch

    from prefixcache.model.cpu import host_memory

    arena = host_memory.HugePageArena(chunk_bytes=8 * 1024 * 1024)
    t = host_memory.empty((64, 16, 4, 256), torch.float32, "cpu", arena)  # 4 MiB: own
    assert t.shape == (64, 16, 4, 256) and t.is_contiguous() and t.dtype == torch.float32
    assert t.data_ptr() % host_memory.HUGE_PAGE == 0
    assert _smaps_kib(t.data_ptr()) == 0                 # nothing is faulted in yet
    assert torch.count_nonzero(t).item() == 0          # a fresh mapping reads as zero
    t.fill_(1.5)
    assert _smaps_kib(t.data_ptr()) == 4096              # both 2 MiB pages, on first write
    addr = t.data_ptr()
    del t
    assert _smaps_kib(addr) is None                      # unmapped with its last tensor


@needs_thp
def test_arena_tensors_share_huge_pages_but_not_storage():
    import torch

    from prefixcache.model.cpu import host_memory

    arena = host_memory.HugePageArena(chunk_bytes=8 * 1024 * 1024)
    a = arena.empty((576,), torch.float32)
    b = arena.empty((960, 576), torch.bfloat16)
    c = arena.empty((3, 5), torch.float32)
    assert [x.data_ptr() % 64 for x in (a, b, c)] == [0, 0, 0]
    assert b.data_ptr() == a.data_ptr() + 576 * 4 and c.data_ptr() == b.data_ptr() + 960 * 576 * 2
    v = b._version
    a.add_(1.0)
    c.mul_(2.0)
    assert b._version == v          # own version counters: a packed copy of b stays valid
    b.fill_(2.0)
    assert a.sum().item() == 576.0 and c.sum().item() == 0.0
    assert b.float().sum().item() == 2.0 * 960 * 576
    assert _smaps_kib(a.data_ptr()) == 2048
    big = arena.empty((1024, 1024, 3), torch.float32)  # above a quarter chunk: its own
    assert big.data_ptr() % host_memory.HUGE_PAGE == 0


def test_huge_pages_opt_out(monkeypatch):
    import torch

    from prefixcache.model.cpu import host_memory

    monkeypatch.setenv("PREFIXCACHE_HUGE_PAGES", "0")
    assert host_memory.huge_pages_enabled() is False
    t = host_memory.zeros((64, 16, 4, 256), torch.float32)
    assert torch.count_nonzero(t).item() == 0 and t.is_contiguous()
    arena = host_memory.HugePageArena()
    x = host_memory.empty((7, 3), torch.float32, "cpu", arena)
    assert x.shape == (7, 3) and arena._chunk is None   # the arena is bypassed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")
def test_zeros_are_resident_when_made_and_off_huge_pages():
    import torch

    from prefixcache.model.cpu import host_memory

    t = host_memory.zeros((128, 16, 4, 256), torch.float32)  # 8 MiB: a mapping of its own
    assert t.shape == (128, 16, 4, 256) and t.is_contiguous() and t.dtype == torch.float32
    assert t.data_ptr() % host_memory.HUGE_PAGE == 0
    assert _smaps_kib(t.data_ptr(), "Rss") >= 8192      # every page faulted in already
    assert _smaps_kib(t.data_ptr()) == 0                 # on 4 KiB pages
    assert torch.count_nonzero(t).item() == 0
    t.fill_(2.0)
    assert _smaps_kib(t.data_ptr()) == 0 and t.sum().item() == 2.0 * t.numel()
    small = host_memory.zeros((3, 16, 2, 8), torch.bfloat16)  # below MIN_MAPPING_BYTES
    assert small.shape == (3, 16, 2, 8) and torch.count_nonzero(small).item() == 0


@needs_thp
def test_model_weights_on_huge_pages_and_pool_resident():
    import torch

    from prefixcache.model.config import ModelConfig
    from tests.helpers.paged import cpu_model

    cfg = ModelConfig(architecture="LlamaForCausalLM", vocab_size=4096, hidden_size=256,
                      intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64)
    m = cpu_model(cfg, "cpu", torch.float32)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()
    layer = m.decoder_layers[0]
    assert _smaps_kib(layer.qkv_weight.data_ptr()) > 0     # 512 KiB weights share an arena
    kv = m.new_kv_pool(512, 16)                            # 4 MiB a layer
    for t in (*kv.k, *kv.v):
        assert _smaps_kib(t.data_ptr(), "Rss") >= 4096     # resident before any step
        assert _smaps_kib(t.data_ptr()) == 0
        assert torch.count_nonzero(t).item() == 0


HEAP_PROBE = r"""
from prefixcache.model.cpu import host_memory
host_memory.keep_freed_memory()
advised, name = 0, ""
for line in open("/proc/self/smaps"):
    head = line.split()
    if head and "-" in head[0] and ":" not in head[0]:
        lo, hi = (int(v, 16) for v in head[0].split("-"))
        name = head[-1] if len(head) >= 6 else ""
    elif line.startswith("VmFlags:") and name == "[heap]" and " hg" in line:
        advised += hi - lo
print(advised)
"""


@needs_thp
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's heap only")
@pytest.mark.parametrize("env,want", [("1", True), ("0", False)])
def test_heap_grown_and_advised_for_huge_pages(env, want):
    import os

    from prefixcache.model.cpu import host_memory

    out = subprocess.run([sys.executable, "-c", HEAP_PROBE], check=True, capture_output=True,
                         text=True, env={**os.environ, "PREFIXCACHE_HUGE_PAGES": env}).stdout
    advised = int(out)
    if want:  # all of the reserve but its unaligned ends
        assert host_memory.HEAP_RESERVE - 2 * host_memory.HEAP_STEP <= advised
        assert advised <= host_memory.HEAP_RESERVE + host_memory.HEAP_STEP
    else:
        assert advised == 0


def test_empty_shapes_come_back_as_plain_tensors():
    import torch

    from prefixcache.model.cpu import host_memory

    arena = host_memory.HugePageArena()
    for t in (host_memory.empty((0, 576), torch.float32, "cpu", arena),
              host_memory.zeros((0, 16, 3, 64), torch.bfloat16)):
        assert t.numel() == 0 and t.dim() >= 2
    assert arena._chunk is None
