"""Chat templates render exactly as transformers' ``apply_chat_template`` renders them:
the builtin ChatML template, the builtin model's template and a real Qwen2 template."""
from __future__ import annotations

import pytest

from prefixcache.model.builtin import CHAT_TEMPLATE, tiny_tokenizer
from prefixcache.text.chat_template import (
    CHATML_GENERATION_PROMPT,
    CHATML_TEMPLATE,
    ChatTemplateError,
    render_chat_template,
)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}}}}]
CALL = {"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Zürich? 東京も"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "12°C", "tool_call_id": "c1"},
        {"role": "assistant", "content": "12°C and sunny."},
        {"role": "user", "content": "Thanks", "name": "ann"}]


@pytest.fixture(scope="module")
def hf_gpt2(shared_data_path):
    """A transformers tokenizer to render templates with (the tokens do not matter)."""
    from transformers import PreTrainedTokenizerFast

    file = shared_data_path("tokenizers") / "gpt2" / "tokenizer.json"
    return PreTrainedTokenizerFast(tokenizer_file=str(file), bos_token="<bos>",
                                   eos_token="<eos>")


def _hf_render(tok, template, messages, tools, gen):
    return tok.apply_chat_template(messages, tools=tools, chat_template=template,
                                   tokenize=False, add_generation_prompt=gen)


@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("gen", [True, False])
def test_chatml_template_renders_like_transformers(hf_gpt2, tools, gen):
    ours = render_chat_template(CHATML_TEMPLATE, CHAT, tools, add_generation_prompt=gen)
    assert ours == _hf_render(hf_gpt2, CHATML_TEMPLATE, CHAT, tools, gen)
    assert ours.endswith(CHATML_GENERATION_PROMPT if gen else "Thanks<|im_end|>\n")


def test_chatml_template_exact_text_and_composition():
    text = render_chat_template(CHATML_TEMPLATE, CHAT[1:4], TOOLS)
    assert text == (
        '<|im_start|>tools\n{"type": "function", "function": {"name": "get_weather", '
        '"description": "Weather", "parameters": {"type": "object", "properties": '
        '{"city": {"type": "string"}}}}}<|im_end|>\n'
        "<|im_start|>user\nWeather in Zürich? 東京も<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Zürich"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n12°C<|im_end|>\n<|im_start|>assistant\n")
    # tools alone + each message alone + the generation prompt = the whole
    parts = [render_chat_template(CHATML_TEMPLATE, [], TOOLS, add_generation_prompt=False)]
    parts += [render_chat_template(CHATML_TEMPLATE, [m], add_generation_prompt=False)
              for m in CHAT[1:4]]
    assert "".join(parts) + CHATML_GENERATION_PROMPT == text
    assert CHAT[2]["content"] == "" and "name" not in CHAT[1]  # the caller's dicts unchanged


def test_builtin_model_template_renders_like_transformers(hf_gpt2):
    byte = tiny_tokenizer()
    msgs = [m for m in CHAT if m["role"] != "tool"]
    for tools in (None, TOOLS):
        assert byte.render_chat(msgs, tools) == \
            _hf_render(hf_gpt2, CHAT_TEMPLATE, msgs, tools, True)  # bos_token is "<bos>"


def test_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="boom"):
        render_chat_template("{{ raise_exception('boom') }}", [])
    with pytest.raises(ValueError, match="chat template"):
        render_chat_template("{% for %}", [])
