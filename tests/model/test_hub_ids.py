"""Hugging Face hub ids, resolved offline from a cache folder laid out as the hub lays it
out (``models--org--name/{refs/main, snapshots/<commit>/...}``); no test touches the
network (``HF_HUB_OFFLINE=1``)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.hf_models import hf_greedy, hf_logits, make_hf_model, save_hf_model
from helpers.paged import PagedRunner, Seq
from prefixcache import LLM, SamplingParams
from prefixcache.model import hub, load_model
from prefixcache.model.loader import load_tokenizer

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40
IDS = [5, 17, 200, 3, 99, 42, 7, 250, 11, 64, 128, 1, 33, 77, 19, 8, 150]


def add_snapshot(cache: Path, repo_id: str, commit: str, files: dict[str, Path | bytes],
                 ref: str | None = "main") -> Path:
    """Lay ``files`` out as the hub's cache does: blobs, a snapshot of symlinks, a ref."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, src in files.items():
        data = src.read_bytes() if isinstance(src, Path) else src
        blob = repo / "blobs" / f"{commit[:8]}-{name.replace('/', '_')}"
        blob.write_bytes(data)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(blob)
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture
def offline_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PREFIXCACHE_CACHE_DIR", str(tmp_path / "pc-cache"))
    return cache


def saved(tmp_path: Path, kind: str, seed: int) -> tuple[object, dict[str, Path]]:
    hf = make_hf_model(kind, seed=seed)
    d = save_hf_model(hf, tmp_path / f"{kind}-{seed}")
    return hf, {p.name: p for p in d.iterdir() if p.is_file()}


def test_hub_id_loads_offline_from_the_cache_at_main_and_at_a_revision(tmp_path,
                                                                         offline_cache):
    hf_a, files_a = saved(tmp_path, "llama", seed=1)
    hf_b, files_b = saved(tmp_path, "llama", seed=2)
    add_snapshot(offline_cache, "acme/tiny-llama", COMMIT_A, files_a)
    add_snapshot(offline_cache, "acme/tiny-llama", COMMIT_B, files_b, ref=None)

    main = load_model("acme/tiny-llama")
    assert main.path == offline_cache / "models--acme--tiny-llama" / "snapshots" / COMMIT_A
    assert main.cache_id == f"hf:acme/tiny-llama@{COMMIT_A}"
    got = PagedRunner(main.model, seed=1).prefill(Seq(), IDS, all_logits=True)
    torch.testing.assert_close(got, hf_logits(hf_a, IDS), atol=1e-4, rtol=0)

    other = load_model("acme/tiny-llama", revision=COMMIT_B)
    assert other.cache_id == f"hf:acme/tiny-llama@{COMMIT_B}"  # other weights, other pages
    got = PagedRunner(other.model, seed=1).prefill(Seq(), IDS, all_logits=True)
    torch.testing.assert_close(got, hf_logits(hf_b, IDS), atol=1e-4, rtol=0)
    assert load_tokenizer("acme/tiny-llama")[1] == main.cache_id


