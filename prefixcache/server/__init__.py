"""OpenAI-compatible HTTP server: ``prefixcache serve``.

Modules: :mod:`.protocol` (request bodies), :mod:`.async_engine` (the engine on a background
thread), :mod:`.requests` (OpenAI body -> prepared request), :mod:`.responses` (JSON,
SSE and logprob rendering), :mod:`.serving` (runs a prepared request), :mod:`.bodies`
(bodies parsed into :mod:`.protocol`'s types), :mod:`.crosssite` (Content-Type / Origin /
Host checks), :mod:`.metrics` (Prometheus), :mod:`.app` (FastAPI routes), :mod:`.cli` (the
``serve`` subcommand). What every HTTP app shares (error objects, API keys, body limit,
draining shutdown, header timeout, log safety) is :mod:`prefixcache.http`.
"""
