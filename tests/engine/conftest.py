"""Tiny Hugging Face checkpoints saved to disk, and their greedy reference outputs."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import transformers

TOL = 1e-4  # float32 |Δ logprob| between our paged engine and transformers

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
            max_position_embeddings=1024, rms_norm_eps=1e-5)

CONFIGS = {
    "llama": (transformers.LlamaConfig, dict(BASE, tie_word_embeddings=False)),
    "llama3-tied": (transformers.LlamaConfig, dict(
        BASE, tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen2": (transformers.Qwen2Config, dict(BASE, tie_word_embeddings=False)),
    "mistral": (transformers.MistralConfig, dict(BASE, sliding_window=None,
                                                 tie_word_embeddings=False)),
}
MODEL_CLASSES = {"llama": transformers.LlamaForCausalLM,
                 "llama3-tied": transformers.LlamaForCausalLM,
                 "qwen2": transformers.Qwen2ForCausalLM,
                 "mistral": transformers.MistralForCausalLM}


@dataclass
class HFModel:
    path: str
    model: torch.nn.Module

    @torch.no_grad()
    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy continuation by full forwards; returns tokens and each step's
        float32 log-softmax ``[vocab]``."""
        ids = list(prompt)
        toks, lps = [], []
        for _ in range(n):
            logits = self.model(torch.tensor([ids])).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            t = int(torch.argmax(lp))
            toks.append(t)
            lps.append(lp)
            ids.append(t)
        return toks, lps


def _build(name: str, root) -> HFModel:
    cfg_cls, kw = CONFIGS[name]
    torch.manual_seed(1234)
    model = MODEL_CLASSES[name](cfg_cls(**kw)).eval()
    # Random init is tiny; scale weights up so logits are not flat (greedy is decisive).
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    path = root / name
    model.save_pretrained(path)
    return HFModel(str(path), model)


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory) -> dict[str, HFModel]:
    root = tmp_path_factory.mktemp("hf")
    return {name: _build(name, root) for name in CONFIGS}


@pytest.fixture(scope="session")
def llama(hf_models) -> HFModel:
    return hf_models["llama"]


def prompt_ids(n: int, seed: int, vocab: int = 300) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()
