"""The llama-server peer without its binary: the exact command line, the skip messages, the
readiness wait on a stand-in server (503 while loading, then 200), and the start/stop
lifecycle; plus the thread and GGUF settings every serving peer takes from the context."""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from prefixcache.bench import cli, runner
from prefixcache.bench.metrics import process_tree
from prefixcache.bench.peers import PeerContext, PeerUnavailable, make_peer
from prefixcache.bench.peers.llamaserver_peer import LlamaServerPeer, server_argv
from prefixcache.bench.workloads import BenchRequest

# Stands in for llama-server: answers /health with 503 for the first LOADING requests
# (llama-server does so while its model loads), then 200; counts the 503s in a file.
STAND_IN = """#!{python}
import http.server, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
count = {count!r}
hits = [0]

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        loading = self.path == "/health" and hits[0] < {loading}
        if loading:
            hits[0] += 1
            open(count, "w").write(str(hits[0]))
        self.send_response(503 if loading else 200)
        self.end_headers()
        self.wfile.write(b"{{}}")
    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def ctx(tmp_path: Path, **kw) -> PeerContext:
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    kw.setdefault("gguf_file", tmp_path / "m.Q4_1.gguf")
    return PeerContext(model=str(model_dir), model_dir=model_dir, work_dir=tmp_path / "work",
                       peers_dir=tmp_path / "peers", **kw)


def install_stand_in(peers_dir: Path, count_file: Path, loading: int) -> Path:
    binary = peers_dir / "llamaserver" / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text(STAND_IN.format(python=sys.executable, count=str(count_file),
                                      loading=loading))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


def test_command_line_is_the_gguf_file_itself_with_the_runs_threads(tmp_path):
    c = ctx(tmp_path, threads=1)
    binary = install_stand_in(c.peers_dir, tmp_path / "n", 0)
    argv, env = make_peer("llamaserver", "serving").command(c, 8123)
    assert argv == [str(binary), "-m", str(tmp_path / "m.Q4_1.gguf"), "--alias", "bench",
                    "--host", "127.0.0.1", "--port", "8123", "--no-webui",
                    "-t", "1", "-tb", "1"]
    assert env == {"LD_LIBRARY_PATH": str(binary.parent), "OMP_NUM_THREADS": "1"}


def test_threads_zero_leaves_llama_servers_own_default():
    argv = server_argv(Path("/x/llama-server"), Path("/m.gguf"), 9000, 0)
    assert argv == ["/x/llama-server", "-m", "/m.gguf", "--alias", "bench", "--host",
                    "127.0.0.1", "--port", "9000", "--no-webui"]
    assert server_argv(Path("/x/s"), Path("/m.gguf"), 9000, 2)[-4:] == ["-t", "2", "-tb", "2"]


def test_skips_say_why_without_the_binary_or_a_gguf_file(tmp_path):
    peer = make_peer("llamaserver", "serving")
    assert isinstance(peer, LlamaServerPeer)
    with pytest.raises(PeerUnavailable) as exc:
        peer.check(ctx(tmp_path))
    assert str(exc.value) == (
        f"llamaserver: not installed: {tmp_path}/peers/llamaserver/bin/llama-server is "
        "missing. Install it with `make peers` (scripts/install_peers.sh llamaserver).")
    c = ctx(tmp_path, gguf_file=None)
    install_stand_in(c.peers_dir, tmp_path / "n", 0)
    with pytest.raises(PeerUnavailable, match="runs on a GGUF file; model .* does not come"):
        peer.check(c)
    with pytest.raises(PeerUnavailable, match="serving mode only"):
        make_peer("llamaserver", "offline")


def test_start_waits_until_health_answers_200_and_stop_ends_the_server(tmp_path):
    c = ctx(tmp_path, threads=1)
    count = tmp_path / "loading-503s"
    install_stand_in(c.peers_dir, count, loading=3)
    peer = make_peer("llamaserver", "serving")
    peer.check(c)
    try:
        peer.start(c)
        assert count.read_text() == "3"  # it polled through the whole load, then returned
        assert peer.server is not None and peer.server.alive()
        pid = peer.server.pid
        assert pid is not None and peer.rss_after_start is not None
        assert peer.rss_after_start > 0
        assert peer.detail()["rss_after_start_bytes"] == peer.rss_after_start
        assert peer.extra_body(BenchRequest(id="r", session="r", max_tokens=8), "s") == {
            "ignore_eos": True}
    finally:
        peer.stop()
    assert peer.server is None
    assert pid not in process_tree(os.getpid())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_our_server_loads_the_gguf_file_with_the_quantization_and_default_threads(tmp_path):
    peer = make_peer("prefixcache", "serving")
    argv, env = peer.command(ctx(tmp_path, threads=0, quantization="auto"), 8000)
    assert argv[argv.index("--model") + 1] == str(tmp_path / "m.Q4_1.gguf")
    assert argv[argv.index("--quantization") + 1] == "auto"
    assert "--num-threads" not in argv and env == {}
    argv, env = peer.command(ctx(tmp_path, threads=1, gguf_file=None), 8000)
    assert argv[argv.index("--model") + 1] == str(tmp_path / "model")
    assert argv[argv.index("--num-threads") + 1] == "1" and env == {"OMP_NUM_THREADS": "1"}


def test_vllm_threads_zero_keeps_its_own_binding(tmp_path):
    c = ctx(tmp_path, threads=0)
    (c.peers_dir / "vllm" / "bin").mkdir(parents=True)
    (c.peers_dir / "vllm" / "bin" / "python").touch()
    peer = make_peer("vllm", "serving")
    _, env = peer.command(c, 8000)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env and "OMP_NUM_THREADS" not in env
    assert peer.detail()["threads_bind"] == "auto"
    _, env = peer.command(ctx(tmp_path, threads=1), 8000)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0" and env["OMP_NUM_THREADS"] == "1"


def test_source_gguf_names_the_file_a_model_comes_from(tmp_path):
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF")
    assert runner.source_gguf(str(f)) == f.resolve()
    assert runner.source_gguf(str(tmp_path)) == f.resolve()  # a directory holding one
    assert runner.source_gguf("builtin:tiny") is None
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert runner.source_gguf(str(hf)) is None


def test_threads_zero_needs_serving_mode(tmp_path):
    import argparse

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    assert p.parse_args(["--threads", "0"]).threads == 0
    with pytest.raises(SystemExit):
        p.parse_args(["--threads", "-1"])
    with pytest.raises(SystemExit, match="--threads 0 .* needs --mode serving"):
        cli.run(p.parse_args(["--threads", "0", "--mode", "all"]))
