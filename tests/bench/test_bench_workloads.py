"""Workload builders on small handmade inputs (exact values), then on the shared data."""
from __future__ import annotations

import json

import pytest

from helpers.data import shared_data
from prefixcache.bench import datasets
from prefixcache.bench import workloads as wl

U1, A1, U2, A2, U3 = ({"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "hello"},
                      {"role": "user", "content": "how are you?"},
                      {"role": "assistant", "content": "fine"},
                      {"role": "user", "content": "bye"})


def test_conversation_replays_each_assistant_turn_with_recorded_history():
    reqs = wl.conversation_requests("c", [U1, A1, U2, A2, U3], max_tokens=8)
    assert [r.id for r in reqs] == ["c#0", "c#1"]
    assert reqs[0].messages == [U1]
    assert reqs[1].messages == [U1, A1, U2]
    assert [r.turn for r in reqs] == [0, 1]
    assert [r.warm_expected for r in reqs] == [False, True]
    assert all(r.session == "c" and r.max_tokens == 8 for r in reqs)


def test_conversation_with_system_and_limits():
    sys_msg = {"role": "system", "content": "be brief"}
    reqs = wl.conversation_requests("c", [U1, A1, U2, A2], system="be brief", max_tokens=4)
    assert reqs[1].messages == [sys_msg, U1, A1, U2]
    # measure = number of messages: the session stops before the first prompt above 2
    reqs = wl.conversation_requests("c", [U1, A1, U2, A2], max_tokens=4,
                                    measure=lambda r: len(r.messages), max_prompt_tokens=2)
    assert [r.messages for r in reqs] == [[U1]]
    assert len(wl.conversation_requests("c", [U1, A1, U2, A2], max_tokens=4, max_calls=1)) == 1


def test_agent_trajectory_grows_by_two_messages_per_call(tmp_path):
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for k in range(3):
        msgs.append({"role": "assistant", "content": f"step {k}",
                     "tool_calls": [{"id": f"t{k}", "type": "function",
                                     "function": {"name": "bash",
                                                  "arguments": "{\"command\": \"ls\"}"}}],
                     "extra": {"response": {"usage": {
                         "prompt_tokens": 100 * (k + 1),
                         "prompt_tokens_details": {"cached_tokens": 64 * k}}}}})
        msgs.append({"role": "tool", "tool_call_id": f"t{k}", "content": f"out {k}"})
    path = tmp_path / "x.traj.json"
    path.write_text(json.dumps({"messages": msgs}))
    traj = datasets.load_trajectory(path, "mini-swe-agent/deepseek")
    assert traj.name == "x" and traj.recorded == {2: {"prompt_tokens": 100, "cached_tokens": 0},
                                                  4: {"prompt_tokens": 200, "cached_tokens": 64},
                                                  6: {"prompt_tokens": 300, "cached_tokens": 128}}
    reqs = wl.conversation_requests("a", traj.messages, max_tokens=4, references=traj.recorded)
    assert [len(r.messages) for r in reqs] == [2, 4, 6]
    assert reqs[2].messages[3] == {"role": "tool", "content": "out 0", "tool_call_id": "t0"}
    assert reqs[1].messages[2]["tool_calls"][0]["function"] == {
        "name": "bash", "arguments": "{\"command\": \"ls\"}"}
    assert "extra" not in reqs[1].messages[2]
    assert [r.reference["cached_tokens"] for r in reqs] == [0, 64, 128]
    assert wl.reference_hit_rate(reqs) == pytest.approx(192 / 600)


def test_swe_agent_string_tool_calls_are_parsed(tmp_path):
    hist = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
            {"role": "assistant", "content": "look",
             "tool_calls": "[{'function': {'arguments': '{\"f\":1}', "
                           "'name': 'find_file'}, 'id': 'c1', 'type': 'function'}]"},
            {"role": "tool", "content": "found", "tool_call_ids": "['c1']"},
            {"role": "assistant", "content": "done"}, {"role": "tool", "content": "orphan"}]
    path = tmp_path / "y.traj"
    path.write_text(json.dumps({"history": hist, "trajectory": []}))
    traj = datasets.load_trajectory(path, "swe-agent")
    assert traj.messages[2]["tool_calls"] == [
        {"id": "c1", "type": "function",
         "function": {"name": "find_file", "arguments": "{\"f\":1}"}}]
    assert traj.messages[3] == {"role": "tool", "content": "found", "tool_call_id": "c1"}
    assert traj.messages[5] == {"role": "user", "content": "orphan"}  # answers no tool call
    assert traj.recorded == {}


