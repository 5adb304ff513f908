"""The model runner's step contract: the device is synchronised before any publication,
on prefill-only steps too; the forward mode is chosen once."""
from __future__ import annotations

import pytest
import torch

from prefixcache import LLM, SamplingParams
from prefixcache.config import EngineConfig
from prefixcache.engine.engine import LLMEngine
from prefixcache.engine.model_runner import device_sync
from prefixcache.model.deterministic import forward_deterministic
from tests.engine.conftest import prompt_ids
from tests.engine.fake_model import fake_loaded, oracle

BS = 16


def fake_engine(**kw) -> LLMEngine:
    loaded = fake_loaded(max_len=64 * BS)
    eng = LLMEngine(EngineConfig(model="fake", block_size=BS, num_pages=64, shuffle_seed=1,
                                 **kw), loaded=loaded)
    loaded.model.engine = eng
    return eng


def record_sync_and_commit(eng: LLMEngine, on_commit=None) -> list[str]:
    """Replace the runner's sync hook and wrap ``cache.commit``; both log to the list."""
    events: list[str] = []
    real_sync, real_commit = eng.runner.sync, eng.cache.commit

    def sync():
        real_sync()
        events.append("sync")

    def commit(pt, n):
        if on_commit is not None:
            on_commit()
        events.append("commit")
        return real_commit(pt, n)

    eng.runner.sync = sync
    eng.cache.commit = commit
    return events


def test_sync_precedes_commit_on_prefill_only_and_sampling_steps():
    eng = fake_engine(max_num_batched_tokens=32)
    events = record_sync_and_commit(eng)
    prompt = [(7 * i) % 64 for i in range(100)]
    eng.add_request("a", prompt, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    # 100 prompt tokens at 32 per step: three steps sample nothing (prefill only).
    for _ in range(3):
        assert eng.step() == []
        assert events == ["sync", "commit"]
        events.clear()
    outs = eng.step()  # the last 4 prompt tokens, and the first token
    assert [len(o.outputs[0].token_ids) for o in outs] == [1]
    assert events == ["sync", "commit"]
    events.clear()
    while eng.has_unfinished_requests():
        outs = eng.step()
        assert events == ["sync", "commit"]
        events.clear()
    assert outs[0].outputs[0].token_ids == oracle(prompt, 3)


def test_a_failed_step_neither_syncs_nor_publishes():
    eng = fake_engine(max_num_batched_tokens=32)
    events = record_sync_and_commit(eng)
    real = eng.model.forward

    def fail(batch, kv):
        raise RuntimeError("injected")

    eng.model.forward = fail
    eng.add_request("a", list(range(40)), SamplingParams(max_tokens=2, ignore_eos=True))
    out = eng.step()
    eng.model.forward = real
    assert [o.outputs[0].finish_reason for o in out] == ["error"]
    assert events == []
    assert eng.cache.stats()["published_pages"] == 0


def test_forward_mode_is_chosen_once_per_engine(llama):
    det = LLM(llama.path, block_size=16, num_pages=64, deterministic=True)
    assert det.engine.runner.forward.func is forward_deterministic
    default = LLM(llama.path, block_size=16, num_pages=64)
    batch, _ = default.engine.runner.build_batch([])
    assert not hasattr(batch, "deterministic")


def test_device_sync_is_a_no_op_on_cpu():
    assert device_sync(torch.device("cpu"))() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_stream_is_idle_whenever_pages_publish(llama):
    dev = torch.device("cuda")
    llm = LLM(llama.path, block_size=16, num_pages=128, device="cuda",
              max_num_batched_tokens=64)
    eng = llm.engine
    idle: list[bool] = []
    events = record_sync_and_commit(
        eng, on_commit=lambda: idle.append(torch.cuda.current_stream(dev).query()))
    prompt = prompt_ids(200, seed=61)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    eng.add_request("a", prompt, params)
    steps = 0
    while eng.has_unfinished_requests():
        outs = eng.step()
        assert events[0] == "sync" and set(events[1:]) == {"commit"}, events
        events.clear()
        steps += 1
        if steps <= 3:  # 200 prompt tokens at 64 per step: prefill only
            assert outs == []
    assert idle and all(idle)
    cpu = LLM(llama.path, block_size=16, num_pages=128, max_num_batched_tokens=64)
    ref = cpu.generate([{"prompt_token_ids": prompt}], params)[0]
    assert outs[0].outputs[0].token_ids == ref.outputs[0].token_ids
