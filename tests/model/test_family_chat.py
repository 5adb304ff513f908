"""The families' chat templates (Qwen3 ChatML, Gemma 3, Phi-3) render through the one
text stack, tools and system prompts included, and their end-of-turn tokens end
generation: a model folder with a tokenizer whose template writes ``<|im_end|>``,
``<end_of_turn>`` or ``<|end|>`` stops on it even without ``generation_config.json``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from helpers.hf_models import make_hf_model, save_hf_model
from prefixcache import LLM, SamplingParams
from prefixcache.text.loading import tokenizer_for_model
from prefixcache.text.tool_prompt import tool_instructions

# trimmed from the families' own templates: same markers and structure
TEMPLATES = {
    "qwen3": (
        "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}"
        "{{- messages[0].content + '\\n\\n' }}{%- endif %}{{- '# Tools\\n<tools>' }}"
        "{%- for t in tools %}{{- '\\n' }}{{- t | tojson }}{%- endfor %}"
        "{{- '\\n</tools><|im_end|>\\n' }}"
        "{%- elif messages[0].role == 'system' %}"
        "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
        "{%- for m in messages %}{%- if m.role != 'system' %}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"),
    "gemma3": (
        "{{ bos_token }}{% if messages[0].role == 'system' %}"
        "{% set first = messages[0].content + '\n\n' %}{% set rest = messages[1:] %}"
        "{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
        "{% for m in rest %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
        "{{ first if loop.first else '' }}{{ m.content }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
    "phi3": (
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}"
        "{% if m.role == 'system' and tools %}<|tool|>{{ tools | tojson }}<|/tool|>{% endif %}"
        "<|end|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"),
}
# the end-of-turn marker is id 0: a model whose logits are all equal picks it greedily
SPECIALS = {"qwen3": ["<|im_end|>", "<|im_start|>", "<|endoftext|>"],
            "gemma3": ["<end_of_turn>", "<start_of_turn>", "<bos>", "<eos>"],
            "phi3": ["<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>",
                     "<|/tool|>", "<|endoftext|>"]}
WORDS = ["hello", "weather", "in", "paris", "you", "are", "kind", "system", "user",
         "model", "assistant", "get_weather", "<unk>"]


def write_tokenizer(folder: Path, kind: str) -> None:
    specials = SPECIALS[kind]
    vocab = {t: i for i, t in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATES[kind],
           "eos_token": specials[-1], "unk_token": "<unk>"}
    if kind == "gemma3":
        cfg["bos_token"] = "<bos>"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))


def flat_model(kind: str, folder: Path) -> Path:
    """A random model whose final norm is zero: every logit is 0, so greedy decoding
    picks id 0, the end-of-turn marker."""
    hf = make_hf_model(kind)
    with torch.no_grad():  # Gemma's norm is (1 + w)
        hf.model.norm.weight.fill_(-1.0 if kind == "gemma3" else 0.0)
    path = save_hf_model(hf, folder)
    (path / "generation_config.json").unlink(missing_ok=True)
    write_tokenizer(path, kind)
    return path


MESSAGES = [{"role": "system", "content": "you are kind"},
            {"role": "user", "content": "weather in paris"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
RENDERED = {
    "qwen3": ("<|im_start|>system\nyou are kind\n\n# Tools\n<tools>\n"
              + json.dumps(TOOLS[0]) + "\n</tools><|im_end|>\n<|im_start|>user\n"
              "weather in paris<|im_end|>\n<|im_start|>assistant\n"),
    # no tool list in the template: the Hermes fallback writes it into the system turn
    "gemma3": ("<bos><start_of_turn>user\nyou are kind\n\n" + tool_instructions(TOOLS)
               + "\n\nweather in paris<end_of_turn>\n<start_of_turn>model\n"),
    "phi3": ("<|system|>\nyou are kind<|tool|>" + json.dumps(TOOLS) + "<|/tool|><|end|>\n"
             "<|user|>\nweather in paris<|end|>\n<|assistant|>\n"),
}


@pytest.mark.parametrize("kind", ["qwen3", "gemma3", "phi3"])
def test_template_renders_and_end_of_turn_stops_generation(tmp_path, kind):
    path = flat_model(kind, tmp_path / kind)
    tok = tokenizer_for_model(path)
    assert tok is not None
    assert 0 in tok.eos_token_ids  # the end-of-turn marker, from the template alone
    assert tok.render_chat(MESSAGES, TOOLS) == RENDERED[kind]
    with LLM(str(path), num_pages=16) as llm:
        out = llm.chat(MESSAGES, SamplingParams(max_tokens=5, temperature=0.0), tools=TOOLS)
    assert out[0].prompt_token_ids == tok.apply_chat_template(MESSAGES, TOOLS)
    assert out[0].outputs[0].token_ids == [0]
    assert out[0].outputs[0].finish_reason == "stop"
