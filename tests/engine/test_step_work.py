"""Per-step work is proportional to what changed, counted (never timed): outputs share
the request's lists, penalties read only new tokens, stop ids are a set, and the
scheduler re-matches a request against the cache only when the cache changed."""
from __future__ import annotations

from prefixcache.config import EngineConfig
from prefixcache.engine.engine import LLMEngine
from prefixcache.sampling_params import SamplingParams
from tests.engine.fake_model import fake_loaded, oracle

BS = 16


def fake_engine(num_pages: int = 64, **kw) -> LLMEngine:
    loaded = fake_loaded(max_len=num_pages * BS)
    eng = LLMEngine(EngineConfig(model="fake", block_size=BS, num_pages=num_pages,
                                 shuffle_seed=1, **kw), loaded=loaded)
    loaded.model.engine = eng
    return eng


class CountingList(list):
    """A list that counts the elements read by copies, slices and iteration, and the
    membership tests made on it."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = 0
        self.contains_calls = 0

    def __getitem__(self, i):
        out = super().__getitem__(i)
        if isinstance(i, slice):
            self.read += len(out)
        return out

    def __iter__(self):
        self.read += len(self)
        return super().__iter__()

    def __contains__(self, x):
        self.contains_calls += 1
        return super().__contains__(x)

    def copy(self):
        self.read += len(self)
        return super().copy()


def run(eng: LLMEngine) -> list:
    outs = []
    while eng.has_unfinished_requests():
        outs.extend(eng.step())
    return outs


PROMPT = [(5 * i + 3) % 64 for i in range(40)]


def test_outputs_share_the_request_lists_instead_of_copying_them():
    eng = fake_engine()
    n = 120
    req = eng.add_request("a", PROMPT, SamplingParams(max_tokens=n, temperature=0.0,
                                                      ignore_eos=True, logprobs=1))
    req.output_token_ids = CountingList()
    req.logprobs = CountingList()
    outs = run(eng)
    assert len(outs) == n
    # Building 120 outputs and sampling 120 tokens read nothing of the history.
    assert req.output_token_ids.read == 0 and req.logprobs.read == 0
    final = outs[-1].outputs[0]
    assert final.token_ids is req.output_token_ids  # finished: shared, not copied
    assert req.output_token_ids.read == 0
    # Each streamed output still shows its own cumulative snapshot.
    ref = oracle(PROMPT, n)
    assert final.token_ids == ref
    assert [o.outputs[0].num_tokens for o in outs] == list(range(1, n + 1))
    assert outs[9].outputs[0].token_ids == ref[:10]
    assert outs[9].outputs[0].token_ids_from(7) == ref[7:10]
    assert len(outs[9].outputs[0].logprobs) == 10
    assert outs[9].outputs[0].logprobs_from(8) == req.logprobs[8:10]


def test_penalties_read_each_generated_token_once():
    eng = fake_engine()
    n = 100
    req = eng.add_request("a", PROMPT, SamplingParams(
        max_tokens=n, temperature=0.0, ignore_eos=True, frequency_penalty=0.5,
        repetition_penalty=1.2))
    req.output_token_ids = CountingList()
    run(eng)
    assert len(req.output_token_ids) == n
    # Before sampling token k the counts take in token k - 1 alone: n - 1 reads in all
    # (re-reading the history every step would be n * (n - 1) / 2 = 4950).
    assert req.output_token_ids.read == n - 1
    counts = req.penalty_counts.output_counts
    assert int(counts.sum()) == n - 1  # the last token is never sampled over
    assert req.penalty_counts.prompt_seen.sum() == len(set(PROMPT))


def test_many_stop_ids_are_checked_in_constant_time_per_token():
    ref = oracle(PROMPT, 30)
    stop_at = 5
    assert ref.index(ref[stop_at]) == stop_at  # its first occurrence
    never = next(t for t in range(64) if t not in ref)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True,
                            stop_token_ids=[never] * 5000 + [ref[stop_at]])
    params.stop_token_ids = CountingList(params.stop_token_ids)
    eng = fake_engine()
    eng.add_request("a", PROMPT, params)
    reads_at_admission = params.stop_token_ids.read
    outs = run(eng)
    out = outs[-1].outputs[0]
    assert out.token_ids == ref[:stop_at + 1]
    assert out.finish_reason == "stop" and out.stop_reason == ref[stop_at]
    assert params.stop_token_ids.contains_calls == 0
    assert params.stop_token_ids.read == reads_at_admission  # nothing after admission
    assert reads_at_admission <= 2 * 5001  # validation and the set, once each


def count_matches(eng: LLMEngine) -> list[int]:
    """Wrap the cache's matching of a table against the index (the work a memoised probe
    saves); the returned one-element list counts its calls."""
    calls = [0]
    hits = eng.cache._hits
    real = hits._match

    def match(pt):
        calls[0] += 1
        return real(pt)

    hits._match = match
    return calls


def test_admitting_a_request_matches_it_at_most_twice():
    eng = fake_engine()
    eng.add_request("a", PROMPT, SamplingParams(max_tokens=2, ignore_eos=True))
    run(eng)
    calls = count_matches(eng)
    eng.add_request("b", PROMPT, SamplingParams(max_tokens=2, ignore_eos=True))
    eng.step()
    assert eng.requests["b"].num_cached_tokens == 32
    assert calls[0] == 1  # the probe; taking its hits reuses the memoised match


def test_waiting_requests_are_not_rematched_while_the_cache_is_unchanged():
    # 24 pages: the running request holds 7-12 of them; each waiting one needs 19, so
    # all 30 stay waiting (cache-aware ordering looks at every one of them each step).
    eng = fake_engine(num_pages=24, cache_aware_window_s=0.5)
    eng.add_request("run", [(5 * i + 3) % 64 for i in range(100)], SamplingParams(
        max_tokens=150, temperature=0.0,
                                                       ignore_eos=True))
    eng.step()
    waiting = 30
    for i in range(waiting):
        eng.add_request(f"w{i}", [(i + j) % 64 for j in range(300)],
                        SamplingParams(max_tokens=4, ignore_eos=True))
    calls = count_matches(eng)
    per_step, changed = [], 0
    for _ in range(100):
        before, gen = calls[0], eng.cache.index.generation
        eng.step()
        per_step.append(calls[0] - before)
        changed += eng.cache.index.generation != gen
    assert len(eng.scheduler.waiting) == waiting
    busy = [m for m in per_step if m]
    # Only when the cache changed is each waiting request matched again, once. It
    # changes twice per 16 decode steps: the filling page is registered in flight, then
    # published (re-matching every step would be 100 * 30 calls).
    assert busy and all(m == waiting for m in busy)
    assert len(busy) <= 2 * (100 // BS + 1)
    assert per_step[0] == waiting  # their first probe
    assert len(busy) <= 1 + changed
