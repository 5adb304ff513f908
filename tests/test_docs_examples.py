"""Every runnable example of the documentation runs, and prints what the page shows.

A fenced block is runnable when the line before its opening fence is ``<!-- runnable -->``;
an ``<!-- output -->`` block right after it is the exact text it must print (the
convention is described in ``docs/contributing.md``). A page's runnable blocks run in page
order in one temporary folder: ``python`` blocks with this interpreter (the project's
venv), ``bash`` blocks with ``bash -e``, each in a process group of its own, with the
venv's ``bin/`` first on ``PATH`` and the CPU kernels off (``PREFIXCACHE_CPU_KERNELS=0``:
the printed figures do not depend on the backend). Port 8000 in a page's blocks becomes a
free port, and every process a page started (a server sent to the background) is stopped
at its end.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.wait import wait_until

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
BLOCK_TIMEOUT_S = 600  # generous: a loaded machine may first build the CPU kernels
MARK = re.compile(r"^<!-- runnable -->$", re.MULTILINE)  # a line of its own
RUNNERS = {"python": [sys.executable], "bash": ["bash", "-e"]}
BLOCK = re.compile(
    r"^<!-- runnable -->\n```(\w+)\n(.*?)^```\n"
    r"(?:\s*^<!-- output -->\n```\w*\n(.*?)^```\n)?", re.MULTILINE | re.DOTALL)


@dataclass
class Runnable:
    lang: str
    code: str
    output: str | None


def runnable_blocks(text: str) -> list[Runnable]:
    """The runnable blocks of a page's Markdown, in order, with their expected output."""
    marked = len(MARK.findall(text))
    found = [Runnable(lang, code, out) for lang, code, out in BLOCK.findall(text + "\n")]
    assert len(found) == marked, "a <!-- runnable --> line is not right before a fence"
    for block in found:
        assert block.lang in RUNNERS, f"runnable block in {block.lang!r}: no runner"
        block.output = block.output or None
    return found


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if MARK.search(p.read_text()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id was reused by someone else's group
        return False
    return True


def stop_groups(pgids: list[int], deadline_s: float = 60.0) -> None:
    """SIGTERM every process group left running, then SIGKILL what has not exited."""
    for pgid in pgids:
        if group_alive(pgid):
            os.killpg(pgid, signal.SIGTERM)
    try:
        wait_until(lambda: not any(group_alive(g) for g in pgids), "the examples' processes "
                   "to exit", deadline_s=deadline_s, poll_s=0.2)
    except AssertionError:
        pass  # still running: killed below
    for pgid in pgids:
        if group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)


def test_the_quickstart_examples_are_marked_runnable():
    blocks = runnable_blocks((DOCS / "getting-started.md").read_text())
    assert [b.lang for b in blocks] == ["python", "bash", "python"]
    assert "LLM(" in blocks[0].code and blocks[0].output
    assert "prefixcache serve" in blocks[1].code and "--port 8000" in blocks[1].code
    assert "OpenAI(" in blocks[2].code and blocks[2].output
    assert DOCS / "getting-started.md" in pages()


def test_runnable_block_parsing():
    text = ("text\n<!-- runnable -->\n```bash\necho hi\n```\n\n<!-- output -->\n```text\n"
            "hi\n```\n\n```python\nprint('not run')\n```\n<!-- runnable -->\n```python\n"
            "print(1)\n```\n")
    got = runnable_blocks(text)
    assert [(b.lang, b.code, b.output) for b in got] == [
        ("bash", "echo hi\n", "hi\n"), ("python", "print(1)\n", None)]
    with pytest.raises(AssertionError, match="not right before a fence"):
        runnable_blocks("<!-- runnable -->\n\n```bash\necho hi\n```\n")


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_docs_page_runs(page: Path, tmp_path):
    port = str(free_port())
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1",
           # torch ops, not the C++ kernels (their exactness is tested elsewhere): the
           # examples never wait for a kernel build
           "PREFIXCACHE_CPU_KERNELS": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                       os.environ.get("PYTHONPATH")]))}
    groups: list[int] = []
    try:
        for i, block in enumerate(runnable_blocks(page.read_text())):
            code = re.sub(r"\b8000\b", port, block.code)
            script = tmp_path / f"block{i}.{'py' if block.lang == 'python' else 'sh'}"
            script.write_text(code)
            out, err = tmp_path / f"block{i}.out", tmp_path / f"block{i}.err"
            with open(out, "w") as fo, open(err, "w") as fe:
                # files, not pipes: a server a block starts in the background keeps its
                # inherited descriptors open after the block's own process has exited
                proc = subprocess.Popen([*RUNNERS[block.lang], str(script)], cwd=tmp_path,
                                        env=env, stdout=fo, stderr=fe,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
                groups.append(proc.pid)
                rc = proc.wait(timeout=BLOCK_TIMEOUT_S)
            shown = f"block {i} of {page.name}:\n{code}\nstdout:\n{out.read_text()}\n" \
                    f"stderr:\n{err.read_text()[-4000:]}"
            assert rc == 0, shown
            if block.output is not None:
                assert out.read_text() == block.output, shown
    finally:
        stop_groups(groups)
        logs = sorted(tmp_path.glob("*.log"))
        for log in logs:  # a server's log, for a failure's report
            print(f"--- {log.name}:\n{log.read_text()[-4000:]}")
