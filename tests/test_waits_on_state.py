"""Tests wait on state, never for a fixed time (``tests/helpers/wait.py`` says why).

Two rules, read from the syntax trees of the test sources:

* ``time.sleep`` / ``asyncio.sleep`` with a pause other than 0 is called only by the wait
  helpers, or where the pause is the behaviour under test (a fake whose work takes time),
  which its line says with a ``# behaviour:`` comment; a test, a fixture or a helper waits
  through ``wait_until`` or ``holds_for`` instead;
* an ``httpx`` request names its timeout (httpx's default, 5 s, can run out on a loaded
  machine), and a number given there is at least :data:`MIN_CLIENT_TIMEOUT_S` seconds.
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
WAIT_HELPERS = TESTS / "helpers" / "wait.py"
MIN_CLIENT_TIMEOUT_S = 30
HTTPX_CALLS = {"get", "post", "put", "patch", "delete", "stream", "request", "Client",
               "AsyncClient"}


def _is_sleep(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return f.attr == "sleep" and f.value.id in ("time", "asyncio")
    return isinstance(f, ast.Name) and f.id == "sleep"


def _zero(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0


def _timeout_problem(call: ast.Call) -> str | None:
    f = call.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
            and f.value.id == "httpx" and f.attr in HTTPX_CALLS):
        return None
    given = next((k.value for k in call.keywords if k.arg == "timeout"), None)
    if given is None:
        return f"httpx.{f.attr} without a timeout"
    if isinstance(given, ast.Constant) and isinstance(given.value, (int, float)) \
            and given.value < MIN_CLIENT_TIMEOUT_S:
        return f"httpx.{f.attr} with a {given.value} s timeout"
    return None


def violations(source: str) -> list[tuple[int, str]]:
    """``(line, problem)`` for each break of the rules in one test module's source."""
    lines = source.splitlines()
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        if _is_sleep(node) and not _zero(node.args[0] if node.args else None) \
                and "# behaviour:" not in lines[node.lineno - 1]:
            found.append((node.lineno, "a fixed sleep: wait on state instead"))
        problem = _timeout_problem(node)
        if problem is not None:
            found.append((node.lineno, problem))
    return sorted(found)


def test_the_tests_wait_on_state_and_give_clients_time():
    found = [f"{path.relative_to(TESTS)}:{line}: {problem}"
             for path in sorted(TESTS.rglob("*.py")) if path != WAIT_HELPERS
             for line, problem in violations(path.read_text())]
    assert found == []


def test_the_rules_catch_what_they_name():
    src = ("import time, asyncio, httpx\n"
           "def test_x(server):\n"
           "    time.sleep(1.0)\n"                       # 3: a fixed sleep
           "    assert server.ready\n"
           "async def helper():\n"
           "    await asyncio.sleep(0.5)\n"              # 6: also in a helper
           "    await asyncio.sleep(0)\n"                # a yield: allowed
           "class FakeUpstream:\n"
           "    def answer(self):\n"
           "        time.sleep(0.01)  # behaviour: a slow upstream\n"
           "    def start(self):\n"
           "        time.sleep(0.2)\n"                   # 12: a method waits too
           "def test_y(url):\n"
           "    httpx.get(url)\n"                        # 14: httpx's 5 s default
           "    httpx.post(url, timeout=2)\n"            # 15: too short
           "    httpx.post(url, timeout=60)\n"
           "    httpx.post(url, timeout=DEADLINE_S)\n")
    assert [line for line, _ in violations(src)] == [3, 6, 12, 14, 15]
