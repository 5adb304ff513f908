"""llama.cpp through llama-cpp-python's OpenAI-compatible server.

Installed by ``make peers`` into ``.peers/llamacpp`` (built from the sdist, unpacked in
``.peers/src``). The benchmark model is converted once to GGUF with the converter shipped
in that sdist (``vendor/llama.cpp/convert_hf_to_gguf.py`` with its ``conversion/`` and
``gguf-py/`` folders), at the run's dtype (f32 or bf16), under ``<work_dir>/gguf``.
The converter runs in the peer's venv, whose transformers (4.x) does not know the
tokenizer class name transformers 5 writes (``TokenizersBackend``): it reads a staging
directory of links to the model's files whose ``tokenizer_config.json`` names the 4.x
equivalent, ``PreTrainedTokenizerFast`` (the same ``tokenizer.json``).

The server holds one model behind a lock (no concurrency across requests; started with
``--interrupt_requests false`` so a new request waits instead of cutting off the one
being streamed) and keeps one sequence of KV: a request reuses the longest common prefix
with the previous request's tokens. It reports no ``cached_tokens``; the bench reads the
total reuse from its log
lines ``Llama.generate: N prefix-match hit`` and reports it as the run's cached tokens.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

from prefixcache.bench.peers.base import PeerContext, PeerRun, PeerUnavailable
from prefixcache.bench.peers.server import SERVED_NAME, ServerPeer, venv_python

INSTALL_HINT = "Install it with `make peers` (scripts/install_peers.sh)."
PREFIX_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit")
OUTTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def converter_script(ctx: PeerContext) -> Path:
    found = sorted(ctx.peers_dir.glob(
        "src/llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    if not found:
        raise PeerUnavailable("llamacpp: the GGUF converter is missing under "
                              f"{ctx.peers_dir / 'src'}. {INSTALL_HINT}")
    script = found[-1]
    for need in ("conversion", "gguf-py"):
        if not (script.parent / need).is_dir():
            raise PeerUnavailable(f"llamacpp: {script.parent / need} is missing "
                                  f"(the converter needs it). {INSTALL_HINT}")
    return script


def gguf_path(ctx: PeerContext) -> Path:
    model_dir = ctx.model_dir
    assert model_dir is not None, "LlamaCppPeer.check requires a model directory"
    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.json")) + sorted(model_dir.glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    name = f"{model_dir.name}-{h.hexdigest()[:12]}-{OUTTYPE[ctx.dtype]}.gguf"
    return ctx.work_dir / "gguf" / name


OLD_TOKENIZER_CLASS = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def staging_dir(model_dir: Path, into: Path) -> Path:
    """``into``: links to every file of ``model_dir``, with ``tokenizer_config.json``
    copied and its ``tokenizer_class`` renamed for transformers 4.x (the converter's)."""
    into.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        dst = into / f.name
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        if f.name == "tokenizer_config.json":
            cfg = json.loads(f.read_text())
            cls = cfg.get("tokenizer_class")
            cfg["tokenizer_class"] = OLD_TOKENIZER_CLASS.get(cls, cls)
            dst.write_text(json.dumps(cfg, indent=2))
        else:
            dst.symlink_to(f.resolve())
    return into


def convert_to_gguf(ctx: PeerContext, log: Path | None = None) -> Path:
    """Convert ``ctx.model_dir`` to GGUF once (cached by content stamp)."""
    out = gguf_path(ctx)
    if out.is_file():
        return out
    py = venv_python(ctx, "llamacpp", INSTALL_HINT)
    script = converter_script(ctx)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    assert ctx.model_dir is not None
    src = staging_dir(ctx.model_dir, out.parent / (out.stem + ".src"))
    argv = [str(py), str(script), str(src), "--outfile", str(tmp),
            "--outtype", OUTTYPE[ctx.dtype]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("$ " + " ".join(argv) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0 or not tmp.is_file():
        raise PeerUnavailable(f"llamacpp: GGUF conversion failed (exit {proc.returncode}):\n"
                              + "\n".join((proc.stderr or proc.stdout).splitlines()[-12:]))
    tmp.rename(out)
    return out


class LlamaCppPeer(ServerPeer):
    name = "llamacpp"
    description = "llama.cpp via llama-cpp-python's OpenAI server (one sequence, serial)"
    start_timeout_s = 300.0

    def check(self, ctx: PeerContext) -> None:
        venv_python(ctx, "llamacpp", INSTALL_HINT)
        if ctx.dtype not in OUTTYPE:
            raise PeerUnavailable(f"llamacpp: no GGUF type for dtype {ctx.dtype}")
        if ctx.model_dir is None:
            raise PeerUnavailable("llamacpp: needs a Hugging Face model directory to convert, "
                                  f"not {ctx.model!r}")
        converter_script(ctx)

    def prepare(self, ctx: PeerContext) -> None:
        self.gguf = convert_to_gguf(ctx, ctx.work_dir / "logs" / "llamacpp-convert.log")

    def command(self, ctx: PeerContext, port: int) -> tuple[list[str], dict[str, str]]:
        py = venv_python(ctx, "llamacpp", INSTALL_HINT)
        argv = [str(py), "-m", "llama_cpp.server", "--model", str(self.gguf),
                "--model_alias", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
                "--n_threads", str(ctx.threads), "--n_threads_batch", str(ctx.threads),
                "--n_ctx", str(ctx.max_model_len), "--verbose", "true",
                # by default a new request interrupts the one being streamed: with a client at
                # concurrency C > 1 every answer would stop after its first token
                "--interrupt_requests", "false"]
        return argv, {"OMP_NUM_THREADS": str(ctx.threads)}

    def extra_body(self, req, salt: str) -> dict:
        # no ignore_eos here; its `min_tokens` suppresses EOS until then, so outputs are as
        # long as the other peers'
        return {"min_tokens": req.max_tokens}

    def run(self, workload, reqs, prompts, **kw) -> PeerRun:
        server = self.server
        start = server.log_path.stat().st_size if server else 0
        run = super().run(workload, reqs, prompts, **kw)
        if server is None:  # not reached: the run above raises without a server
            return run
        try:
            with open(server.log_path, "rb") as f:
                f.seek(start)
                text = f.read().decode(errors="replace")
            reused = sum(int(m) for m in PREFIX_HIT.findall(text))
            prompt = sum(r.prompt_tokens for r in run.results if r.error is None)
            run.prefill_tokens_computed = prompt - reused
            run.cached_tokens_total = reused
            run.cache_stats["prefix_match_tokens_from_log"] = reused
        except OSError:
            pass
        return run

    def detail(self) -> dict:
        d = super().detail()
        d.update(gguf=str(getattr(self, "gguf", "")),
                 gguf_type=OUTTYPE.get(self.ctx.dtype) if self.ctx else None,
                 concurrency="serial (one model behind a lock)",
                 kv_cache="single sequence, f16 (llama.cpp default)")
        if self.ctx is None:
            return d
        try:
            py = venv_python(self.ctx, "llamacpp", INSTALL_HINT)
            out = subprocess.run([str(py), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                                 capture_output=True, text=True, timeout=60)
            d["llama_cpp_python"] = out.stdout.strip() or None
        except Exception:  # noqa: BLE001 - details are best effort
            pass
        return d
