"""Tools prepared for chat templates: the Hermes fallback for a template without tool
syntax (SmolLM2-Instruct's ChatML), and argument objects for templates with their own."""
from __future__ import annotations

import json

from prefixcache.text.chat_template import CHATML_TEMPLATE, render_chat_template
from prefixcache.text.tool_parsers.registry import get_parser
from prefixcache.text.tool_prompt import prepare, tool_instructions

# SmolLM2-135M-Instruct's template: role and content only, a default system prompt
SMOL = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}


def render(template, messages, tools=None, gen=True):
    messages, tools = prepare(template, messages, tools)
    return render_chat_template(template, messages, tools, gen)


def test_fallback_writes_tools_calls_and_results_in_hermes_form():
    convo = [{"role": "user", "content": "Weather in Paris?"}]
    text = render(SMOL, convo, TOOLS)
    assert text == ("<|im_start|>system\n" + tool_instructions(TOOLS) + "<|im_end|>\n"
                    "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    assert '{"type": "function", "function": {"name": "get_weather"' in text
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    turn = convo + [{"role": "assistant", "content": None, "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    after = render(SMOL, turn, TOOLS)
    # the next prompt repeats the previous prompt and the reply, character for character
    assert after.startswith(text + reply + "<|im_end|>\n")
    assert after.endswith("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>"
                          "<|im_end|>\n<|im_start|>assistant\n")
    # and what the model wrote parses back into the call the client sent
    assert get_parser("hermes").extract(reply)[1][0].arguments == '{"city": "Paris"}'


def test_fallback_appends_to_the_system_turn_and_keeps_the_callers_messages():
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    before = json.dumps(convo)
    text = render(SMOL, convo, TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert json.dumps(convo) == before
    # without tools: nothing added; content None renders as empty
    assert render(SMOL, [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": None}], gen=False).endswith(
        "<|im_start|>assistant\n<|im_end|>\n")


def test_templates_with_tool_syntax_get_argument_objects():
    turn = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    text = render(CHATML_TEMPLATE, turn, TOOLS, gen=False)
    # arguments rendered once as an object, not as a quoted JSON string
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            "</tool_call>") in text
    assert turn[1]["tool_calls"][0]["function"]["arguments"] == '{"city":"Paris"}'
