"""Benchmark of ``prefixcache gateway``: replay multi-turn conversations and agent
trajectories from ../shared/data through the gateway, with repeats.

Two upstreams:

* ``engine``: our server (``builtin:tiny``, CPU) behind the gateway, provider
  ``prefixcache``: layer-1 hits and latency, the engine's own prefix cache (layer 3).
* ``anthropic``: the emulated Anthropic API (:mod:`prefixcache.gateway.emulator`) with the
  gateway's breakpoints on and off: what layer-3 shaping saves at Anthropic's prices.

Each conversation is replayed as a client would: turn by turn, the gateway's answers as
the assistant history. Passes: ``cold`` (first time), ``repeat`` (the same conversation
again: exact repeats), ``paraphrase`` (each last user turn reworded: layer 1 misses, the
upstream prefix still hits). Every repeat uses fresh gateways and a new tenant, so the
engine's pages of one repeat never serve another.

    python scripts/bench_gateway.py --repeats 3 --out benchmarks/gateway/raw
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prefixcache.bench.datasets import (  # noqa: E402
    agent_trajectories,
    fabric_patterns,
    glaive_conversations,
    oasst_paths,
)
from prefixcache.gateway.app import create_app, make_client  # noqa: E402
from prefixcache.gateway.emulator import Emulator  # noqa: E402
from prefixcache.gateway.exact import exact_key  # noqa: E402
from prefixcache.gateway.policy import TenantPolicy  # noqa: E402
from prefixcache.gateway.service import Gateway  # noqa: E402
from prefixcache.gateway.store import MemoryStore  # noqa: E402
from prefixcache.gateway.upstreams import Upstream, UpstreamSpec  # noqa: E402
from prefixcache.server.auth import Authenticator  # noqa: E402
from tests.gateway.conftest import ThreadServer  # noqa: E402
from tests.server.live import LiveServer  # noqa: E402

MAX_CHARS = 600


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS]


def conversations(n: int, turns: int) -> list[tuple[str, list[str]]]:
    """``(dataset, user turns)``: the user (or tool-result) messages of each one."""
    out: list[tuple[str, list[str]]] = []
    for _, msgs in oasst_paths()[:n]:
        out.append(("oasst1", [_clip(m["content"]) for m in msgs if m["role"] == "user"]))
    for conv in glaive_conversations()[:n]:
        out.append(("glaive", [_clip(m["content"]) for m in conv.messages
                               if m["role"] in ("user", "tool") and m["content"]]))
    for traj in agent_trajectories()[:n]:
        out.append(("agent", [_clip(str(m["content"])) for m in traj.messages
                              if m["role"] in ("user", "tool") and m["content"]]))
    return [(d, u[:turns]) for d, u in out if u]


def paraphrase(text: str) -> str:
    return f"Could you help with this: {text.rstrip('?.! ')}?"


async def replay(client: httpx.AsyncClient, key: str, model: str, system: str,
                 convs: list[tuple[str, list[str]]], reword: bool, rows: list[dict],
                 label: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    for dataset, users in convs:
        msgs = [{"role": "system", "content": system}]
        for i, user in enumerate(users):
            last = i == len(users) - 1
            msgs.append({"role": "user", "content": paraphrase(user) if reword and last
                         else user})
            body = {"model": model, "messages": msgs, "max_tokens": 8, "temperature": 0}
            t0 = time.perf_counter()
            r = await client.post("/v1/chat/completions", json=body, headers=headers)
            ms = (time.perf_counter() - t0) * 1000
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
            d = r.json()
            rows.append({"pass": label, "dataset": dataset, "layer": d["usage"]["cache_layer"],
                         "reworded": reword and last,
                         "ms": ms, "prompt": d["usage"]["prompt_tokens"],
                         "cached": d["usage"]["prompt_tokens_details"]["cached_tokens"]})
            msgs.append({"role": "assistant", "content": d["choices"][0]["message"]["content"]})


class TimedSemantic:
    """A SemanticCache that records every lookup's embed / index / verify milliseconds."""

    def __init__(self, cache):
        self.cache = cache
        self.timings: list = []

    def lookup(self, scope: bytes, text: str):
        found = self.cache.search(scope, text)
        self.timings.append(found.timings)
        return found.hit

    def store(self, scope: bytes, text: str, value: bytes) -> None:
        self.cache.store(scope, text, value)