def test_glaive_maps_function_calls_and_observations():
    item = {"conversations": [{"from": "human", "value": "area?"},
                              {"from": "function_call",
                               "value": "{\"name\": \"calc\", \"arguments\": {\"r\": 2}}"},
                              {"from": "observation", "value": "{\"area\": 12.6}"},
                              {"from": "gpt", "value": "12.6"}],
            "tools": "[{\"name\": \"calc\", \"parameters\": {}}]"}
    conv = datasets.glaive_to_openai(item)
    assert conv.tools == [{"type": "function", "function": {"name": "calc", "parameters": {}}}]
    assert conv.messages == [
        {"role": "user", "content": "area?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "calc", "arguments": "{\"r\": 2}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"area\": 12.6}"},
        {"role": "assistant", "content": "12.6"}]
    reqs = wl.conversation_requests("g", conv.messages, tools=conv.tools, max_tokens=4)
    # the call, then the answer after the observation
    assert [len(r.messages) for r in reqs] == [1, 3]
    assert reqs[0].tools == conv.tools


def test_oasst_best_path_follows_rank_zero():
    tree = {"role": "prompter", "text": "q", "replies": [
        {"role": "assistant", "text": "worse", "rank": 1, "replies": []},
        {"role": "assistant", "text": "best", "rank": 0, "replies": [
            {"role": "prompter", "text": "q2", "replies": []}]}]}
    assert datasets.oasst_best_path(tree) == [{"role": "user", "content": "q"},
                                              {"role": "assistant", "content": "best"},
                                              {"role": "user", "content": "q2"}]


SYSTEMS = [("p1", "system one"), ("p2", "system two"), ("p3", "system three")]
QUESTIONS = ["a?", "b?", "c?", "d?", "e?"]


def test_shared_prefix_counts_and_labels():
    reqs = wl.shared_prefix_requests(SYSTEMS, QUESTIONS, 4, seed=0, max_tokens=8)
    assert len(reqs) == 12 and len({r.id for r in reqs}) == 12
    assert sum(r.warm_expected is False for r in reqs) == 3  # first of each system prompt
    by_id = {r.id: r for r in reqs}
    # question j of prefix i is QUESTIONS[(4 * i + j) % 5]
    assert by_id["p2/1"].messages == [{"role": "system", "content": "system two"},
                                      {"role": "user", "content": "a?"}]
    assert by_id["p3/3"].messages[1]["content"] == "b?"
    firsts = {}
    for r in reqs:
        firsts.setdefault(r.group, r)
    assert all(f.warm_expected is False for f in firsts.values())
    # same seed, same order
    again = wl.shared_prefix_requests(SYSTEMS, QUESTIONS, 4, seed=0, max_tokens=8)
    assert [r.id for r in reqs] == [r.id for r in again]


def test_multi_tenant_every_tenant_sends_the_same_prompts():
    reqs = wl.multi_tenant_requests(SYSTEMS[:2], QUESTIONS, 3, 4, seed=0, max_tokens=8)
    assert len(reqs) == 4 * 2 * 3
    assert [r.tenant for r in reqs[:4]] == ["tenant0", "tenant1", "tenant2", "tenant3"]
    assert sum(r.warm_expected is False for r in reqs) == 4 * 2
    prompts = {t: sorted(json.dumps(r.messages) for r in reqs if r.tenant == t)
               for t in {r.tenant for r in reqs}}
    assert len({tuple(v) for v in prompts.values()}) == 1


def test_cold_burst_is_identical_and_cold():
    reqs = wl.cold_burst_requests(SYSTEMS[0], "q?", 5, max_tokens=8)
    assert len(reqs) == 5 and len({r.session for r in reqs}) == 5
    assert all(r.messages == reqs[0].messages for r in reqs)
    assert all(r.warm_expected is False for r in reqs)


def test_few_shot_prompt_shape():
    reqs = wl.few_shot_requests("Q: 1+1?\nA: 2.\n\n", ["2+2?", "3+3?"], max_tokens=8)
    assert [r.prompt for r in reqs] == ["Q: 1+1?\nA: 2.\n\nQ: 2+2?\nA:",
                                        "Q: 1+1?\nA: 2.\n\nQ: 3+3?\nA:"]
    assert [r.warm_expected for r in reqs] == [False, True] and reqs[0].messages is None


def test_interleave_sessions_round_robin_by_turn():
    a = wl.conversation_requests("a", [U1, A1, U2, A2, U3, A2], max_tokens=1)
    b = wl.conversation_requests("b", [U1, A1], max_tokens=1)
    assert [r.id for r in wl.interleave_sessions([a, b])] == ["a#0", "b#0", "a#1", "a#2"]


def test_pick_system_prompts_skips_variants_and_fills_from_outside():
    pats = {"a": "x" * 50, "a_simple": "x" * 40 + "y" * 10, "b": "z" * 55, "c": "w" * 500}
    assert [k for k, _ in wl.pick_system_prompts(pats, 2, 40, 60)] == ["a", "b"]
    assert [k for k, _ in wl.pick_system_prompts(pats, 3, 40, 60)] == ["a", "b", "c"]


# --------------------------------------------------------------------------- replay
def test_parse_replay_both_forms(tmp_path):
    lines = [
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
         "tenant": "t1", "timestamp": 100.5, "session": "s"},
        {"body": {"prompt": "once upon", "max_completion_tokens": 7}, "tenant": "t2",
         "timestamp": 100.0},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                      {"role": "user", "content": "more"}], "session": "s", "timestamp": 103.0},
        {"prompt": [1, 2, 3]},
    ]
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    reqs = wl.parse_replay(path, default_max_tokens=9)
    assert [r.id for r in reqs] == ["line1", "line2", "line3", "line4"]
    assert [r.session for r in reqs] == ["s", "line2", "s", "line4"]
    assert [r.turn for r in reqs] == [0, 0, 1, 0]
    assert [r.tenant for r in reqs] == ["t1", "t2", None, None]
    assert [r.max_tokens for r in reqs] == [5, 7, 9, 9]
    assert [r.arrival_s for r in reqs] == [0.5, 0.0, 3.0, None]
    assert reqs[1].prompt == "once upon" and reqs[3].prompt == [1, 2, 3]
    assert reqs[2].messages[2] == {"role": "user", "content": "more"}
    assert [r.warm_expected for r in reqs] == [None, None, True, None]


