"""API keys, tenants and admin rights.

The key file (``--api-keys FILE``) is a JSON object mapping each API key to its tenant
and admin flag::

    {"sk-alice-1": {"tenant": "alice", "admin": false, "quota": 0.25},
     "sk-ops":     {"tenant": "ops",   "admin": true}}

``quota`` (optional) is the tenant's share of the KV pool, in ``(0, 1]``: over it, the
tenant's allocations evict its own cached pages first (``prefixcache/cache/quotas.py``,
read by the server;
it overrides ``--tenant-quota-fraction``). Keys of one tenant must agree on it.

Clients send the key as ``Authorization: Bearer <key>``. With a key file, a request
without a key, or with an unknown one, gets 401 (``/health`` and ``/metrics`` stay
open). The tenant is derived from the key only, never from the request body, and the
engine folds it into the page-hash chain root, so tenants never share a KV page.

Without a key file the server is single-tenant: no key is needed, the tenant is
``None``, and the admin endpoint ``POST /reset_prefix_cache`` answers 403 unless the
server was started with ``--allow-reset``.

A key file that lists one key twice (with the same tenant or another one) is refused at
start. Error messages name a key by its position in the file (``key #3``), never by its
text, so a start-up log never reveals a key.

Keys are looked up by their SHA-256 digest, so lookup time does not depend on how much
of a guessed key is right, and the key file's contents are not kept in memory.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prefixcache.http.errors import PERMISSION, APIError


@dataclass(frozen=True)
class Principal:
    """Who sent a request: its ``tenant`` (``None`` when single-tenant) and whether it
    may call admin endpoints."""

    tenant: str | None
    admin: bool


class KeyFileError(ValueError):
    """The API-key file is missing, not JSON, or malformed (the message says where)."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class Authenticator:
    """Maps ``Authorization`` headers to :class:`Principal`.

    Args:
        keys: ``{key: {"tenant": str, "admin": bool}}``, or ``None`` for single-tenant
            mode (no authentication).
        allow_reset: single-tenant mode only: whether anonymous callers may use admin
            endpoints.
    """

    def __init__(self, keys: Mapping[str, Mapping] | None = None, *, allow_reset: bool = False):
        self.enabled = keys is not None
        self.allow_reset = allow_reset
        self._by_digest: dict[bytes, Principal] = {}
        self.quotas: dict[str, float] = {}  # tenant -> share of the KV pool (key file)
        if keys is not None:
            valid = validate_keys(keys)
            self._by_digest = {_digest(k): Principal(v["tenant"], bool(v.get("admin", False)))
                               for k, v in valid.items()}
            self.quotas = {v["tenant"]: v["quota"] for v in valid.values() if "quota" in v}

    @classmethod
    def from_file(cls, path: str | Path | None, *, allow_reset: bool = False) -> Authenticator:
        if path is None:
            return cls(None, allow_reset=allow_reset)
        return cls(load_key_file(path), allow_reset=allow_reset)

    @property
    def tenants(self) -> list[str]:
        """The configured tenant ids, sorted (empty in single-tenant mode)."""
        return sorted({p.tenant for p in self._by_digest.values() if p.tenant is not None})

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller of a request with this ``Authorization`` header.

        Raises:
            APIError: 401 when keys are configured and the key is missing or unknown.
        """
        if not self.enabled:
            return Principal(None, self.allow_reset)
        if not authorization:
            raise _unauthorized("missing API key: send it as 'Authorization: Bearer <key>'")
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise _unauthorized("the Authorization header must be 'Bearer <key>'")
        principal = self._by_digest.get(_digest(key))
        if principal is None:
            raise _unauthorized("incorrect API key provided")
        return principal

    def require_admin(self, principal: Principal) -> None:
        """Raises APIError 403 unless ``principal`` may call admin endpoints."""
        if not principal.admin:
            hint = ("an admin API key" if self.enabled
                    else "a server started with --allow-reset or an --api-keys file")
            raise APIError(403, f"this endpoint needs {hint}", type=PERMISSION,
                           code="permission_denied")


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})


class _Parsed(dict):
    """A JSON object as parsed, with its ``(name, value)`` pairs in file order (a plain
    dict keeps only the last of two equal names)."""

    pairs: list[tuple[str, object]]


def _keep_pairs(pairs: list[tuple[str, object]]) -> _Parsed:
    d = _Parsed(pairs)
    d.pairs = pairs
    return d


def _check_duplicates(keys: Mapping) -> None:
    """Raises KeyFileError when a parsed key file names a key twice, or an entry names a
    field twice (positions are 1-based, in file order)."""
    pairs = getattr(keys, "pairs", None)
    if pairs is None:
        return
    first: dict[str, tuple[int, object]] = {}
    for pos, (key, entry) in enumerate(pairs, 1):
        if key in first:
            where, prev = first[key]
            tenants = {e.get("tenant") if isinstance(e, Mapping) else None
                       for e in (prev, entry)}
            what = " to another tenant" if len(tenants) > 1 else ""
            raise KeyFileError(f"key #{pos} repeats key #{where}{what}; each key must be "
                               "listed once")
        first[key] = (pos, entry)
        fields = [name for name, _ in getattr(entry, "pairs", [])]
        if len(fields) != len(set(fields)):
            raise KeyFileError(f"key #{pos}: a field is listed twice in its entry")


def validate_keys(keys: Mapping) -> dict[str, dict]:
    """Check the key mapping's shape; returns it normalised. Raises KeyFileError, whose
    message names a key by its 1-based position, never by its text."""
    if not isinstance(keys, Mapping):
        raise KeyFileError("the API-key file must hold a JSON object {key: {tenant, admin}}")
    _check_duplicates(keys)
    out: dict[str, dict] = {}
    quotas: dict[str, float] = {}
    for pos, (key, entry) in enumerate(keys.items(), 1):
        where = f"key #{pos}: "
        if not isinstance(key, str) or not key.strip() or key != key.strip() or " " in key:
            raise KeyFileError(f"{where}keys must be non-empty strings without spaces")
        if not isinstance(entry, Mapping):
            raise KeyFileError(f"{where}value must be an object "
                               '{"tenant": ..., "admin": ...}')
        unknown = set(entry) - {"tenant", "admin", "quota"}
        if unknown:
            raise KeyFileError(f"{where}unknown fields {sorted(unknown)}")
        tenant = entry.get("tenant")
        if not isinstance(tenant, str) or not tenant:
            raise KeyFileError(f"{where}'tenant' must be a non-empty string")
        admin = entry.get("admin", False)
        if not isinstance(admin, bool):
            raise KeyFileError(f"{where}'admin' must be true or false")
        out[key] = {"tenant": tenant, "admin": admin}
        if "quota" in entry:
            out[key]["quota"] = _quota(entry["quota"], where, tenant, quotas)
    if not out:
        raise KeyFileError("the API-key file holds no keys")
    return out


def _quota(value: object, where: str, tenant: str, quotas: dict[str, float]) -> float:
    """A key's ``quota``, checked: a share in ``(0, 1]``, equal for all of a tenant's
    keys. Raises KeyFileError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise KeyFileError(f"{where}'quota' must be a share of the KV pool in (0, 1]")
    if quotas.setdefault(tenant, float(value)) != float(value):
        raise KeyFileError(f"{where}'quota' differs from another key of the same tenant")
    return float(value)


def load_key_file(path: str | Path) -> dict[str, dict]:
    """Read and validate a key file. Raises KeyFileError."""
    try:
        data = json.loads(Path(path).read_text(), object_pairs_hook=_keep_pairs)
    except FileNotFoundError:
        raise KeyFileError(f"API-key file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KeyFileError(f"cannot read API-key file {path}: {exc}") from None
    return validate_keys(data)