def gateway_for(url: str, provider: str, model: str, shape: bool = True,
                semantic: TimedSemantic | None = None) -> Gateway:
    client = make_client()
    return Gateway([Upstream(UpstreamSpec(provider, url, provider, (model,), timeout_s=120),
                             client)], MemoryStore(),
                   policies={"*": TenantPolicy(semantic=semantic is not None)}, shape=shape,
                   semantic=semantic)


async def run_pass_set(gw: Gateway, key: str, keys: dict, model: str, system: str,
                       convs: list) -> tuple[list[dict], dict]:
    app = create_app(gw, Authenticator(keys))
    rows: list[dict] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw",
                                 timeout=300) as c:
        for label, reword in (("cold", False), ("repeat", False), ("paraphrase", True)):
            await replay(c, key, model, system, convs, reword, rows, label)
    stats = gw.metrics.stats(keys[key]["tenant"], False)[keys[key]["tenant"]]
    await gw.upstreams[0].client.aclose()
    return rows, stats


def hash_us(convs: list, system: str) -> float:
    bodies = []
    for _, users in convs:
        msgs = [{"role": "system", "content": system}]
        for u in users:
            msgs.append({"role": "user", "content": u})
            bodies.append({"model": "m", "messages": list(msgs), "temperature": 0})
    t0 = time.perf_counter()
    for b in bodies:
        exact_key("t", "chat", b)
    return (time.perf_counter() - t0) / len(bodies) * 1e6


