"""``prefixcache bench-engine --suite decode``: decode speed on one model.

Four measurements, each interleaved (A, B, A, B, ...) with ``repeats`` rounds after a
warm-up; the median and the spread (min-max) are reported:

* ``tpot_vs_context``: one decode step of 1 and of 8 sequences at contexts 512..8k.
  Ours: ``PagedLlama`` over a pool of random KV (a step's cost does not depend on the KV
  values) with shuffled pages. transformers: the same step over a ``DynamicCache`` of
  random KV, and (1 sequence, up to ``no_cache_max_ctx``) its forward over the whole
  context without a cache, the cost of decoding with no KV cache.
* ``step_breakdown``: the engine with 8 sequences decoding at 1k context, each step cut
  into scheduling, batch building, model forward, sampling and the rest (publishing,
  output processing), timed by wrapping those methods.
* ``bandwidth_bound``: single-sequence step time at 1k context against weight bytes /
  read bandwidth (GEMV over a 256 MiB float32 matrix), in float32 and bfloat16.
* ``batched``: output tokens/s of 8 sequences against 1 at 1k context (from the
  ``tpot_vs_context`` rows).
* ``kernel_ab``: decode steps of 1 and 8 sequences at 1k-8k context with attention
  reading the pages in place (the CPU kernel, the default) against gathering them.
* ``prefill_ab``: a prefill step of 2,048 cold tokens, 256 new over 2k and 900 over 7.5k
  with the chunk's attention read in place by the CPU prefill kernel (the default)
  against torch's SDPA.
* ``fused_ab``: decode steps of 1 and 8 sequences at 1k and a 2,048-token prefill step
  with the decoder layer's elementwise ops fused (the default) against torch ops.
* ``small_gemm_ab``: decode steps of 1, 4 and 8 sequences at 1k with the linears on the
  weight-streaming kernel of 1-8 rows (the default) against oneDNN's packed kernel.
* ``split_ab``: the same steps after a prefix with the kernel off, the chunk's attention
  split at the cached prefix (the CPU path without the kernel) against one masked call.
* ``huge_pages_ab``: decode steps of 1 and 8 sequences at 1k and of 1 at 8k with the
  weights on transparent huge pages (:mod:`prefixcache.model.cpu.host_memory`,
  the default) against 4 KiB pages (a CPU backend with ``huge_pages`` off): two copies of the
  model, loaded one under each setting.
* ``packed_ab``: decode steps of 1, 4 and 8 sequences at 1k context with the decoder's
  linear layers prepacked for oneDNN (:class:`~prefixcache.model.cpu.packed_linear.
  PackedLinear`, the default) against plain ``F.linear`` (packing switched off).
"""
from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

CONTEXTS = (512, 1024, 2048, 4096, 8192)


def _spread(v: list[float]) -> dict[str, float]:
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


def _interleaved(fns: dict[str, Callable[[], object]], repeats: int,
                 sync: Callable[[], object] = lambda: None) -> dict[str, dict]:
    """Median and spread (seconds) of each function, run in interleaved rounds; ``sync``
    waits for the device after each call (``torch.cuda.synchronize`` on CUDA)."""
    for fn in fns.values():
        fn()
    sync()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[k].append(time.perf_counter() - t0)
    return {k: _spread(v) for k, v in times.items()}


def _paired(default: Callable[[], object], other: Callable[[], object], repeats: int,
            names: tuple[str, str]) -> dict[str, dict]:
    """``{names[0]: spread, names[1]: spread, "ratio": spread}`` (seconds): ``default``
    and ``other`` run once each to warm up, then in ``repeats`` interleaved rounds; the
    ratio is ``other / default`` of each round (> 1: the default is faster)."""
    default()
    other()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((default, times[0]), (other, times[1])):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return {names[0]: _spread(times[0]), names[1]: _spread(times[1]),
            "ratio": _spread([o / d for d, o in zip(*times)])}


def _random_pool(model, num_pages: int, bs: int):
    """A KV pool of ``num_pages`` pages, every element written (normal noise): a step's
    cost does not depend on the values, but pages never written would all read one
    shared zero page."""
    kv = model.new_kv_pool(num_pages, bs)
    for k, v in zip(kv.k, kv.v):
        k.normal_()
        v.normal_()
    return kv


