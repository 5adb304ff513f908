"""Cache-aware routing over replicas: ``prefixcache router``.

Modules: :mod:`.index` (page hash -> replicas, bounded, approximate entries that
expire), :mod:`.event_stream` (the replicas' KV events: decoding, gaps, restarts),
:mod:`.policy` (cost and balance thresholds), :mod:`.replicas` (loads, health, the
index behind one lock), :mod:`.replica_info` (what the replicas serve and how they hash,
from their ``GET /v1/cache/info``; page hashes come from the cache core's
``PromptKeys``, torch-free),
:mod:`.proxy` (forwarding and streaming), :mod:`.metrics` (Prometheus), :mod:`.app`
(FastAPI routes), :mod:`.cli` (the ``router`` subcommand).
"""
