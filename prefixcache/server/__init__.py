"""OpenAI-compatible HTTP server: ``prefixcache serve``.

Modules: :mod:`.protocol` (request bodies), :mod:`.errors` (OpenAI error objects),
:mod:`.auth` (API keys -> tenants), :mod:`.async_engine` (the engine on a background
thread), :mod:`.serving` (completions and chat), :mod:`.metrics` (Prometheus),
:mod:`.app` (FastAPI routes), :mod:`.cli` (the ``serve`` subcommand).
"""
