"""The llama.cpp converter (transformers 4.x in its venv) reads a staging copy of the model
directory whose tokenizer class is named as 4.x names it; every other file is a link."""
from __future__ import annotations

import json

from prefixcache.bench.peers.llamacpp_peer import staging_dir


def test_staging_renames_the_tokenizer_class_and_links_the_rest(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"\x00" * 8)
    (model / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "TokenizersBackend", "bos_token": "<s>"}))
    out = staging_dir(model, tmp_path / "stage")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer_config.json"]
    assert (out / "model.safetensors").resolve() == (model / "model.safetensors").resolve()
    assert not (out / "tokenizer_config.json").is_symlink()
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg == {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>"}
    # a second staging into the same place replaces what is there
    (model / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    staging_dir(model, out)
    assert json.loads((out / "tokenizer_config.json").read_text()) == {
        "tokenizer_class": "LlamaTokenizer"}
