"""What every HTTP app (server, router, gateway) shares.

Modules: :mod:`.errors` (OpenAI/Anthropic error objects, :class:`~.errors.APIError`),
:mod:`.auth` (the API-key file: keys -> tenants), :mod:`.bodies` (body size limit,
parsing off the event loop), :mod:`.drain` (graceful shutdown), :mod:`.logsafe` (client
text in log lines), :mod:`.app` (the FastAPI app: error handlers, refusal while draining,
``/metrics``), :mod:`.runner` (uvicorn: header-read timeout, access log, draining on
SIGTERM). Each app adds only its routes.
"""
