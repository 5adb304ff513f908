"""What the replicas serve and how they key their pages, learned from them.

Each replica answers ``GET /v1/cache/info`` (``server/cache_info.py``): served model names,
model (the ``--model`` it loaded), model fingerprint, block size, KV dtype and the digest
of its page-hash root seed (the seed itself to an admin key). The router reads it from
every replica at start instead of being told by flags, because it must compute exactly
the replicas' page hashes and accept exactly their model names:

- the replicas that answer must agree with each other on every field of
  :data:`CHECKED` (else the router refuses to start, naming the field and the replicas);
- a flag given to the router must agree with them (else the same, naming the flag);
- a replica that does not answer within the start-up budget is left out until it does
  and agrees (:func:`mismatch`, checked with its health).

The router authenticates to the replicas with a key of the key file they share (an admin
key when there is one, so it can read the seed; see :func:`info_key`).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx

from prefixcache.http.auth import load_key_file
from prefixcache.server.cache_info import PATH

log = logging.getLogger(__name__)

CHECKED = ("served_model_names", "model", "block_size", "kv_dtype", "model_fingerprint",
           "hash_root_seed_digest")


@dataclass(frozen=True)
class ReplicaInfo:
    """One replica's ``GET /v1/cache/info`` answer (``hash_root_seed``: admin only)."""

    served_model_names: tuple[str, ...]
    model: str
    block_size: int
    kv_dtype: str
    model_fingerprint: str
    hash_root_seed_digest: str
    hash_root_seed: str | None = None

    @classmethod
    def from_json(cls, url: str, obj: object) -> ReplicaInfo:
        """Raises ValueError naming the replica and the field that is missing or wrong."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"replica {url}: {PATH} did not answer a JSON object")
        names = obj.get("served_model_names")
        if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
            raise ValueError(f"replica {url}: {PATH}: served_model_names is not a list of "
                             "names")
        block_size = obj.get("block_size")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"replica {url}: {PATH}: block_size is not a positive integer")
        strings = {}
        for name in ("model", "kv_dtype", "model_fingerprint", "hash_root_seed_digest"):
            value = obj.get(name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"replica {url}: {PATH}: {name} is missing or not a string")
            strings[name] = value
        seed = obj.get("hash_root_seed")
        return cls(tuple(names), block_size=block_size, hash_root_seed=seed
                   if isinstance(seed, str) else None, **strings)

    def field(self, name: str) -> object:
        value = getattr(self, name)
        return list(value) if isinstance(value, tuple) else value


def mismatch(want: ReplicaInfo, got: ReplicaInfo) -> str | None:
    """The first field of :data:`CHECKED` where ``got`` differs from ``want`` (``None``:
    they agree)."""
    for name in CHECKED:
        if want.field(name) != got.field(name):
            return name
    return None


def agreed(infos: Mapping[str, ReplicaInfo]) -> ReplicaInfo:
    """The replicas' common info (one with the seed when an answer carries it).

    Raises:
        ValueError: two replicas differ; the message names the field and both replicas.
    """
    (first_url, first), *rest = infos.items()
    for url, info in rest:
        name = mismatch(first, info)
        if name is not None:
            raise ValueError(f"replicas disagree on {name}: {first_url} has "
                             f"{first.field(name)!r}, {url} has {info.field(name)!r}; "
                             "every replica must serve the same model the same way")
    return next((i for i in infos.values() if i.hash_root_seed is not None), first)


def info_key(api_keys: str | None) -> str | None:
    """The key the router sends to the replicas' ``/v1/cache/info``: the first admin key
    of the shared key file (it may read the seed), else its first key; ``None`` without a
    key file. Raises KeyFileError as the key file does."""
    if api_keys is None:
        return None
    keys = load_key_file(api_keys)
    return next((k for k, v in keys.items() if v["admin"]), next(iter(keys)))


def headers_for(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def fetch(client: httpx.Client, url: str, key: str | None, timeout_s: float
          ) -> ReplicaInfo | None:
    """One replica's info; ``None`` when it cannot be reached or is not up yet (connection
    error, 5xx).

    Raises:
        ValueError: it answered, but not with an info object (an old server: 404; a key
            it refused: 401/403), naming the replica.
    """
    try:
        resp = client.get(url + PATH, headers=headers_for(key), timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if resp.status_code >= 500:
        return None
    if resp.status_code != 200:
        raise ValueError(f"replica {url}: GET {PATH} answered {resp.status_code}: "
                         f"{resp.text[:200]}")
    try:
        obj = resp.json()
    except ValueError:
        raise ValueError(f"replica {url}: GET {PATH} did not answer JSON") from None
    return ReplicaInfo.from_json(url, obj)


def fetch_all(urls: Sequence[str], key: str | None, wait_s: float,
              poll_s: float = 0.5) -> dict[int, ReplicaInfo]:
    """Every replica's info, by replica number, asking again until all answered or
    ``wait_s`` seconds passed (the ones that never answered are absent).

    Raises:
        ValueError: none answered in time, or one answered wrongly (:func:`fetch`).
    """
    deadline = time.monotonic() + wait_s
    got: dict[int, ReplicaInfo] = {}
    with httpx.Client() as client:
        while True:
            for i, url in enumerate(urls):
                if i not in got:
                    info = fetch(client, url, key, timeout_s=max(5.0, min(30.0, wait_s)))
                    if info is not None:
                        got[i] = info
            if len(got) == len(urls) or time.monotonic() >= deadline:
                break
            time.sleep(poll_s)
    if not got:
        raise ValueError(f"no replica answered GET {PATH} within {wait_s:g} s "
                         f"(--startup-timeout-s): {', '.join(urls)}")
    for i, url in enumerate(urls):
        if i not in got:
            log.warning("replica %s did not answer GET %s within %g s; it takes no "
                        "request until it does and agrees with the others", url, PATH, wait_s)
    return got
