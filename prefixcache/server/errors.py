"""Re-exports :mod:`prefixcache.http.errors` (the HTTP foundation) for the server's modules."""
from prefixcache.http.errors import (  # noqa: F401
    INVALID_REQUEST,
    PERMISSION,
    RATE_LIMIT,
    SERVER_ERROR,
    APIError,
    bad_request,
    error_body,
)
