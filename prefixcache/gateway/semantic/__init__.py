"""Layer 2 of the gateway: a semantic response cache, partitioned by exact scope.

Submodules: ``embedder`` (text -> unit vectors), ``index`` (one bounded vector index per
scope), ``verify`` (the second check before a hit is served), ``redis_store`` (persistence),
``cache`` (the facade the gateway calls), ``near_miss`` (the hand-built evaluation set),
``calibration`` (precision/recall/false-hit sweeps with 95% intervals).
"""