def summarise(rows: list[dict]) -> dict:
    out: dict = {}
    for label in ("cold", "repeat", "paraphrase"):
        rs = [r for r in rows if r["pass"] == label]
        layers = {k: sum(r["layer"] == k for r in rs) / len(rs)
                  for k in ("exact", "semantic", "miss")}
        sem = [r for r in rs if r["layer"] == "semantic"]
        prompt = sum(r["prompt"] for r in rs if r["layer"] == "miss")
        cached = sum(r["cached"] for r in rs if r["layer"] == "miss")
        out[label] = {"requests": len(rs), "exact_hit_rate": layers["exact"],
                      "semantic_hit_rate": layers["semantic"],
                      "semantic_hits_true": sum(r["reworded"] for r in sem),
                      "semantic_hits_false": sum(not r["reworded"] for r in sem),
                      "median_ms_semantic": _median([r["ms"] for r in sem]),
                      "upstream_prefix_hit_rate": cached / prompt if prompt else 0.0,
                      "median_ms_exact": _median([r["ms"] for r in rs if r["layer"] == "exact"]),
                      "median_ms_miss": _median([r["ms"] for r in rs if r["layer"] == "miss"])}
    return out


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def spread(xs: list[float]) -> str:
    """``median (min-max)`` of the repeats."""
    return f"{statistics.median(xs):.3g} ({min(xs):.3g}-{max(xs):.3g})"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    passes = ["cold", "repeat", "paraphrase"]
    series = [("exact_hit_rate", "layer 1 (exact), of requests"),
              ("semantic_hit_rate", "layer 2 (semantic), of requests"),
              ("upstream_prefix_hit_rate", "layer 3 (engine prefix cache), of miss tokens")]
    for j, (what, label) in enumerate(series):
        vals = [statistics.median(e["summary"][p][what] for e in result["engine"])
                for p in passes]
        ax1.bar([i + 0.27 * j for i in range(3)], vals, width=0.27, label=label)
    ax1.set_xticks([i + 0.27 for i in range(3)], passes)
    ax1.set_ylabel("hit rate")
    ax1.set_title("gateway -> prefixcache engine (builtin:tiny)")
    ax1.legend(fontsize=8)
    scen = ["cost_actual", "cost_without_exact", "cost_without_prefix"]
    for j, shape in enumerate((True, False)):
        runs = [a["stats"] for a in result["anthropic"] if a["shape"] is shape]
        vals = [statistics.median(r[k] for r in runs) for k in scen]
        ax2.bar([i + 0.4 * j for i in range(3)], vals, width=0.4,
                label="breakpoints placed" if shape else "no breakpoints")
    ax2.set_xticks([i + 0.2 for i in range(3)], ["actual", "without layer 1",
                                                 "without layers 1+3"])
    ax2.set_ylabel("USD (claude-sonnet-4-5 sheet)")
    ax2.set_title("gateway -> emulated Anthropic: cost of the replay")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--conversations", type=int, default=8, help="per dataset")
    p.add_argument("--turns", type=int, default=5, help="user turns per conversation")
    p.add_argument("--out", default="benchmarks/gateway/raw")
    p.add_argument("--semantic", action="store_true",
                   help="layer 2 on for the engine runs (needs prefixcache.gateway.semantic)")
    args = p.parse_args()
    new_semantic = None
    if args.semantic:
        from prefixcache.gateway.semantic.cache import SemanticCache
        from prefixcache.gateway.semantic.embedder import MiniLMEmbedder

        embedder = MiniLMEmbedder(threads=1)

        def new_semantic() -> TimedSemantic:
            return TimedSemantic(SemanticCache(embedder))
    convs = conversations(args.conversations, args.turns)
    long_systems = sorted(fabric_patterns().values(), key=len)
    anth_system = next(s for s in long_systems if len(s) > 6000)
    keys = {f"sk-{i}": {"tenant": f"bench-{i}-{time.time_ns()}", "admin": False}
            for i in range(args.repeats)}
    out_dir = REPO / args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"semantic": args.semantic, "conversations": len(convs),
                    "requests_per_pass": sum(
        len(u) for _, u in convs), "repeats": args.repeats, "engine": [], "anthropic": [],
        "hash_us": hash_us(convs, anth_system)}
    engine = LiveServer(["--served-model-name", "tiny", "--num-pages", "8192"],
                        Path(tempfile.mkdtemp()) / "server.log")
    try:
        engine.wait_ready()
        for i, key in enumerate(keys):
            for shape in (True, False):  # interleaved: shaped, unshaped, per repeat
                emu = Emulator("anthropic")
                srv = ThreadServer(emu.app)
                try:
                    rows, stats = asyncio.run(run_pass_set(
                        gateway_for(srv.url, "anthropic", "claude-sonnet-4-5", shape), key,
                        keys, "claude-sonnet-4-5", anth_system, convs))
                finally:
                    srv.stop()
                result["anthropic"].append({"repeat": i, "shape": shape, "stats": stats,
                                            "summary": summarise(rows)})
            semantic = new_semantic() if new_semantic is not None else None
            rows, stats = asyncio.run(run_pass_set(
                gateway_for(engine.base, "prefixcache", "tiny", semantic=semantic), key, keys,
                "tiny", "You are a helpful assistant.", convs))
            entry = {"repeat": i, "stats": stats, "summary": summarise(rows)}
            if semantic is not None:
                entry["semantic_ms"] = {k: _median([getattr(t, k) for t in semantic.timings])
                                        for k in ("embed_ms", "index_ms", "verify_ms")}
            result["engine"].append(entry)
            print(f"repeat {i}: engine {result['engine'][-1]['summary']}", flush=True)
    finally:
        engine.stop()
    (out_dir / "results.json").write_text(json.dumps(result, indent=1))
    plot(result, out_dir / "gateway.png")
    print(json.dumps({k: v for k, v in result.items() if k not in ("engine", "anthropic")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
