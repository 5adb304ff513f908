"""OpenAI-compatible HTTP server: ``prefixcache serve``.

Modules: :mod:`.protocol` (request bodies), :mod:`.errors` (OpenAI error objects),
:mod:`.auth` (API keys -> tenants), :mod:`.async_engine` (the engine on a background
thread), :mod:`.requests` (OpenAI body -> prepared request), :mod:`.responses` (JSON,
SSE and logprob rendering), :mod:`.serving` (runs a prepared request), :mod:`.bodies`
(body limit, off-loop parsing), :mod:`.crosssite` (Content-Type / Origin / Host checks),
:mod:`.drain` (graceful shutdown), :mod:`.logsafe` (client text in log lines),
:mod:`.metrics` (Prometheus), :mod:`.app` (FastAPI routes), :mod:`.http_server`
(uvicorn: header timeout, draining), :mod:`.cli` (the ``serve`` subcommand).
"""