@pytest.mark.parametrize("line, message", [
    ("not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"prompt": "a", "messages": []}', "exactly one of"),
    ('{"prompt": {"x": 1}}', "string or a list of token ids"),
    ('{"prompt": "a", "timestamp": "noon"}', "number of seconds"),
])
def test_parse_replay_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"bad.jsonl:2: .*{message}"):
        wl.parse_replay(path)


def test_replay_needs_a_file():
    with pytest.raises(ValueError, match="--requests"):
        wl.build_workload("replay", wl.WorkloadConfig())
    with pytest.raises(ValueError, match="unknown workload"):
        wl.build_workload("nope")


# --------------------------------------------------------------------------- shared data
def test_default_sizes_on_the_shared_data():
    shared_data("prompts")
    shared_data("oasst1_trees")
    shared_data("gsm8k")
    shared_data("glaive_toolcall")
    cfg = wl.WorkloadConfig()
    sp = wl.build_workload("shared-prefix", cfg)
    assert len(sp) == 32 and len({r.group for r in sp}) == 4
    assert sorted({r.group for r in sp}) == ["analyze_paper", "analyze_prose_pinker",
                                            "extract_wisdom_agents", "write_hackerone_report"]
    fs = wl.build_workload("few-shot", cfg)
    assert len(fs) == 32 and fs[0].prompt.startswith("Q: There are 15 trees in the grove.")
    assert fs[0].prompt.count("The answer is") == 8 and fs[0].prompt.endswith("\nA:")
    assert len(wl.build_workload("cold-burst", cfg)) == 8
    mt = wl.build_workload("multi-tenant", cfg)
    assert len(mt) == 32 and {r.tenant for r in mt} == {"tenant0", "tenant1", "tenant2", "tenant3"}
    turns = wl.build_workload("multi-turn", cfg)
    assert len({r.session for r in turns}) == 16
    assert all(r.messages[-1]["role"] in ("user", "tool") for r in turns)


def test_deepseek_trajectories_match_their_source_md():
    shared_data("agent_trajectories")
    cfg = wl.WorkloadConfig(max_prompt_tokens=10**9, agent_sources=("mini-swe-agent/deepseek",))
    reqs = wl.build_workload("agent", cfg)
    calls: dict[str, int] = {}
    for r in reqs:
        calls[r.session.rsplit("/", 1)[1]] = calls.get(r.session.rsplit("/", 1)[1], 0) + 1
    assert calls == {"django__django-14752": 31, "pvlib__pvlib-python-1072": 74,
                     "sqlfluff__sqlfluff-2419": 48}
    refs = [r.reference for r in reqs]
    assert sum(x["prompt_tokens"] for x in refs) == 467_091 + 294_301 + 1_337_052
    assert sum(x["cached_tokens"] for x in refs) == 450_176 + 284_672 + 1_281_216
    django = [r for r in reqs if r.session.endswith("django__django-14752")]
    assert [len(r.messages) for r in django[:4]] == [2, 4, 6, 8]


def test_no_reuse_prompts_share_nothing_and_fit_the_token_length():
    words = [f"w{i}" for i in range(40)]
    one_token_per_word = lambda r: len(r.prompt.split())  # noqa: E731 - "<i>:" is a word
    reqs = wl.no_reuse_requests(words, 3, 10, seed=1, max_tokens=5, measure=one_token_per_word)
    assert [r.id for r in reqs] == ["no-reuse/0", "no-reuse/1", "no-reuse/2"]
    assert [len(r.prompt.split()) for r in reqs] == [10, 10, 10]
    assert [r.prompt.split()[0] for r in reqs] == ["0:", "1:", "2:"]
    assert all(r.max_tokens == 5 and r.warm_expected is False for r in reqs)
    assert len({r.group for r in reqs}) == 3
    # a short word list is repeated to reach the length; the same seed gives the same prompts
    short = wl.no_reuse_requests(["a", "b"], 1, 7, seed=1, max_tokens=1,
                                 measure=one_token_per_word)
    assert len(short[0].prompt.split()) == 7
    assert reqs == wl.no_reuse_requests(words, 3, 10, seed=1, max_tokens=5,
                                        measure=one_token_per_word)
    with pytest.raises(ValueError, match="no-reuse: needs words"):
        wl.no_reuse_requests([], 1, 10, seed=0, max_tokens=1)
