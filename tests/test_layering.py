"""DESIGN's layering, read from the import graph of the package's source.

Imports go one way: the front ends (``cli.py``, ``server/``, ``router/``, ``gateway/``,
``bench/``, ``analyze/``, ``deploy/``) -> ``engine/`` -> ``model/``, ``text/``, ``cache/`` ->
the small shared modules (``config``, ``outputs``, ``sampling_params``, ``paths``). Nothing
imports upward, no two modules import each other (directly or through a longer cycle), and no module
imports the root package (its ``__init__`` re-exports the offline API for users only).
Lazy imports inside functions count like top-level ones.
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "prefixcache"

SHARED = {"config", "outputs", "sampling_params", "paths", "errors"}
FRONT = {"cli", "server", "router", "gateway", "bench", "analyze", "deploy", "__main__"}
# package -> packages it may import besides itself and the shared modules
ALLOWED: dict[str, set[str]] = {
    "cache": set(),
    "text": set(),
    "model": {"text"},
    "engine": {"model", "text", "cache"},
}
SHARED_MAY_IMPORT: set[str] = set()  # the shared modules import no package
# front end -> the other front ends it may import (``cli`` and ``__main__`` load them all).
# The gateway reuses analyze's breakers and price sheets and the server's key file, error
# bodies and Anthropic wire format; nothing imports the gateway.
FRONT_MAY_IMPORT: dict[str, set[str]] = {
    "bench": {"server"},
    # the Ray Serve application runs the server's app in each replica and the router's
    # policy and index in its request router
    "deploy": {"server", "router"},
    "gateway": {"analyze", "server"},
    "router": {"server"},  # the key file and the request preparer: it hashes like the engines
}


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    return ".".join(parts), is_pkg


def _imports(path: Path) -> set[str]:
    name, is_pkg = _module_name(path)
    parts = name.split(".")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "prefixcache"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts if is_pkg else parts[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "prefixcache":
                continue
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    raw = {_module_name(p)[0]: _imports(p) for p in PKG.rglob("*.py")}
    names = set(raw)
    return {m: {d for d in deps if d in names and d != m} for m, deps in raw.items()}


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_between_modules():
    assert _cycles(_graph()) == []


def test_no_import_cycles_between_packages():
    packages: dict[str, set[str]] = {}
    for mod, deps in _graph().items():
        packages.setdefault(_top(mod), set()).update(
            _top(d) for d in deps if _top(d) != _top(mod))
    packages.pop("<root>", None)
    for deps in packages.values():
        deps.discard("<root>")
    assert _cycles(packages) == []


def test_nothing_imports_upward():
    bad = []
    for mod, deps in sorted(_graph().items()):
        src = _top(mod)
        for dep in sorted(deps):
            dst = _top(dep)
            if dst == "<root>":
                bad.append(f"{mod} -> {dep} (the root package is for users only)")
            elif src in ("<root>", dst) or src in FRONT or dst in SHARED and src not in SHARED:
                continue
            elif src in SHARED:
                if dst not in SHARED | SHARED_MAY_IMPORT:
                    bad.append(f"{mod} -> {dep}")
            elif dst in FRONT or dst not in ALLOWED.get(src, set()):
                bad.append(f"{mod} -> {dep}")
    assert bad == []


def test_front_ends_import_each_other_only_as_listed():
    bad = []
    for mod, deps in sorted(_graph().items()):
        src = _top(mod)
        if src not in FRONT or src in ("cli", "__main__"):
            continue
        for dep in sorted(deps):
            dst = _top(dep)
            if dst in FRONT and dst != src and dst not in FRONT_MAY_IMPORT.get(src, set()):
                bad.append(f"{mod} -> {dep}")
    assert bad == []


def test_the_cache_core_knows_nothing_of_torch_or_http():
    heavy = {"torch", "fastapi", "httpx", "uvicorn", "transformers"}
    bad = []
    for path in (PKG / "cache").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            bad += [f"{path.name}: {n}" for n in names if n.split(".")[0] in heavy]
    assert bad == []
