"""Re-exports :mod:`prefixcache.http.drain` (the HTTP foundation) for the server's modules."""
from prefixcache.http.drain import (  # noqa: F401
    DEFAULT_GRACE_S,
    Drain,
    ShuttingDown,
)
