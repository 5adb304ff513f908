"""The engines the bench compares, by name.

==================== ======================== =========================================
name                 modes                    what
==================== ======================== =========================================
prefixcache          offline, serving         our engine, prefix caching on
prefixcache-nocache  offline, serving         our engine, prefix caching off
transformers         offline (also listed in  HF ``generate``, serial, no cross-request
                     serving tables)          cache
vllm                 serving                  vLLM-CPU server, prefix caching on
llamacpp             serving                  llama-cpp-python server
llamaserver          serving                  llama.cpp's llama-server, GGUF file itself
==================== ======================== =========================================
"""
from __future__ import annotations

from prefixcache.bench.peers.base import Peer, PeerContext, PeerRun, PeerUnavailable

PEER_NAMES = ("prefixcache", "prefixcache-nocache", "transformers", "vllm", "llamacpp",
              "llamaserver")
PEER_MODES = {"prefixcache": ("offline", "serving"), "prefixcache-nocache": ("offline", "serving"),
              "transformers": ("offline",), "vllm": ("serving",), "llamacpp": ("serving",),
              "llamaserver": ("serving",)}


def make_peer(name: str, mode: str) -> Peer:
    """The peer ``name`` in ``mode``. transformers has no server: asked for serving mode it
    runs offline (its results say so). Raises PeerUnavailable for a mode the peer lacks."""
    if name not in PEER_MODES:
        raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEER_NAMES)}")
    if name == "transformers":
        from prefixcache.bench.peers.transformers_peer import TransformersPeer
        return TransformersPeer()
    if mode not in PEER_MODES[name]:
        raise PeerUnavailable(f"{name}: runs in {'/'.join(PEER_MODES[name])} mode only, "
                              f"skipped in {mode} mode")
    if name in ("prefixcache", "prefixcache-nocache") and mode == "offline":
        from prefixcache.bench.peers.ours_offline import OursOffline
        return OursOffline(prefix_caching=name == "prefixcache")
    if name in ("prefixcache", "prefixcache-nocache"):
        from prefixcache.bench.peers.ours_server import OursServer
        return OursServer(prefix_caching=name == "prefixcache")
    if name == "vllm":
        from prefixcache.bench.peers.vllm_peer import VLLMPeer
        return VLLMPeer()
    if name == "llamaserver":
        from prefixcache.bench.peers.llamaserver_peer import LlamaServerPeer
        return LlamaServerPeer()
    from prefixcache.bench.peers.llamacpp_peer import LlamaCppPeer
    return LlamaCppPeer()


__all__ = ["PEER_NAMES", "PEER_MODES", "Peer", "PeerContext", "PeerRun", "PeerUnavailable",
           "make_peer"]
