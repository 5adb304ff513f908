"""Re-exports :mod:`prefixcache.http.logsafe` (the HTTP foundation) for the server's modules."""
from prefixcache.http.logsafe import (  # noqa: F401
    MAX_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_NAMES,
    SafeFormatter,
    clean,
    name_list,
)
