"""One request's view of the cache: its pages, their hashes, and how far it computed."""
from __future__ import annotations

from dataclasses import dataclass, field

from prefixcache.cache.prefix_index import ParentRef


@dataclass(eq=False)
class PageTable:
    """Pages holding one request's KV, in position order.

    ``pages[i]`` holds positions ``[i * block_size, (i + 1) * block_size)``. Positions
    below ``num_computed_tokens`` have their KV written by a completed step (or were read
    from the cache); pages from ``len(chain_refs)`` on are still private to this request.

    Attributes:
        request_id: owner of the table (unique among live tables).
        tenant: the tenant of its namespace; owner of the pages it takes from the pool.
        token_ids: the request's tokens (prompt, then generated); the manager reads it as
            it grows, never writes it.
        root_key / root_hash: encoded namespace root and its hash.
        page_extra: extra-keys bytes for pages without multimodal content.
        mm_hashes: ``(offset, length, content_hash)`` of multimodal inputs, in tokens.
        read_cache: ``False`` for requests that must compute every position (prompt
            logprobs); they still publish.
        hashes: page hashes computed so far (lazily, each page hashed once).
        chain_refs: for each finalized page position, the entry id of the published page
            holding that content (ours or an identical one), or ``None`` once the chain
            cannot be published (caching off, collision with a live page).
        dup_positions: positions whose chain ref names another request's identical page
            (this table computed a private duplicate). Only these refs can die while the
            table lives (the other page is evicted), which makes the rest of the chain
            unreachable: the table then stops publishing.
        num_computed_tokens: tokens whose KV is complete.
        num_cached_tokens: tokens this table took from the cache instead of computing.
        num_inflight_hit_tokens: the part of ``num_cached_tokens`` taken after admission,
            that is pages published by a concurrent leader while this request followed.
        hit_memo: the last hit computed for the table, with the state it holds for.
    """

    request_id: str
    token_ids: list[int]
    root_key: bytes
    root_hash: bytes
    page_extra: bytes
    mm_hashes: tuple = ()
    tenant: str | None = None
    extra_keys: tuple = ()
    read_cache: bool = True
    pages: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    chain_refs: list[ParentRef | None] = field(default_factory=list)
    dup_positions: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_inflight_hit_tokens: int = 0
    admitted: bool = False
    hit_memo: tuple | None = field(default=None, repr=False)  # see cache/hits.py

    @property
    def num_pages(self) -> int:
        return len(self.pages)
