"""``GET /v1/cache/info``: what this replica serves and how it keys its pages.

A router (or any client that computes page hashes, DESIGN "One key everywhere") reads it
instead of being told the same facts by flags, and refuses replicas that disagree::

    {"object": "cache.info", "model": "builtin:tiny", "served_model_names": [...],
     "model_fingerprint": "builtin:tiny|kv=float32|bs=16|layout=1", "block_size": 16,
     "kv_dtype": "float32", "page_hash": "blake2b-128", "max_model_len": 8192,
     "hash_root_seed_digest": "<32 hex digits>", "hash_root_seed": "..." (admin only)}

Read-only, authenticated like ``/v1/models`` (401 without a valid key when the server has
a key file). The page-hash root seed is a per-deployment secret (whoever holds it can
compute the page hashes of guessed prompts and look for them in KV events or the shared
tier), so ``hash_root_seed`` itself is given to admin callers only (an admin key; without
a key file, a server started with ``--allow-reset``); every caller gets its digest
(``cache.hashing.seed_digest``), enough to check that a seed given elsewhere agrees.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from prefixcache.cache.hashing import seed_digest

PATH = "/v1/cache/info"
PAGE_HASH = "blake2b-128"


async def cache_info(request: Request) -> JSONResponse:
    settings = request.app.state.settings
    principal = settings.auth.authenticate(request.headers.get("authorization"))
    engine = request.app.state.engine.engine
    config = engine.config
    body = {"object": "cache.info", "model": settings.model_root or settings.model_names[0],
            "served_model_names": list(settings.model_names),
            "model_fingerprint": engine.fingerprint, "block_size": config.block_size,
            "kv_dtype": config.kv_dtype, "page_hash": PAGE_HASH,
            "max_model_len": engine.max_model_len,
            "hash_root_seed_digest": seed_digest(config.hash_root_seed)}
    if principal.admin:
        body["hash_root_seed"] = config.hash_root_seed
    return JSONResponse(body)


ROUTES = (("GET", PATH, cache_info),)
