"""The ``model`` rule: a server serves exactly one model (under one or more names), so an
OpenAI request without ``model`` means that model and its answer names it (the first
served name); a name not served is 404 ``model_not_found`` naming ``model``; a ``model``
that is not a string is 400 naming it. Anthropic's Messages API requires ``model``."""
from __future__ import annotations

import httpx
import pytest

from tests.helpers.wait import DEADLINE_S

PROMPT = {"prompt": "the model rule", "max_tokens": 1, "temperature": 0}
CHAT = {"messages": [{"role": "user", "content": "the model rule"}], "max_tokens": 1,
        "temperature": 0}


@pytest.mark.parametrize("path,body", [("/completions", PROMPT),
                                       ("/chat/completions", CHAT)])
def test_an_absent_model_is_the_one_served_and_the_answer_names_it(server, path, body):
    r = httpx.post(server.v1 + path, json=body, timeout=DEADLINE_S)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tiny"  # the first --served-model-name
    r = httpx.post(server.v1 + path, json={**body, "model": "builtin:tiny"}, timeout=DEADLINE_S)
    assert r.status_code == 200 and r.json()["model"] == "builtin:tiny"


@pytest.mark.parametrize("path,body", [("/completions", PROMPT),
                                       ("/chat/completions", CHAT)])
def test_a_model_not_served_is_404_and_a_bad_type_400_naming_model(server, path, body):
    r = httpx.post(server.v1 + path, json={**body, "model": "gpt-4o"}, timeout=DEADLINE_S)
    assert r.status_code == 404
    err = r.json()["error"]
    assert (err["param"], err["code"]) == ("model", "model_not_found")
    assert err["message"] == "The model `gpt-4o` does not exist. Served: tiny, builtin:tiny"
    r = httpx.post(server.v1 + path, json={**body, "model": 7}, timeout=DEADLINE_S)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_messages_require_model_as_anthropic_does(server):
    r = httpx.post(server.v1 + "/messages", timeout=DEADLINE_S, json={
        "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "model is required and must be a non-empty string"}}
