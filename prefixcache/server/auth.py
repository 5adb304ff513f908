"""Re-exports :mod:`prefixcache.http.auth` (the HTTP foundation) for the server's modules."""
from prefixcache.http.auth import (  # noqa: F401
    Authenticator,
    KeyFileError,
    Principal,
    load_key_file,
    validate_keys,
)
