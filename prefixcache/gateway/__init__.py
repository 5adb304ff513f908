"""``prefixcache gateway``: response caches and request shaping in front of any upstream.

Layer 1 (:mod:`.exact`, :mod:`.store`, :mod:`.singleflight`) answers a request seen
before; layer 2 (``semantic/``, opt-in per tenant) a differently worded one; layer 3 is
the upstream's own prefix cache, which :mod:`.shaping` steers (Anthropic breakpoints,
OpenAI ``prompt_cache_key``). :mod:`.accounting` normalises usage and prices it.
Submodules import each other directly; this ``__init__`` re-exports nothing.
"""
