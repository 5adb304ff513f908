"""A fake model that checks every KV read and write the engine makes.

Each KV slot it writes holds ``[token, position, chain, 1]`` where ``chain`` is a running
hash of the tokens up to that position. Before computing a chunk it reads the context
``[0, start)`` through the page table and checks, per position, that the slot was
written (marker 1), holds that position, and continues the chain of the previous
position; so reading an unwritten, half-written or foreign page fails immediately.
Its greedy next token is ``chain % vocab``; :func:`oracle` computes the same without any
cache, so any KV mix-up also shows in the outputs.

It also checks, at every step, DESIGN.md's rules: pages read are published or private
to the reader, and no hitable page is computed while it is published or in flight with
another owner (no page is computed twice while its first computation is alive).
"""
from __future__ import annotations

import torch

from prefixcache.cache.page_pool import PageState
from prefixcache.model.config import ModelConfig
from prefixcache.model.kv_pool import KVPool
from prefixcache.model.loader import LoadedModel

VOCAB = 64
MOD = 1 << 20  # chain values stay exact in float32


def chain(prev: int, token: int) -> int:
    return (prev * 1009 + token + 1) % MOD


def oracle(prompt: list[int], max_tokens: int) -> list[int]:
    c = 0
    for t in prompt:
        c = chain(c, t)
    out = []
    for _ in range(max_tokens):
        t = c % VOCAB
        out.append(t)
        c = chain(c, t)
    return out


class FakeModel:
    def __init__(self):
        self.engine = None  # set by the test after the engine is built
        self.steps = 0
        self.page_reads = 0

    def forward(self, batch, kv: KVPool) -> torch.Tensor:
        self.steps += 1
        k = kv.k[0].view(-1, 4)
        bs = kv.block_size
        ids = batch.input_ids.tolist()
        logits_rows = set(batch.logits_indices.tolist())
        out_chain = {}
        for seq in batch.seqs:
            pages = seq.page_table.tolist()
            start = seq.ctx_len - seq.q_len
            self._check_pages(pages, start, seq.q_len, bs)
            prev = 0
            for p in range(start):
                slot = pages[p // bs] * bs + p % bs
                tok, pos, c, mark = (int(x) for x in k[slot].tolist())
                assert mark == 1, f"read of unwritten position {p}"
                assert pos == p, f"position {p} holds position {pos}"
                assert c == chain(prev, tok), f"broken chain at position {p}"
                prev = c
            for j in range(seq.q_len):
                row = seq.q_start + j
                p = start + j
                prev = chain(prev, ids[row])
                slot = pages[p // bs] * bs + p % bs
                k[slot] = torch.tensor([ids[row], p, prev, 1], dtype=k.dtype)
                out_chain[row] = prev
        rows = batch.logits_indices.tolist()
        logits = torch.zeros(len(rows), VOCAB)
        for i, r in enumerate(rows):
            logits[i, out_chain[r] % VOCAB] = 10.0
        assert logits_rows == set(rows)
        return logits

    def _check_pages(self, pages: list[int], start: int, q_len: int, bs: int) -> None:
        eng = self.engine
        pool = eng.cache.pool
        owner = next((r for r in eng.scheduler.running.values() if r.page_table is not None
                      and r.page_table.pages[:len(pages)] == pages), None)
        assert owner is not None, "a page table that belongs to no running request"
        for page in pages[:-(-start // bs)]:
            self.page_reads += 1
            st = pool.state[page]
            pending_own = st == PageState.PENDING and pool.ref_count[page] == 1
            assert st == PageState.PUBLISHED or pending_own, \
                f"read of page {page} in state {st.name}"
        pt = owner.page_table
        limit = eng.cache.hit_limit_pages(pt)
        last = min(limit, (start + q_len - 1) // bs + 1)
        if not owner.read_cache or last <= start // bs:
            return
        hashes = eng.cache.page_hashes(pt, last)
        for i in range(start // bs, last):
            h = hashes[i]
            assert h not in eng.cache.index, f"{owner.request_id} recomputes published page {i}"
            o = eng.cache.inflight.owner(h)
            assert o in (None, owner.request_id), \
                f"{owner.request_id} computes page {i} in flight by {o}"


def fake_loaded(max_len: int = 4096) -> LoadedModel:
    cfg = ModelConfig(architecture="LlamaForCausalLM", hidden_size=4, intermediate_size=4,
                      num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                      head_dim=4, vocab_size=VOCAB, max_position_embeddings=max_len)
    return LoadedModel(model=FakeModel(), config=cfg, tokenizer=None, model_id="fake",
                       chat_template=None)
