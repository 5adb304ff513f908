import json

import pytest

from helpers.data import shared_data
from prefixcache.analyze.logs import LogFormatError, detect_format, load_log, load_logs
from prefixcache.analyze.logs.messages import parse_timestamp, parse_tool_calls

CHAT = {"model": "m", "messages": [{"role": "system", "content": "S"},
                                  {"role": "user", "content": "hi"}]}


def test_bare_body_and_wrapped_record(write_jsonl):
    path = write_jsonl([
        CHAT,
        {"request": CHAT, "tenant": "acme", "timestamp": "2025-01-01T00:00:10Z",
         "request_id": "r2", "response": {
             "choices": [{"message": {"role": "assistant", "content": "yo",
                                      "tool_calls": [{"id": "c1", "type": "function",
                                                      "function": {"name": "f",
                                                                   "arguments": "{}"}}]}}],
             "usage": {"prompt_tokens": 9, "completion_tokens": 1}}},
    ])
    a, b = load_log(path)
    assert a.request_id == f"{path.stem}:1" and a.tenant is None and a.response is None
    assert a.messages == CHAT["messages"] and a.turn == 0
    assert b.request_id == "r2" and b.tenant == "acme"
    assert b.timestamp == 1735689610.0
    assert b.response == {"role": "assistant", "content": "yo", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert b.usage.prompt_tokens == 9 and b.usage.provider == "openai"


def test_completions_prompts(write_jsonl):
    path = write_jsonl([
        {"prompt": "hello", "request_id": "a", "response": {"choices": [{"text": " world"}]}},
        {"prompt": [1, 2, 3], "request_id": "b"},
        {"prompt": ["x", [4, 5]], "request_id": "c", "usage": {"prompt_tokens": 3}},
    ])
    reqs = load_log(path)
    assert [r.request_id for r in reqs] == ["a", "b", "c-0", "c-1"]
    assert reqs[0].prompt == "hello" and reqs[0].response == " world"
    assert reqs[1].prompt == [1, 2, 3]
    assert reqs[2].prompt == "x" and reqs[3].prompt == [4, 5]
    assert reqs[2].usage is None  # a batch's usage covers all its prompts


def test_anthropic_response_and_metadata_tenant(write_jsonl):
    path = write_jsonl([{"body": {**CHAT, "metadata": {"tenant": "t9"}}, "response": {
        "content": [{"type": "text", "text": "ok"},
                    {"type": "tool_use", "id": "t", "name": "g", "input": {"a": 1}}],
        "usage": {"input_tokens": 3, "cache_read_input_tokens": 2000, "output_tokens": 4}}}])
    (r,) = load_log(path)
    assert r.tenant == "t9"
    assert r.response["content"] == "ok"
    assert r.response["tool_calls"][0]["function"] == {"name": "g", "arguments": '{"a": 1}'}
    assert r.usage.prompt_tokens == 2003 and r.usage.cached_tokens == 2000


def test_bad_line_names_its_number(write_jsonl):
    path = write_jsonl([CHAT, {"nothing": 1}])
    with pytest.raises(LogFormatError, match=r":2: no 'messages'"):
        load_log(path)
    path = write_jsonl([CHAT, CHAT, {"messages": "hello"}], "str.jsonl")
    with pytest.raises(LogFormatError, match=r":3: 'messages' must be a list"):
        load_log(path)


def test_duplicate_ids_and_timestamp_order(write_jsonl, tmp_path):
    p1 = write_jsonl([{**CHAT, "request_id": "x", "timestamp": 20}], "a.jsonl")
    p2 = write_jsonl([{**CHAT, "request_id": "y", "timestamp": 10}], "b.jsonl")
    assert [r.request_id for r in load_logs([p1, p2])] == ["y", "x"]
    with pytest.raises(LogFormatError, match="duplicate"):
        load_logs([p1, p1])


def test_timestamps_and_tool_call_strings():
    assert parse_timestamp(1700000000123) == 1700000000.123
    assert parse_timestamp("1700000000") == 1700000000.0
    assert parse_timestamp("nope") is None
    calls = parse_tool_calls("[{'function': {'arguments': '{\"c\":1}', 'name': 'bash'}, "
                             "'id': 'x', 'type': 'function'}]")
    assert calls == [{"id": "x", "type": "function",
                      "function": {"name": "bash", "arguments": '{"c":1}'}}]


def test_detect_format(tmp_path):
    f = tmp_path / "x.json"
    assert detect_format(f, [{"role": "user", "content": "a"}]) == "mini-swe-agent"
    assert detect_format(f, {"trajectory": [], "history": []}) == "swe-agent"
    assert detect_format(f, {"messages": [], "info": {}}) == "mini-swe-agent"
    assert detect_format(f, CHAT) == "openai-jsonl"
    with pytest.raises(LogFormatError):
        detect_format(f, {"what": 1})


def test_json_file_of_request_bodies(tmp_path):
    f = tmp_path / "reqs.json"
    f.write_text(json.dumps([CHAT, CHAT]))
    assert len(load_log(f)) == 2


def test_deepseek_trajectory():
    path = shared_data("agent_trajectories") / "mini-swe-agent/deepseek_pr816/" \
        "django__django-14752.traj.json"
    reqs = load_log(path)
    assert len(reqs) == 31
    first = reqs[0]
    assert first.request_id == "django__django-14752#0"
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert first.usage.provider == "deepseek"
    assert (first.usage.prompt_tokens, first.usage.cached_tokens) == (1995, 320)
    assert first.tools[0]["function"]["name"] == "bash"
    assert first.extra["recorded_cost"] == pytest.approx(0.00051702)
    # call k's prompt is call k-1's prompt + its answer + the tool output
    assert reqs[1].messages[:2] == first.messages
    assert reqs[1].messages[2]["tool_calls"] == first.response["tool_calls"]
    assert [m["role"] for m in reqs[1].messages] == ["system", "user", "assistant", "tool"]
    assert all(r.turn == k for k, r in enumerate(reqs))


def test_mini_swe_agent_message_list():
    reqs = load_log(shared_data("agent_trajectories") / "mini-swe-agent/tests/"
                    "github_issue.traj.json")
    assert len(reqs) == 10 and reqs[0].tools is None and reqs[0].usage is None
    assert len(reqs[-1].messages) == 20  # 22 messages: the last assistant is 21st


def test_swe_agent_step_messages_and_history():
    root = shared_data("agent_trajectories") / "swe-agent"
    demo = load_log(root / "demo_marshmallow-1867_function_calling_replace_from_source.traj")
    assert len(demo) == 13
    # step messages are what was sent: old observations are elided in later steps
    assert [len(r.messages) for r in demo] == list(range(2, 27, 2))
    assert demo[0].response["tool_calls"][0]["function"]["name"] == "bash"
    py = load_log(root / "gpt4_pydicom__pydicom-1458.traj")
    assert len(py) == 12
    assert [m["role"] for m in py[0].messages] == ["system", "user", "user"]


def test_oasst1_trees_one_call_per_assistant_message():
    path = shared_data("oasst1_trees") / "en_100_tree.jsonl"
    reqs = load_log(path)
    assert len(reqs) == 687  # the trees' assistant messages
    first = [r for r in reqs if r.conversation == reqs[0].conversation]
    # sibling replies to the root prompt are calls with the same one-message prompt
    roots = [r for r in first if len(r.messages) == 1]
    assert len(roots) >= 2 and all(r.messages == roots[0].messages for r in roots)
    assert all(r.turn == sum(m["role"] == "assistant" for m in r.messages) for r in reqs)


def test_sharegpt_tool_calls_and_tools():
    path = shared_data("glaive_toolcall") / "glaive_toolcall_en_demo.json"
    reqs = load_log(path)
    assert len(reqs) == 746 + 211  # gpt and function_call turns
    r = reqs[1]  # human, gpt, human, function_call: the second call
    assert r.response["tool_calls"][0]["function"] == {
        "name": "search_recipes",
        "arguments": '{"ingredients": ["chicken", "bell peppers", "rice"]}'}
    assert r.tools[0]["function"]["name"] == "search_recipes"
    assert [m["role"] for m in reqs[2].messages][-2:] == ["assistant", "tool"]
    assert reqs[2].messages[-2] == r.response
