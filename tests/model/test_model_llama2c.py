"""A real trained model: Karpathy's stories260K (llama2.c), converted to HF format by a
test helper. Our paged model and transformers must tell the same story."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from helpers.hf_models import hf_greedy, hf_logits
from helpers.llama2c import convert
from helpers.paged import PagedRunner, Seq
from prefixcache.model import load_model
from prefixcache.text.detokenizer import IncrementalDetokenizer
from prefixcache.text.json_tokenizer import JSONTokenizer

PROMPT = "Once upon a time"
PROMPT_IDS = [1, 403, 407, 261, 378]
STORY = ("Once upon a time, there was a little girl named Lily. "
         "She loved to play outside in the park.")
STEPS = 40


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, shared_data_path):
    return convert(shared_data_path("llama2c_stories260K"), tmp_path_factory.mktemp("s260k"))


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_model(str(model_dir))


@pytest.fixture(scope="module")
def hf(model_dir):
    return LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def test_tokenizer_reproduces_llama2c_encoding(loaded, model_dir):
    tok = loaded.tokenizer
    assert tok.encode(PROMPT) == PROMPT_IDS
    assert tok.bos_token_id == 1 and 2 in tok.eos_token_ids
    assert tok.decode(PROMPT_IDS) == PROMPT
    raw = JSONTokenizer(model_dir)  # the same tokenizer.json without transformers
    assert raw.encode(PROMPT) == PROMPT_IDS
    # characters outside the 512-token vocabulary fall back to <0xNN> byte tokens (3 + byte)
    assert raw.encode("ж", add_special_tokens=False)[-2:] == [3 + 0xD0, 3 + 0xB6]
    assert raw.decode(raw.encode("Zoë sees 🐱.")) == "Zoë sees 🐱."


def test_greedy_story_matches_transformers(loaded, hf):
    runner = PagedRunner(loaded.model, num_pages=32, seed=11)
    seq = Seq()
    ours = runner.greedy(seq, runner.prefill(seq, PROMPT_IDS), STEPS)
    assert seq.pages != sorted(seq.pages)
    assert ours == hf_greedy(hf, PROMPT_IDS, STEPS)
    text = loaded.tokenizer.decode(PROMPT_IDS + ours)
    assert text.startswith(STORY), text
    detok = IncrementalDetokenizer(loaded.tokenizer, prompt_ids=PROMPT_IDS)
    streamed = "".join(detok.push([t]) for t in ours) + detok.flush()
    assert PROMPT + streamed == text


def test_chunked_and_cached_story_logits_match_transformers(loaded, hf):
    ids = loaded.tokenizer.encode(STORY + " One day, she saw a big, red ball.")
    ref = hf_logits(hf, ids)
    runner = PagedRunner(loaded.model, num_pages=32, seed=12)
    first = Seq()
    head = runner.prefill(first, ids[:32], chunk=24, all_logits=True)
    warm = runner.fork(first, 32)
    tail = runner.step([(warm, ids[32:])], all_logits=True)[0]
    torch.testing.assert_close(torch.cat([head, tail]), ref, atol=1e-4, rtol=0)
