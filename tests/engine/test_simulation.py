"""Deterministic simulation: random interleavings of arrivals, steps, aborts,
preemptions, failed steps and resets over a fake model that checks every KV access."""
from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from prefixcache.cache.invariants import check_invariants
from prefixcache.config import EngineConfig
from prefixcache.engine.engine import LLMEngine
from prefixcache.sampling_params import SamplingParams
from tests.engine.fake_model import VOCAB, fake_loaded, oracle

BS = 16
_rng = random.Random(7)
PREFIXES = [[], [_rng.randrange(VOCAB) for _ in range(16)],
            [_rng.randrange(VOCAB) for _ in range(40)],
            [_rng.randrange(VOCAB) for _ in range(77)]]


def make_engine(num_pages=24, budget=48, **kw):
    loaded = fake_loaded(max_len=num_pages * BS)
    eng = LLMEngine(EngineConfig(model="fake", block_size=BS, num_pages=num_pages,
                                 max_num_batched_tokens=budget, shuffle_seed=1, **kw),
                    loaded=loaded)
    loaded.model.engine = eng
    return eng


class EngineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.eng = make_engine()
        self.expected: dict[str, list[int]] = {}
        self.results: dict[str, object] = {}
        self.n = 0
        self.fail_next = False
        real = self.eng.model.forward

        def forward(batch, kv):
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("injected failure")
            return real(batch, kv)

        self.eng.model.forward = forward

    def _collect(self, outs):
        for o in outs:
            if o.finished:
                self.results[o.request_id] = o

    @rule(prefix=st.integers(0, len(PREFIXES) - 1), suffix=st.lists(st.integers(0, VOCAB - 1),
          min_size=1, max_size=30), tenant=st.sampled_from([None, "a", "b"]),
          max_tokens=st.integers(1, 6), copies=st.integers(1, 3))
    def arrive(self, prefix, suffix, tenant, max_tokens, copies):
        prompt = PREFIXES[prefix] + suffix
        for _ in range(copies):
            rid = f"r{self.n}"
            self.n += 1
            self.eng.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens,
                                 temperature=0.0), tenant=tenant)
            self.expected[rid] = oracle(prompt, max_tokens)

    @rule()
    def step(self):
        self._collect(self.eng.step())

    @rule()
    def failed_step(self):
        self.fail_next = True
        self._collect(self.eng.step())
        self.fail_next = False

    @precondition(lambda self: self.eng.requests)
    @rule(data=st.data())
    def abort(self, data):
        rid = data.draw(st.sampled_from(sorted(self.eng.requests)))
        self.eng.abort_request(rid)
        self._collect(self.eng.step())

    @precondition(lambda self: self.eng.scheduler.running)
    @rule(data=st.data())
    def preempt(self, data):
        req = data.draw(st.sampled_from(list(self.eng.scheduler.running.values())))
        self.eng.scheduler.preempt(req)

    @rule()
    def reset(self):
        self.eng.reset_prefix_cache()

    @invariant()
    def pages_are_consistent(self):
        check_invariants(self.eng.cache)
        s = self.eng.stats()
        assert s["pages_free"] + s["pages_cached"] + s["pages_live"] == s["pages_total"]

    def teardown(self):
        for _ in range(10_000):
            if not self.eng.has_unfinished_requests():
                break
            self._collect(self.eng.step())
        assert not self.eng.has_unfinished_requests(), "requests never finished (deadlock?)"
        check_invariants(self.eng.cache)
        assert self.eng.stats()["pages_live"] == 0 and not self.eng.cache.tables
        assert len(self.eng.cache.inflight) == 0
        for rid, out in self.results.items():
            comp = out.outputs[0]
            if comp.finish_reason == "length":
                assert comp.token_ids == self.expected[rid], rid
            else:
                assert comp.finish_reason in ("abort", "error"), comp.finish_reason
            assert out.num_cached_tokens <= len(out.prompt_token_ids) - 1
        assert set(self.results) == set(self.expected)


TestEngineMachine = EngineMachine.TestCase
TestEngineMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])


def _distinct_work(prompts, tenants):
    """Prefill tokens the recompute rule allows: each request computes its pages from
    its hit limit on; each distinct hitable page prefix is computed once."""
    hitable = set()
    tails = 0
    for p, t in zip(prompts, tenants):
        limit = (len(p) - 1) // BS
        tails += len(p) - limit * BS
        hitable.update((t, tuple(p[:BS * (i + 1)])) for i in range(limit))
    return tails + BS * len(hitable)




@given(shape=st.lists(st.tuples(st.integers(0, len(PREFIXES) - 1), st.integers(1, 40),
                                st.sampled_from(["a", "b"])), min_size=1, max_size=8),
       budget=st.sampled_from([16, 37, 64, 2048]))
@settings(max_examples=40, deadline=None)
def test_prefill_work_equals_distinct_pages(shape, budget):
    """Requests arriving together, no memory pressure: the prefill tokens computed equal
    the distinct pages needed under the recompute rule (no page computed twice)."""
    eng = make_engine(num_pages=256, budget=budget)
    prompts, tenants = [], []
    for i, (pre, n_suffix, tenant) in enumerate(shape):
        # a unique suffix: no prompt is a prefix of another, so no tail page is shared
        suffix = [VOCAB - 1 - (i % 4)] + [(i * 7 + j) % VOCAB for j in range(n_suffix)]
        suffix[0:0] = [i % VOCAB, (i // VOCAB) % VOCAB]
        prompts.append(PREFIXES[pre] + suffix)
        tenants.append(tenant)
        eng.add_request(f"r{i}", prompts[-1], SamplingParams(max_tokens=2, temperature=0.0),
                        tenant=tenant)
    outs = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                outs[o.request_id] = o
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"].outputs[0].token_ids == oracle(p, 2)
    assert eng.stats()["prefill_tokens_computed"] == _distinct_work(prompts, tenants)
    assert eng.stats()["pages_live"] == 0
