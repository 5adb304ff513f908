"""prefixcache on Ray Serve (the ``ray`` extra: ``pip install prefixcache[ray]``).

Two deployments (:mod:`.app`): an HTTP ingress (:mod:`.ingress`) that authenticates,
parses and hashes each request as the server and the router do, and N engine replicas
(:mod:`.replica`), each running one engine behind the server's own FastAPI app. The
ingress's deployment handle routes to the replicas with :mod:`.request_router`: the
router's policy and page index, fed by each replica's KV events.
"""