def test_llm_takes_a_hub_id_and_a_revision(tmp_path, offline_cache):
    hf, files = saved(tmp_path, "llama", seed=1)
    add_snapshot(offline_cache, "acme/tiny-llama", COMMIT_A, files)
    with LLM("acme/tiny-llama", revision=COMMIT_A, num_pages=16) as llm:
        assert llm.engine.loaded.cache_id == f"hf:acme/tiny-llama@{COMMIT_A}"
        out = llm.generate({"prompt_token_ids": IDS},
                           SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    assert out[0].outputs[0].token_ids == hf_greedy(hf, IDS, 3)


def test_hf_home_is_respected_when_hf_hub_cache_is_unset(tmp_path, monkeypatch):
    _, files = saved(tmp_path, "qwen2", seed=3)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    add_snapshot(tmp_path / "home" / "hub", "acme/tiny-qwen", COMMIT_A, files)
    assert hub.hub_cache_dir() == tmp_path / "home" / "hub"
    assert load_model("acme/tiny-qwen").config.architecture == "Qwen2ForCausalLM"


def test_offline_miss_names_the_id_and_the_cache_folder(offline_cache):
    with pytest.raises(hub.HubModelError) as e:
        load_model("Qwen/Qwen3-0.6B")
    msg = str(e.value)
    assert "Qwen/Qwen3-0.6B" in msg and str(offline_cache) in msg and "HF_HUB_OFFLINE" in msg
    with pytest.raises(hub.HubModelError, match="revision v2"):
        load_model("Qwen/Qwen3-0.6B", revision="v2")


def test_revision_of_a_local_path_is_refused_by_name(tmp_path, offline_cache):
    _, files = saved(tmp_path, "llama", seed=1)
    with pytest.raises(ValueError, match="^revision: "):
        load_model(str(files["config.json"].parent), revision="main")


def test_paths_and_builtin_names_are_not_hub_ids(tmp_path):
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    assert hub.parse_hub_id("Qwen/Qwen3-0.6B") == hub.HubId("Qwen/Qwen3-0.6B")
    assert hub.parse_hub_id("unsloth/Qwen3-0.6B-GGUF:Q4_K_M") == hub.HubId(
        "unsloth/Qwen3-0.6B-GGUF", "Q4_K_M")
    assert hub.parse_hub_id(str(tmp_path / "org" / "name")) is None
    assert hub.parse_hub_id("./org/name") is None
    assert hub.parse_hub_id("builtin:tiny") is None
    assert hub.parse_hub_id("a/b/c") is None


def test_gguf_in_a_hub_repo_is_picked_by_tag_or_file_name(tmp_path, offline_cache):
    names = ["tiny-Q4_K_M.gguf", "tiny-Q4_K_S.gguf", "tiny-Q8_0.gguf", "README.md"]
    snap = add_snapshot(offline_cache, "acme/tiny-GGUF", COMMIT_A,
                        {n: n.encode() for n in names})
    pick = lambda s: hub.resolve_hub_id(hub.parse_hub_id(s))  # noqa: E731
    assert pick("acme/tiny-GGUF:Q4_K_M") == snap / "tiny-Q4_K_M.gguf"
    assert pick("acme/tiny-GGUF:q8_0") == snap / "tiny-Q8_0.gguf"
    assert pick("acme/tiny-GGUF:tiny-Q4_K_S.gguf") == snap / "tiny-Q4_K_S.gguf"
    with pytest.raises(hub.HubModelError, match="several GGUF files .*tiny-Q4_K_M.gguf"):
        pick("acme/tiny-GGUF")
    with pytest.raises(hub.HubModelError, match="GGUF file matching 'Q4_K'"):
        pick("acme/tiny-GGUF:Q4_K")  # a whole tag only: Q4_K is not Q4_K_M


def test_a_real_gguf_in_a_hub_repo_loads_by_tag(tmp_path, offline_cache):
    from helpers.family_gguf import write_family_gguf

    hf = make_hf_model("llama", seed=4)
    f = write_family_gguf(hf, tmp_path / "tiny-Q8_0.gguf", "F32")
    add_snapshot(offline_cache, "acme/tiny-GGUF", COMMIT_A, {"tiny-F32.gguf": f})
    loaded = load_model("acme/tiny-GGUF:F32")
    assert loaded.cache_id.startswith("gguf:")  # the file's weights, whatever its name
    got = PagedRunner(loaded.model, seed=2).prefill(Seq(), IDS, all_logits=True)
    torch.testing.assert_close(got, hf_logits(hf, IDS), atol=1e-4, rtol=0)


def test_router_takes_the_replicas_revision(tmp_path, offline_cache):
    """The router's page keys fold in the same snapshot commit as the replicas'."""
    import argparse

    from prefixcache.router.cli import add_parser

    _, files_a = saved(tmp_path, "llama", seed=1)
    _, files_b = saved(tmp_path, "llama", seed=2)
    add_snapshot(offline_cache, "acme/tiny-llama", COMMIT_A, files_a)
    add_snapshot(offline_cache, "acme/tiny-llama", COMMIT_B, files_b, ref=None)
    sub = argparse.ArgumentParser().add_subparsers()
    args = add_parser(sub).parse_args(["--model", "acme/tiny-llama", "--revision", COMMIT_B,
                                       "--replica", "http://127.0.0.1:8001"])
    assert load_tokenizer(args.model, args.revision)[1] == f"hf:acme/tiny-llama@{COMMIT_B}"
