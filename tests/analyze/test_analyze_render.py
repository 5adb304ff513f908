import json

import pytest

from helpers.data import shared_data
from prefixcache.analyze.encode import encode_requests
from prefixcache.analyze.records import Request
from prefixcache.analyze.render import builtin_response, builtin_segments
from prefixcache.text.loading import load_tokenizer

TOOL = {"type": "function", "function": {"name": "bash", "parameters": {}}}
CALL = {"id": "c", "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
MSGS = [{"role": "system", "content": "S"}, {"role": "user", "content": "U", "name": "ann"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "out", "tool_call_id": "c"}]


def test_builtin_segments_exact():
    segs = builtin_segments(MSGS, [TOOL])
    assert segs == [
        '<|im_start|>tools\n{"type": "function", "function": {"name": "bash", '
        '"parameters": {}}}<|im_end|>\n',
        "<|im_start|>system\nS<|im_end|>\n",
        "<|im_start|>user:ann\nU<|im_end|>\n",
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": '
        '{"command": "ls"}}\n</tool_call><|im_end|>\n',
        "<|im_start|>tool\nout<|im_end|>\n",
        "<|im_start|>assistant\n",
    ]
    # a response is what the next prompt repeats after the generation prompt
    resp = {"role": "assistant", "content": "thinking", "tool_calls": [CALL]}
    assert "<|im_start|>assistant\n" + builtin_response(resp) == \
        builtin_segments(MSGS + [resp], None)[-2]


def test_bytes_tokens_boundaries_and_response():
    tok = load_tokenizer("bytes")
    r = Request("r", messages=MSGS[:2], response={"role": "assistant", "content": "ok"})
    (tr,), info = encode_requests([r], tok)
    assert info.renderer == "builtin-chatml" and info.segment_cache
    text = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user:ann\nU<|im_end|>\n" \
           "<|im_start|>assistant\n"
    assert tr.prompt_text == text
    assert tr.prompt_ids == tok.encode(text)
    # markers are one token each: the system segment is 1 + 8 + 1 + 1 tokens, the user
    # segment 1 + len("user:ann\nU") + 1 + 1
    assert tr.boundaries == [11, 11 + 13] and tr.boundary_roles == ["system", "user"]
    assert tr.char_ends == [len("<|im_start|>system\nS<|im_end|>\n"), len(text) - 22]
    assert tok.decode(tr.response_ids, skip_special_tokens=False) == "ok<|im_end|>\n"
    (no_resp,), _ = encode_requests([r], tok, responses=False)
    assert no_resp.response_ids == []


def test_token_id_prompts_are_used_as_given():
    tok = load_tokenizer("approx")
    (tr,), info = encode_requests([Request("r", prompt=[5, 6, 7])], tok)
    assert tr.prompt_ids == [5, 6, 7] and tr.prompt_text is None and info.renderer == "none"


@pytest.fixture
def gpt2_dir_with_template(tmp_path):
    """A tokenizer folder: the shared GPT-2 tokenizer.json and a chat template that
    renders every role."""
    src = shared_data("tokenizers") / "gpt2" / "tokenizer.json"
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.json").symlink_to(src)
    tpl = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
           "{% for tc in m.get('tool_calls') or [] %}<call {{ tc['function']['name'] }}>"
           "{% endfor %}{{ '\\n' }}{% endfor %}"
           "{% if add_generation_prompt %}[assistant]{% endif %}")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": tpl}))
    return d


def test_tokenizer_template_used_when_it_covers_everything(gpt2_dir_with_template):
    tok = load_tokenizer(str(gpt2_dir_with_template))
    r = Request("r", messages=MSGS, response={"role": "assistant", "content": "fine"})
    (tr,), info = encode_requests([r], tok)
    assert info.renderer == "tokenizer-template" and info.note is None
    assert tr.prompt_text == "[system]S\n[user]U\n[assistant]<call bash>\n[tool]out\n[assistant]"
    assert tr.prompt_ids == tok.encode(tr.prompt_text)
    assert tok.decode(tr.response_ids) == "fine\n"  # what the template appends
    assert tr.char_ends == [9, 17, 39, 50]  # past each content (or tool call name)


def test_qwen2_template_renders_tool_turns_with_argument_objects():
    """Qwen2's template writes ``arguments | tojson``: given objects (as vLLM hands them),
    it renders the call and the tool result, so the tokenizer's template is used."""
    tok = load_tokenizer(str(shared_data("tokenizers") / "qwen2"))
    (tr,), info = encode_requests([Request("r", messages=MSGS)], tok)
    assert info.renderer == "tokenizer-template" and info.note is None
    assert tr.prompt_text.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": '
        '"ls"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nout\n'
        "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_template_that_drops_tool_messages_falls_back(tmp_path):
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.json").symlink_to(shared_data("tokenizers") / "gpt2" / "tokenizer.json")
    tpl = ("{% for m in messages %}{% if m['role'] != 'tool' %}[{{ m['role'] }}]"
           "{{ m['content'] }}{% for tc in m.get('tool_calls') or [] %}"
           "<call {{ tc['function']['name'] }}>{% endfor %}{{ '\\n' }}{% endif %}"
           "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": tpl}))
    (tr,), info = encode_requests([Request("r", messages=MSGS)], load_tokenizer(str(d)))
    assert info.renderer == "builtin-chatml"
    assert "drops content" in info.note
    assert tr.prompt_text.endswith("<|im_start|>tool\nout<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="has no chat template"):
        encode_requests([Request("r", messages=MSGS)], load_tokenizer("bytes"),
                        template="tokenizer")
