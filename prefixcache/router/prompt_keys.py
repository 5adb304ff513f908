"""The router's page hashes: exactly the engines' (DESIGN: one key everywhere).

The router renders and tokenizes a request with the server's own
:class:`~prefixcache.server.requests.RequestPreparer` (same tokenizer, chat template and
defaults), then hashes it with the cache's :class:`~prefixcache.cache.page_keys.PageKeys`
(the same chain root: root seed, model cache id, tenant, ``cache_salt``). A tenant's
request can therefore only match pages published under its own tenant.
"""
from __future__ import annotations

from prefixcache.cache.hashing import PageHasher
from prefixcache.cache.page_keys import PageKeys


class PromptKeys:
    """Page hashes of prompts for one model.

    Args:
        cache_id: the model's part of the chain root: the engines' fingerprint
            (``engine.kv_tiers.model_fingerprint`` of the model's cache id, dtype and
            block size).
        root_seed: the engines' ``hash_root_seed``.
        block_size: the engines' page size, tokens.
    """

    def __init__(self, cache_id: str, root_seed: str, block_size: int):
        self.block_size = block_size
        self.keys = PageKeys(PageHasher(cache_id, root_seed), block_size)

    def page_hashes(self, token_ids: list[int], tenant: str | None,
                    cache_salt: str | None) -> list[bytes]:
        """Hashes of every full page of ``token_ids``, in order."""
        pt = self.keys.new_table("router", token_ids, tenant, cache_salt, (), (), True)
        return list(self.keys.hashes(pt, len(token_ids) // self.block_size))
