"""A random-weight Qwen2 checkpoint with the real Qwen2 tokenizer and a Hermes-style chat
template (the tool syntax of Qwen2.5/Qwen3), written to a folder ``prefixcache serve`` loads.

Test scaffolding. :data:`HERMES_TEMPLATE` follows the layout Qwen2.5 uses: the tools in
the system turn, an assistant turn's calls as ``<tool_call>`` blocks with
``arguments | tojson``, consecutive ``tool`` messages in one ``user`` turn as
``<tool_response>`` blocks.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import transformers

from tests.helpers.data import shared_data

IM_END = 151645

HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] in ('user', 'system') or (message['role'] == 'assistant' "
    "and not message['tool_calls']) %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{%- elif message['role'] == 'assistant' %}<|im_start|>assistant"
    "{%- if message['content'] %}\n{{ message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set f = call['function'] if call['function'] is defined else call %}"
    "\n<tool_call>\n{\"name\": \"{{ f['name'] }}\", \"arguments\": "
    "{{ f['arguments'] | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "<|im_start|>user{%- endif %}\n<tool_response>\n{{ message['content'] }}\n"
    "</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n"
    "{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def write_hermes_qwen2(out: Path, seed: int = 0) -> Path:
    """A Qwen2 folder (config, random safetensors, the Qwen2 tokenizer files with
    :data:`HERMES_TEMPLATE`) at ``out``; its vocabulary covers the tokenizer's ids."""
    out.mkdir(parents=True, exist_ok=True)
    for f in (shared_data("tokenizers") / "qwen2").iterdir():
        if f.is_file():
            shutil.copyfile(f, out / f.name)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = HERMES_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096,
        rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=False,
        eos_token_id=IM_END, bos_token_id=None)
    transformers.Qwen2ForCausalLM(config).eval().save_pretrained(out, safe_serialization=True)
    return out