def _decode_batch(nseq: int, ctx: int, pages: list[int], bs: int, vocab: int,
                  device: torch.device | str = "cpu"):
    from prefixcache.model.forward_batch import ForwardBatch, SeqChunk

    per = -(-ctx // bs)
    seqs, slots = [], []
    for i in range(nseq):
        table = pages[i * per:(i + 1) * per]
        seqs.append(SeqChunk(i, 1, ctx, torch.tensor(table, device=device)))
        slots.append(table[(ctx - 1) // bs] * bs + (ctx - 1) % bs)
    g = torch.Generator().manual_seed(ctx)
    return ForwardBatch(torch.randint(0, vocab, (nseq,), generator=g).to(device),
                        torch.full((nseq,), ctx - 1, device=device),
                        torch.tensor(slots, device=device), seqs,
                        torch.arange(nseq, device=device))


def _hf_cache(hf, nseq: int, ctx: int):
    from transformers import DynamicCache

    c = hf.config
    cache = DynamicCache(config=c)
    shape = (nseq, c.num_key_value_heads, ctx - 1, c.hidden_size // c.num_attention_heads)
    kw = dict(dtype=hf.dtype, device=hf.device)
    for layer in range(c.num_hidden_layers):
        cache.update(torch.randn(shape, **kw), torch.randn(shape, **kw), layer)
    return cache


def tpot_vs_context(model, hf, contexts=CONTEXTS, repeats: int = 3,
                    no_cache_max_ctx: int = 2048, bs: int = 16) -> list[dict]:
    """Rows ``{ctx, seqs, impl, median, min, max}`` (seconds per decode step); ``hf`` may
    be ``None`` (ours only). Runs on ``model.device`` (and ``hf``'s)."""
    vocab, dev = model.config.vocab_size, model.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rows = []
    for ctx in contexts:
        per = -(-ctx // bs)
        kv = _random_pool(model, 8 * per + 1, bs)
        pages = list(range(kv.num_pages))
        random.Random(ctx).shuffle(pages)
        fns: dict[str, Callable[[], object]] = {}
        caches = {}
        for n in (1, 8):
            b = _decode_batch(n, ctx, pages, bs, vocab, dev)
            fns[f"ours/{n}"] = partial(model, b, kv)
            if hf is not None:
                caches[n] = _hf_cache(hf, n, ctx)
                ids = torch.randint(0, vocab, (n, 1), device=hf.device)

                def hf_step(ids=ids, cache=caches[n]):
                    hf(ids, cache=cache, use_cache=True)
                    cache.crop(-1)
                fns[f"transformers-cache/{n}"] = hf_step
        if hf is not None and ctx <= no_cache_max_ctx:
            full = torch.randint(0, vocab, (1, ctx), device=hf.device)
            fns["transformers-no-cache/1"] = partial(hf, full, use_cache=False,
                                                     logits_to_keep=1)
        with torch.inference_mode():
            res = _interleaved(fns, repeats, sync)
        for key, r in res.items():
            impl, seqs = key.split("/")
            rows.append({"ctx": ctx, "seqs": int(seqs), "impl": impl, **r})
        del kv, caches
    return rows


def packed_ab(model, seqs=(1, 4, 8), ctx: int = 1024, repeats: int = 5,
              bs: int = 16) -> list[dict]:
    """Rows ``{seqs, packed: {median, min, max}, f_linear: {...}, ratio: {...}}``: step
    seconds with the decoder's projections packed or not (the weight-streaming kernel of
    1-8 rows off in both), and the paired ratio ``f_linear / packed`` of each round (> 1:
    packing is faster). Empty unless the model runs on the CPU backend."""
    base = _cpu_backend(model)
    if base is None:
        return []
    projs = [p for layer in model.decoder_layers for p in layer.linears()]
    enabled = [p.enabled for p in projs]
    per = -(-ctx // bs)
    kv = _random_pool(model, max(seqs) * per + 1, bs)
    pages = list(range(kv.num_pages))
    random.Random(1).shuffle(pages)
    rows = []

    def run(b, on: bool):
        for p, e in zip(projs, enabled):
            p.enabled = e and on
        model(b, kv)
    try:
        model.set_backend(base.replace(small_gemm=False))
        with torch.inference_mode():
            for n in seqs:
                b = _decode_batch(n, ctx, pages, bs, model.config.vocab_size, model.device)
                rows.append({"seqs": n, **_paired(partial(run, b, True), partial(run, b, False),
                                                  repeats, ("packed", "f_linear"))})
    finally:
        for p, e in zip(projs, enabled):
            p.enabled = e
        model.set_backend(base)
    return rows


def _cpu_backend(model):
    """The model's :class:`CpuKernelBackend`, or None when it runs on another backend."""
    from prefixcache.model.cpu.backend import CpuKernelBackend

    b = model.backend
    return b if isinstance(b, CpuKernelBackend) else None


def _switch_ab(model, backends: tuple, steps, repeats: int, names: tuple[str, str]
               ) -> list[dict]:
    """Paired rounds of one model step on ``backends[0]`` (``names[0]``) and
    ``backends[1]`` (``names[1]``), for each ``(label, (batch, kv))`` of ``steps`` (built
    one at a time, so one pool is alive); rows ``{**label, names[0]: ..., names[1]: ...,
    ratio: ...}``. The model's backend is restored after."""
    rows = []
    before = model.backend

    def run(b, kv, backend):
        model.set_backend(backend)
        model(b, kv)
    try:
        with torch.inference_mode():
            for label, (b, kv) in steps:
                rows.append({**label, **_paired(partial(run, b, kv, backends[0]),
                                                partial(run, b, kv, backends[1]), repeats,
                                                names)})
                del kv
    finally:
        model.set_backend(before)
    return rows


def _decode_step(model, n: int, ctx: int, bs: int):
    """A pool and a batch of ``n`` sequences decoding at ``ctx``, pages shuffled."""
    kv = _random_pool(model, n * -(-ctx // bs) + 1, bs)
    pages = list(range(kv.num_pages))
    random.Random(ctx).shuffle(pages)
    return _decode_batch(n, ctx, pages, bs, model.config.vocab_size, model.device), kv


def _steps_ab(model, backends: tuple, names: tuple[str, str], decode_cases, prefill_cases,
              repeats: int, bs: int) -> list[dict]:
    """:func:`_switch_ab` of ``backends`` over decode steps ``{seqs, ctx}`` and prefill
    steps ``{new, ctx}`` (each built when its turn comes)."""
    steps = [*(({"seqs": n, "ctx": ctx}, partial(_decode_step, model, n, ctx, bs))
               for n, ctx in decode_cases),
             *(({"new": new, "ctx": ctx}, partial(_prefill_step, model, new, ctx, bs))
               for new, ctx in prefill_cases)]
    return _switch_ab(model, backends, ((label, make()) for label, make in steps), repeats,
                      names)


def _switch_pair(model, switch: str) -> tuple | None:
    """The model's CPU backend with ``switch`` on and off, or None when it does not run
    on the CPU backend or the switch cannot be on (kernels not built, fused ops not
    bit-identical here)."""
    base = _cpu_backend(model)
    if base is None:
        return None
    on, off = base.replace(**{switch: True}), base.replace(**{switch: False})
    return (on, off) if getattr(on, switch) else None


def kernel_ab(model, cases=((1, 1024), (8, 1024), (1, 8192), (8, 4096)),
              repeats: int = 5, bs: int = 16) -> list[dict]:
    """Rows ``{seqs, ctx, in_place: {median, min, max}, gathered: {...}, ratio: {...}}``:
    decode step seconds with attention reading pages in place (the CPU kernel of
    :mod:`prefixcache.model.cpu.kernels.paged_decode`, the default) or gathering them into a
    copy for SDPA (the CPU backend's ``decode_kernel`` switch off), and the paired ratio
    ``gathered / in_place`` of each round (> 1: in place is faster). Empty when the
    kernel is unavailable (not built, or not a CPU model)."""
    pair = _switch_pair(model, "decode_kernel")
    if pair is None:
        return []
    return _steps_ab(model, pair, ("in_place", "gathered"), cases, (), repeats, bs)


def cpu_kernels_ab(model, decode_cases=((1, 512), (4, 1024)),
                   prefill_cases=((2048, 2048), (64, 2048)), repeats: int = 5,
                   bs: int = 16) -> list[dict]:
    """Rows as :func:`kernel_ab` (decode ``{seqs, ctx}``, prefill ``{new, ctx}``): whole
    steps with all the CPU kernels (``kernels``, compute backend ``cpu-kernels``) against
    torch ops only (``torch_ops``, compute backend ``cpu``), and the paired ratio
    ``torch_ops / kernels`` (> 1: the kernels are faster). Empty when the kernels are
    unavailable."""
    from prefixcache.model.cpu.backend import CpuKernelBackend

    base = _cpu_backend(model)
    if base is None:
        return []
    kernels = CpuKernelBackend(model.dtype, kernels=True)
    if kernels.name != "cpu-kernels":
        return []
    return _steps_ab(model, (kernels, CpuKernelBackend(model.dtype, kernels=False)),
                     ("kernels", "torch_ops"), decode_cases, prefill_cases, repeats, bs)


def _prefill_step(model, new: int, ctx: int, bs: int):
    """A pool of random KV and a batch of one prefill chunk: ``new`` tokens after
    ``ctx - new`` cached ones (``new == ctx``: a cold prompt)."""
    from prefixcache.model.forward_batch import ForwardBatch, SeqChunk

    pages = -(-ctx // bs)
    kv = _random_pool(model, pages + 1, bs)
    first, dev = ctx - new, model.device
    g = torch.Generator().manual_seed(ctx)
    ids = torch.randint(0, model.config.vocab_size, (new,), generator=g).to(dev)
    b = ForwardBatch(ids, torch.arange(first, ctx, device=dev),
                     torch.arange(first, ctx, device=dev),
                     [SeqChunk(0, new, ctx, torch.arange(pages, device=dev))],
                     torch.tensor([new - 1], device=dev))
    return b, kv


def prefill_ab(model, cases=((2048, 2048), (256, 2048), (900, 7500)), repeats: int = 3,
               bs: int = 16) -> list[dict]:
    """Rows ``{new, ctx, in_place: {median, min, max}, torch: {...}, ratio: {...}}``: one
    prefill step of ``new`` tokens after ``ctx - new`` cached ones with the chunk's
    attention read in place by the CPU prefill kernel
    (:mod:`prefixcache.model.cpu.kernels.paged_prefill`, the default) or by torch's SDPA
    (the ``prefill_kernel`` switch off: causal flash for a cold prompt, the split of
    :func:`split_ab` after a prefix), and the paired ratio ``torch / in_place``. Empty
    when the kernel is unavailable."""
    pair = _switch_pair(model, "prefill_kernel")
    if pair is None:
        return []
    return _steps_ab(model, pair, ("in_place", "torch"), (), cases, repeats, bs)


def fused_ab(model, decode_cases=((1, 1024), (8, 1024)), prefill_cases=((2048, 2048),),
             repeats: int = 5, bs: int = 16) -> list[dict]:
    """Rows ``{seqs, ctx}`` (decode) or ``{new, ctx}`` (prefill) with ``fused: {median,
    min, max}, torch: {...}, ratio: {...}``: one step with the decoder layer's
    elementwise ops fused (:mod:`prefixcache.model.cpu.kernels.fused_ops`: RoPE and the KV
    write, SiLU times up, RMSNorm's scaling; the default) or as torch ops (the
    ``fused_ops`` switch off), the same bits either way, and the paired ratio
    ``torch / fused``. Empty when the ops are unavailable."""
    pair = _switch_pair(model, "fused_ops")
    if pair is None:
        return []
    return _steps_ab(model, pair, ("fused", "torch"), decode_cases, prefill_cases, repeats,
                     bs)


def small_gemm_ab(model, decode_cases=((1, 1024), (4, 1024), (8, 1024)), repeats: int = 5,
                  bs: int = 16) -> list[dict]:
    """Rows ``{seqs, ctx, small: {median, min, max}, onednn: {...}, ratio: {...}}``: a
    decode step with the linears of 1-8 rows on the weight-streaming kernel
    (:mod:`prefixcache.model.cpu.kernels.small_gemm`, the default) or on oneDNN's packed
    kernel (``F.linear`` at one row; the ``small_gemm`` switch off), and the paired ratio
    ``onednn / small``. Empty when the kernel is unavailable."""
    pair = _switch_pair(model, "small_gemm")
    if pair is None:
        return []
    return _steps_ab(model, pair, ("small", "onednn"), decode_cases, (), repeats, bs)


def huge_pages_ab(model_dir: Path, dtype: str,
                  decode_cases=((1, 1024), (8, 1024), (1, 8192)), repeats: int = 5,
                  bs: int = 16) -> list[dict]:
    """Rows ``{seqs, ctx, huge: {median, min, max}, small_pages: {...}, ratio: {...}}``: a
    decode step of the model loaded with its weights on huge pages (the default) and of a
    second copy loaded on a CPU backend with ``huge_pages`` off, and the paired ratio
    ``small_pages / huge``. Only the weights differ (the KV pool is on 4 KiB pages for
    both): the heap (activations) is
    set up once per process, and is left unadvised for both when this is the process's
    first model load. Empty where no huge pages are advised (not Linux)."""
    from prefixcache.model.cpu import host_memory
    from prefixcache.model.loader import load_model, make_backend

    if not host_memory.huge_pages_enabled():
        return []
    base = make_backend("auto", "cpu", getattr(torch, dtype))
    if not hasattr(base, "replace"):
        return []
    names = ("huge", "small_pages")
    models = {}
    # 4 KiB first: the process's one heap set-up (host_memory.keep_freed_memory) then
    # leaves the heap unadvised, so that copy's weights do not land on huge pages
    for name in reversed(names):
        backend = base.replace(huge_pages=name == "huge")
        models[name] = load_model(str(model_dir), "cpu", getattr(torch, dtype),
                                  compute_backend=backend).model
    rows = []
    for n, ctx in decode_cases:
        steps = {name: _decode_step(models[name], n, ctx, bs) for name in names}
        with torch.inference_mode():
            huge, small = (partial(models[name], *steps[name]) for name in names)
            rows.append({"seqs": n, "ctx": ctx, **_paired(huge, small, repeats, names)})
        del steps
    return rows


def split_ab(model, cases=((256, 2048), (900, 7500)), repeats: int = 3,
             bs: int = 16) -> list[dict]:
    """Rows ``{new, ctx, split: {median, min, max}, masked: {...}, ratio: {...}}``: one
    prefill step of ``new`` tokens after ``ctx - new`` cached ones, with the prefill
    kernel off and the chunk's attention as two flash calls merged by log-sum-exp
    (:func:`~prefixcache.model.cpu.backend.prefix_split_attention`, the CPU path without
    the kernel) or as one SDPA call with a ``[new, ctx]`` mask, and the paired ratio
    ``masked / split``. Empty unless the model runs on the CPU backend."""
    base = _cpu_backend(model)
    if base is None:
        return []
    pair = (base.replace(prefill_kernel=False, split_prefix=True),
            base.replace(prefill_kernel=False, split_prefix=False))
    return _steps_ab(model, pair, ("split", "masked"), (), cases, repeats, bs)


def bandwidth_gbs(repeats: int = 5) -> dict[str, dict]:
    """Read bandwidth (GB/s) of one thread: a GEMV over a 256 MiB float32 matrix (the
    access pattern of a one-row decode step), and a plain ``sum``."""
    w = torch.randn(65536, 1024)
    x = torch.randn(1024)
    nbytes = w.numel() * 4
    res = _interleaved({"gemv": lambda: torch.mv(w, x), "sum": lambda: w.sum()}, repeats)
    return {k: {"median": nbytes / r["median"] / 1e9, "min": nbytes / r["max"] / 1e9,
                "max": nbytes / r["min"] / 1e9} for k, r in res.items()}


def weight_bytes(model) -> int:
    """Bytes a one-row step reads: decoder weights plus ``lm_head`` (embeddings tied or
    not, the head is read once)."""
    n = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
            if not name.startswith("embed"))
    if model.config.tie_word_embeddings:
        n += model.embed.numel() * model.embed.element_size()
    return n


def step_breakdown(model_dir: Path, dtype: str, steps: int = 24, nseq: int = 8,
                   ctx: int = 1024) -> dict:
    """Per-step seconds of the engine's parts with ``nseq`` sequences decoding at about
    ``ctx`` tokens of context (prompts share a ``ctx - 16``-token prefix)."""
    from prefixcache.engine.llm import LLM
    from prefixcache.sampling_params import SamplingParams

    llm = LLM(str(model_dir), dtype=dtype, num_pages=nseq * (ctx + steps) // 16 + 64)
    eng = llm.engine
    vocab = eng.model_config.vocab_size
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(10, min(vocab, 32000), (ctx - 16,), generator=g).tolist()
    prompts = [{"prompt_token_ids": prefix + torch.randint(
        10, min(vocab, 32000), (16,), generator=g).tolist()} for _ in range(nseq)]
    parts = {"schedule": (eng.scheduler, "schedule"), "build_batch": (eng.runner, "build_batch"),
             "forward": (eng.runner, "forward"), "sample": (eng.runner, "_sample")}
    cur: dict[str, float] = {}
    reals = {name: getattr(obj, attr) for name, (obj, attr) in parts.items()}
    for name, (obj, attr) in parts.items():
        real = reals[name]

        def timed(*a, real=real, name=name, **kw):
            t0 = time.perf_counter()
            out = real(*a, **kw)
            cur[name] = cur.get(name, 0.0) + time.perf_counter() - t0
            return out
        setattr(obj, attr, timed)
    real_step = eng.step
    records: list[dict[str, float]] = []

    def step():
        cur.clear()
        running = list(eng.scheduler.running.values())
        decoding = len(running) == nseq and all(r.prefill_done for r in running)
        t0 = time.perf_counter()
        out = real_step()
        total = time.perf_counter() - t0
        if decoding:
            records.append({**cur, "total": total})
        return out
    setattr(eng, "step", step)  # noqa: B010 (mypy: no assignment to a method)
    llm.generate(prompts, SamplingParams(max_tokens=steps + 2, temperature=0.0,
                                         ignore_eos=True))
    for name, (obj, attr) in parts.items():
        setattr(obj, attr, reals[name])  # (runner.forward is an instance attribute)
    setattr(eng, "step", real_step)  # noqa: B010
    keys = [*parts, "total"]
    med = {k: statistics.median(r.get(k, 0.0) for r in records) for k in keys}
    med["other (publish, outputs)"] = med["total"] - sum(med[k] for k in parts)
    host = med["total"] - med["forward"]
    return {"seqs": nseq, "ctx": ctx, "steps_measured": len(records),
            "median_s": med, "host_share": host / med["total"],
            "spread_total_s": _spread([r["total"] for r in records])}


def suite_decode(model_dir: Path, dtype: str, repeats: int) -> dict:
    """All four measurements on ``model_dir`` (see the module doc)."""
    import transformers

    from prefixcache.model.loader import load_model

    tdtype = getattr(torch, dtype)
    model = load_model(str(model_dir), "cpu", tdtype).model
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=tdtype).eval()
    rows = tpot_vs_context(model, hf, repeats=repeats)
    del hf
    packed = packed_ab(model, repeats=max(repeats, 5))
    in_place = kernel_ab(model, repeats=max(repeats, 5))
    prefill = prefill_ab(model, repeats=repeats)
    fused = fused_ab(model, repeats=max(repeats, 5))
    small = small_gemm_ab(model, repeats=max(repeats, 5))
    split = split_ab(model, repeats=repeats)
    huge = huge_pages_ab(model_dir, dtype, repeats=max(repeats, 5))
    bw = bandwidth_gbs()
    steps = {}
    for name in ("float32", "bfloat16"):
        m = model if name == dtype else load_model(str(model_dir), "cpu",
                                                   getattr(torch, name)).model
        kv = _random_pool(m, 80, 16)
        b = _decode_batch(1, 1024, list(range(80)), 16, m.config.vocab_size)
        steps[name] = (m, kv, b)
    with torch.inference_mode():
        t = _interleaved({k: partial(m, b, kv) for k, (m, kv, b) in steps.items()},
                         max(repeats, 5))
    bound = {k: {"step_s": t[k], "weight_bytes": weight_bytes(steps[k][0]),
                 "bound_s": weight_bytes(steps[k][0]) / (bw["gemv"]["median"] * 1e9)}
             for k in steps}
    del steps
    at = {(r["impl"], r["seqs"], r["ctx"]): r["median"] for r in rows}
    flat = {str(n): at[("ours", n, 8192)] / at[("ours", n, 512)] for n in (1, 8)}
    batched = at[("ours", 1, 1024)] * 8 / at[("ours", 8, 1024)]
    breakdown = step_breakdown(model_dir, dtype)
    return {"tpot_vs_context": rows, "bandwidth_gbs": bw, "bandwidth_bound": bound,
            "tpot_8k_over_512": flat, "batched_8_over_1_tok_s": batched,
            "step_breakdown": breakdown, "packed_ab": packed, "kernel_ab": in_place,
            "prefill_ab": prefill, "fused_ab": fused,
            "small_gemm_ab": small, "split_ab": split, "huge_pages_ab": huge,
            "goals": {"TPOT 8k <= 1.25x TPOT 512 (1 seq)": flat["1"] <= 1.25,
                      "TPOT 8k <= 1.25x TPOT 512 (8 seqs)": flat["8"] <= 1.25,
                      "8 seqs >= 5x tokens/s of 1 at 1k": batched >= 5.0,
                      "host <= 10% of step, 8 decoding": breakdown["host_share"] <= 0.10}}
