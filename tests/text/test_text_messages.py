"""``text/messages.py``: the chat message rules shared by the server and ``LLM.chat``."""
from __future__ import annotations

import typing

import pytest

from prefixcache.server.protocol import ChatMessage
from prefixcache.text.messages import MESSAGE_ROLES, MessageError, check_messages


def test_the_server_accepts_exactly_the_shared_roles():
    role = ChatMessage.model_fields["role"].annotation
    assert typing.get_args(role) == MESSAGE_ROLES


@pytest.mark.parametrize("messages, param", [
    (None, "messages"), ([], "messages"), ("hi", "messages"), ([5], "messages[0]"),
    ([{"role": "wizard"}], "messages[0].role"), ([{"content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": {"text": "x"}}], "messages[0].content"),
    ([{"role": "user", "content": ["x"]}], "messages[0].content[0]"),
    ([{"role": "user", "content": [{"type": "text", "text": 1}]}], "messages[0].content[0]"),
    ([{"role": "user"}, {"role": "tool", "tool_call_id": 1}], "messages[1].tool_call_id"),
    ([{"role": "assistant", "tool_calls": {"id": "x"}}], "messages[0].tool_calls"),
])
def test_the_first_bad_field_is_named(messages, param):
    with pytest.raises(MessageError) as e:
        check_messages(messages)
    assert e.value.param == param and isinstance(e.value, ValueError)


def test_valid_messages_pass():
    check_messages([{"role": r, "content": "x"} for r in MESSAGE_ROLES]
                   + [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
                      {"role": "user", "content": [{"type": "text", "text": "y"}]}])
