"""DESIGN's layering, read from the import graph of the package's source.

Imports go one way: the front ends (``cli.py``, ``server/``, ``router/``, ``gateway/``,
``bench/``, ``analyze/``, ``deploy/``) -> ``engine/`` -> ``model/``, ``text/``, ``cache/`` ->
the small shared modules (``config``, ``outputs``, ``sampling_params``, ``paths``); ``http/``
(what the HTTP front ends share) sits below the front ends and imports only the shared
modules. Nothing imports upward, no two modules import each other (directly or through a
longer cycle), and no module imports the root package (its ``__init__`` re-exports the
offline API for users only).
Lazy imports inside functions count like top-level ones.
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "prefixcache"

SHARED = {"config", "outputs", "sampling_params", "paths", "errors", "progress"}
FRONT = {"cli", "server", "router", "gateway", "bench", "analyze", "deploy", "__main__"}
# package -> packages it may import besides itself and the shared modules
ALLOWED: dict[str, set[str]] = {
    "http": set(),  # below the HTTP front ends, above nothing: no engine, model or cache
    "cache": set(),
    "text": set(),
    "model": {"text"},
    "engine": {"model", "text", "cache"},
}
SHARED_MAY_IMPORT: set[str] = set()  # the shared modules import no package
# front end -> the other front ends it may import (``cli`` and ``__main__`` load them all).
# The gateway reuses analyze's breakers and price sheets and the server's Anthropic wire
# format; nothing imports the gateway. Key files, error objects, body limits and the
# runner are ``http/``'s, which every front end may import.
FRONT_MAY_IMPORT: dict[str, set[str]] = {
    "bench": {"server"},
    # the Ray Serve application runs the server's app in each replica and the router's
    # policy and index in its request router
    "deploy": {"server", "router"},
    "gateway": {"analyze", "server"},
    "router": {"server"},  # the request preparer: it hashes like the engines
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


# The code that computes page keys (DESIGN: "the page keys (fingerprint included) are
# computable [in cache/], without torch, so the router and the gateway never import a
# model").
PAGE_KEY_MODULES = ("prefixcache.cache.identity", "prefixcache.cache.hashing",
                    "prefixcache.cache.page_keys")
TORCH = {"torch", "xgrammar", "transformers", "safetensors"}  # each imports torch


def _third_party(path: Path, module_level_only: bool) -> set[str]:
    """Top-level names of the non-prefixcache modules ``path`` imports (lazy imports in
    functions too, unless ``module_level_only``: what importing the module runs)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = []
    if module_level_only:
        todo: list[ast.AST] = list(tree.body)
        while todo:
            node = todo.pop()
            nodes.append(node)
            if isinstance(node, (ast.If, ast.Try)):
                todo += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
                todo += [s for h in getattr(node, "handlers", []) for s in h.body]
    else:
        nodes = list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out - {"prefixcache"}


def _path_of(module: str) -> Path:
    rel = Path(*module.split(".")[1:])
    return PKG / rel / "__init__.py" if (PKG / rel).is_dir() else PKG / f"{rel}.py"


def test_the_code_that_computes_page_keys_imports_no_torch_statically():
    """Everything the page-key modules import, transitively (lazy imports included), and
    the packages above each of them (what importing them runs), imports no torch."""
    graph = _graph()
    seen: set[str] = set()
    todo = list(PAGE_KEY_MODULES)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        todo += graph[mod]
    parents = {".".join(m.split(".")[:i]) for m in seen for i in range(1, m.count(".") + 1)}
    bad = sorted(f"{m}: {sorted(_third_party(_path_of(m), False) & TORCH)}" for m in seen
                 if _third_party(_path_of(m), False) & TORCH)
    bad += sorted(f"{m} (package): {sorted(_third_party(_path_of(m), True) & TORCH)}"
                  for m in parents - seen if _third_party(_path_of(m), True) & TORCH)
    assert "prefixcache.cache.page_keys" in seen and "prefixcache.cache.hashing" in seen
    assert bad == []


KEYS_SCRIPT = """
import sys
from prefixcache.cache.identity import model_fingerprint, tier_fingerprint
from prefixcache.cache.page_keys import PromptKeys
import prefixcache.router, prefixcache.router.cli, prefixcache.router.replica_info
import prefixcache.router.app, prefixcache.gateway.app, prefixcache.gateway.cli
fp = model_fingerprint("builtin:tiny", "float32", 16)
keys = PromptKeys(fp, "prefixcache/v1", 16)
print(fp, tier_fingerprint(fp).hex())
for ns in ((None, None), ("acme", "salt")):
    print(" ".join(h.hex() for h in keys.page_hashes(list(range(1, 41)), *ns)))
print(sorted(m for m in ("torch", "xgrammar", "transformers") if m in sys.modules))
"""


def test_page_keys_and_the_router_package_import_no_torch_when_run():
    """Import the key code, the router's app and the gateway's in a fresh interpreter
    (xgrammar, which imports torch, loads only where a grammar is built) and compute
    keys: no torch in ``sys.modules``, and the keys are the engines' (exact values, as
    computed before the fingerprint left the engine)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", KEYS_SCRIPT], capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    assert out == [
        "builtin:tiny|kv=float32|bs=16|layout=1 3a839d8f8d68f87765512ca05ef2845d",
        "a0fa6df2f7eee8de8ad42da7708a9029 26a2a4e1c835d6f8e0a4f105b19bb68d",
        "b1b345f7fbbe2e7e6bf7602c8014a654 fd686f24cb1f6d5c816ac41a64be371e",
        "[]"]


def test_the_http_foundation_knows_no_engine_and_no_front_end():
    bad = sorted(f"{mod} -> {dep}" for mod, deps in _graph().items() if _top(mod) == "http"
                 for dep in deps if _top(dep) not in {"http"} | SHARED)
    assert bad == []
    heavy = {"torch", "transformers"}
    for path in (PKG / "http").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & heavy, path.name
            elif isinstance(node, ast.ImportFrom) and not node.level:
                assert (node.module or "").split(".")[0] not in heavy, path.name
