"""Units of the pin and quota plumbing of the server: ``cache_ttl`` parsing, the key
file's ``quota`` field, and the per-tenant gauges of /metrics."""
from __future__ import annotations

import pytest

from prefixcache.http.auth import Authenticator, KeyFileError
from prefixcache.http.errors import APIError
from prefixcache.server.metrics import ServerMetrics
from prefixcache.server.requests import pin_ttl


@pytest.mark.parametrize("value,seconds", [
    (None, None), (30, 30.0), (2.5, 2.5), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0),
    ("1.5h", 5400.0), (7 * 24 * 3600, 604800.0), (1, 1.0), ("1s", 1.0), ("0.5m", 30.0)])
def test_cache_ttl_values(value, seconds):
    assert pin_ttl(value) == seconds


@pytest.mark.parametrize("value", [0, -1, "0s", "5 m", "5d", "m", "", True,
                                   float("inf"), float("nan"), 7 * 24 * 3600 + 1,
                                   1e-9, 0.5, 0.999, "0.5s", "1e-9s", "0.01m"])
def test_bad_cache_ttl_is_a_400_naming_it(value):
    with pytest.raises(APIError) as e:
        pin_ttl(value)
    assert (e.value.status, e.value.param) == (400, "cache_ttl")
    assert "from 1 s to 604800 s" in e.value.message


def test_key_file_quotas():
    auth = Authenticator({"k1": {"tenant": "a", "quota": 0.25},
                          "k2": {"tenant": "a", "quota": 0.25},
                          "k3": {"tenant": "b"}})
    assert auth.quotas == {"a": 0.25}
    for bad in (0, 1.5, "half", True):
        with pytest.raises(KeyFileError, match="key #1: 'quota'"):
            Authenticator({"k1": {"tenant": "a", "quota": bad}})
    with pytest.raises(KeyFileError, match="key #2: 'quota' differs"):
        Authenticator({"k1": {"tenant": "a", "quota": 0.25},
                       "k2": {"tenant": "a", "quota": 0.5}})


def test_tenant_gauges_only_for_the_key_files_tenants():
    stats = {"pages_total": 8, "tenant_pages": {
        "a": {"pages": 3, "quota_pages": 2}, "b": {"pages": 0, "quota_pages": None},
        "intruder": {"pages": 5, "quota_pages": 4}}}
    text = ServerMetrics(["a", "b"]).render(stats).decode()
    assert 'tenant_kv_pages{tenant="a"} 3.0' in text
    assert 'tenant_kv_pages{tenant="b"} 0.0' in text
    assert 'tenant_kv_quota_pages{tenant="a"} 2.0' in text
    assert 'tenant_kv_quota_pages{tenant="b"}' not in text and "intruder" not in text
    assert "tenant_kv_pages" not in ServerMetrics(None).render(stats).decode()
