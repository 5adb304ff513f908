"""A ``min_tokens`` the context can never hold is a 400 naming ``min_tokens`` (checked
once, where the request enters the engine); the server keeps serving."""
from __future__ import annotations

import httpx
import pytest


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"model": "tiny", "prompt": "Hello", "max_tokens": None,
                         "min_tokens": 100_000}),
    ("/v1/chat/completions", {"model": "tiny", "min_tokens": 100_000,
                              "messages": [{"role": "user", "content": "hi"}]}),
], ids=["completions", "chat"])
def test_unreachable_min_tokens_is_a_400_naming_it(server, path, body):
    with httpx.Client(base_url=server.base, timeout=60) as c:
        r = c.post(path, json=body)
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["param"] == "min_tokens"
        assert "min_tokens=100000" in err["message"]
        ok = c.post(path, json={**body, "min_tokens": 2, "max_tokens": 3})
        assert ok.status_code == 200, ok.text[:300]
        assert ok.json()["usage"]["completion_tokens"] >= 2
