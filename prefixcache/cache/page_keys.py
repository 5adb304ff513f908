"""A page table's page hashes and the per-page inputs of its index keys.

The hash chain itself is framed by :meth:`.hashing.PageHasher.chain`; this module only
cuts a table's tokens into pages and finds each page's extra keys (request-level keys,
plus the multimodal inputs overlapping the page), so that hashing, matching and
publishing see exactly the same bytes.
"""
from __future__ import annotations

from prefixcache.cache.hashing import PageHasher, tokens_to_bytes
from prefixcache.cache.page_table import PageTable


class PageKeys:
    """Page bytes, extras and lazily extended hash chains for tables of one pool.

    Args:
        hasher: the model's :class:`PageHasher`.
        block_size: tokens per page (>= 1).
    """

    def __init__(self, hasher: PageHasher, block_size: int):
        self.hasher = hasher
        self.block_size = block_size
        self.page_bytes = 4 * block_size  # tokens_to_bytes: 4 bytes per token

    def new_table(self, request_id: str, token_ids: list[int], tenant: str | None,
                  cache_salt: str | None, extra_keys: tuple, mm_hashes: tuple,
                  read_cache: bool) -> PageTable:
        """An empty page table with its namespace root and extra keys encoded."""
        root_key = self.hasher.root_key(tenant, cache_salt)
        return PageTable(
            request_id=request_id, token_ids=token_ids, root_key=root_key,
            root_hash=self.hasher.root_hash(root_key),
            page_extra=self.hasher.extra_bytes(tuple(extra_keys)),
            mm_hashes=tuple(mm_hashes), tenant=tenant, extra_keys=tuple(extra_keys),
            read_cache=read_cache)

    def raw(self, pt: PageTable, first: int, last: int) -> bytes:
        """Token bytes of pages ``[first, last)``, ``page_bytes`` per page."""
        bs = self.block_size
        return tokens_to_bytes(pt.token_ids[first * bs:last * bs])

    def extra(self, pt: PageTable, i: int) -> bytes:
        """Extra-key bytes of page ``i``."""
        if not pt.mm_hashes:
            return pt.page_extra
        lo, hi = i * self.block_size, (i + 1) * self.block_size
        # Each overlapping input with its placement relative to the page start.
        mm = tuple((off - lo, n, h) for off, n, h in pt.mm_hashes if off < hi and off + n > lo)
        if not mm:
            return pt.page_extra
        return self.hasher.extra_bytes(pt.extra_keys, mm)

    def extras(self, pt: PageTable, first: int, last: int) -> bytes | list[bytes]:
        """Extras of pages ``[first, last)``: one ``bytes`` shared by all pages when the
        table has no multimodal input, else a list with one per page."""
        if not pt.mm_hashes:
            return pt.page_extra
        return [self.extra(pt, i) for i in range(first, last)]

    def hashes(self, pt: PageTable, num_pages: int) -> list[bytes]:
        """``pt.hashes``, extended to at least ``num_pages`` hashes (each page is hashed
        once, the first time it is asked for).

        Raises:
            ValueError: the tokens of those pages are not known yet.
        """
        if num_pages * self.block_size > len(pt.token_ids):
            raise ValueError(f"page {num_pages - 1} is not full yet")
        hashes = pt.hashes
        i = len(hashes)
        if i < num_pages:
            prev = hashes[-1] if hashes else pt.root_hash
            hashes += self.hasher.chain(prev, self.raw(pt, i, num_pages),
                                        self.extras(pt, i, num_pages), self.page_bytes)
        return hashes


class PromptKeys:
    """Page hashes of whole prompts for one model, outside any pool: exactly the
    engines' keys (DESIGN: one key everywhere), so the router's index matches the pages
    the replicas publish, and a tenant's prompt only matches its own tenant's pages.

    Args:
        fingerprint: the model's part of the chain root, the engines'
            :func:`~prefixcache.cache.identity.model_fingerprint`.
        root_seed: the engines' ``hash_root_seed``.
        block_size: the engines' page size, tokens.
    """

    def __init__(self, fingerprint: str, root_seed: str, block_size: int):
        self.block_size = block_size
        self.keys = PageKeys(PageHasher(fingerprint, root_seed), block_size)

    def page_hashes(self, token_ids: list[int], tenant: str | None,
                    cache_salt: str | None) -> list[bytes]:
        """Hashes of every full page of ``token_ids``, in order (16 bytes each)."""
        pt = self.keys.new_table("prompt", token_ids, tenant, cache_salt, (), (), True)
        return list(self.keys.hashes(pt, len(token_ids) // self.block_size))
