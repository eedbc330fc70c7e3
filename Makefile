# Set-up commands (see README): `make demo`, `make test`. Both work on a fresh
# machine: they create .venv, install torch==2.13.0 and the project's
# dependencies, and build the extension (CMake + ninja + ccache).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.deps-stamp
SYS_STAMP := $(VENV)/.sysdeps-stamp
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export CCACHE_DIR ?= $(HOME)/.cache/ccache
# Relative paths in ccache's hash: a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1
PYTEST_ARGS ?= -q

.PHONY: all build demo test test-large ecosystem test-runtime test-python test-conformance test-conformance-adaptive conformance hf-sweep fuzz soak sanitize bench bench-quick clean

all: build

$(PYTHON):
	$(PY) -m venv $(VENV)

# Debian packages the build and tests use: googletest (runtime suite), ccache,
# and tmux (neuron-top is tested in a terminal, as a user runs it).
$(SYS_STAMP): | $(PYTHON)
	@if [ ! -f /usr/include/gtest/gtest.h ] || ! command -v ccache >/dev/null || ! command -v tmux >/dev/null; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev ccache tmux >/dev/null; \
	  else echo "please install libgtest-dev, ccache and tmux (Debian packages)"; exit 1; fi; \
	fi
	touch $@

$(DEPS_STAMP): pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install -q --upgrade pip setuptools wheel
	$(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q cmake ninja pytest numpy ml_dtypes safetensors expecttest "torch==2.13.0"
	# Hugging Face stack, pinned as in pyproject's [hf] extra; torch pinned in the same resolve.
	$(PYTHON) -m pip install -q "transformers==5.24.0" "accelerate==1.15.0" "peft==0.21.2" "trl==1.16.0" \
	  "diffusers==0.42.1" "torch==2.13.0"
	# TorchAO and TorchTitan, pinned as in pyproject's [ao] and [titan] extras. TorchTitan imports
	# triton at start-up (its MoE kernels); triton's wheel imports without a GPU.
	$(PYTHON) -m pip install -q "torchao==0.18.0" "torchtitan==0.2.2" "triton==3.9.0" "torch==2.13.0"
	# vLLM: its metadata requires CUDA packages and torchvision/torchaudio, so the wheel goes in
	# without dependencies and pyproject's [vllm] extra lists the ones its engine imports.
	$(PYTHON) -m pip install -q --no-deps "vllm==0.32.0"
	$(PYTHON) -m pip install -q "torch==2.13.0" "transformers==5.24.0" $$($(PYTHON) -c \
	  "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['vllm']))")
	touch $@

build: $(DEPS_STAMP) $(SYS_STAMP)
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	@# import neuronxcc.nki before torch: the NKI aliases load at interpreter start (_torch_neuronx_nki_boot.py)
	$(PYTHON) -c "import sysconfig; open(sysconfig.get_paths()['purelib'] + '/torch_neuronx_nki.pth', 'w').write('import _torch_neuronx_nki_boot\\n')"

demo: build
	$(PYTHON) examples/train.py

test-runtime: $(SYS_STAMP) $(DEPS_STAMP)
	cmake -S . -B build-rt -G Ninja -DNEURONX_RUNTIME_ONLY=ON >/dev/null
	cmake --build build-rt -j2
	ctest --test-dir build-rt --output-on-failure -j2

# pytest exits 5 when it collected no tests: that is a failure here.
test-python: build
	@$(PYTHON) -m pytest tests --ignore=tests/large $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# The CI subset of the conformance sweep (~2 min on 2 cores): fails on any case
# of the committed baseline (torch_neuronx/conformance/quick_baseline.txt) that no
# longer passes, and on any worker crash.
test-conformance: build
	$(PYTHON) -m torch_neuronx.conformance --quick --jobs 2 --out build/conformance-quick

# The same sweep with adaptive eager on (docs/adaptive_eager.md): the same baseline must pass.
test-conformance-adaptive: build
	TORCH_NEURONX_EXECUTION_MODE=adaptive $(PYTHON) -m torch_neuronx.conformance --quick --jobs 2 --out build/conformance-quick-adaptive

test: test-runtime test-python test-conformance test-conformance-adaptive

# Models at the size users run them (GPT-2 small trained with the Trainer, eager and
# compiled; a 1.1B Llama generating): minutes on 2 cores, so not part of make test.
test-large: build
	@$(PYTHON) -m pytest tests/large $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# The stacks' longer runs (make test runs them at 4 steps): TorchTitan's comparisons with CPU/Gloo
# over 20 steps, TorchAO's tests, vLLM's tests with pipeline parallel and vllm serve, the TorchAO side-by-side
# table (docs/torchao.md) and vLLM's serving throughput on a 155M-parameter Llama (docs/vllm.md). ~14 min.
ecosystem: build
	@TORCHTITAN_STEPS=20 VLLM_TESTS_FULL=1 $(PYTHON) -m pytest tests/test_torchtitan.py tests/test_torchao.py \
	  tests/test_vllm.py $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; [ $$rc -eq 0 ] || exit $$rc
	$(PYTHON) bench/quantization.py
	$(PYTHON) bench/serving.py

# The full sweep (~12 min on 2 cores): regenerates docs/op_support.md.
conformance: build
	$(PYTHON) -m torch_neuronx.conformance --jobs 2 --out build/conformance --docs docs/op_support.md

# The Hugging Face architecture sweep (~1 min on 2 cores): regenerates docs/hf_support.md.
hf-sweep: build
	$(PYTHON) -m torch_neuronx.hf_sweep --jobs 2 --out build/hf-sweep --docs docs/hf_support.md

# The fuzzers' long runs (make test runs 4,000 op cases and 12 graphs of seed 0): per seed in SEEDS,
# 20,000 op cases (CPU vs neuron), 100 compiled graphs (vs CPU eager) and 2,000 collectives across
# 3 ranks (vs values computed from every rank's input); a failure prints its
# seed and index (--start reruns it).
SEEDS ?= 1 2 3 4 5
fuzz: build
	@for s in $(SEEDS); do $(PYTHON) tests/reliability/fuzz_ops.py --cases 20000 --seed $$s || exit 1; \
	  $(PYTHON) tests/reliability/fuzz_compile.py --graphs 100 --seed $$s || exit 1; \
	  $(PYTHON) tests/reliability/fuzz_collectives.py --world 3 --cases 2000 --seed $$s || exit 1; done

# Soak (tests/reliability/soak.py; make test runs a few hundred steps of each): nanoGPT training
# for 10,000 steps eager and compiled and 2,000 under 2-rank DDP, with device memory, RSS,
# descriptors and threads flat after warm-up and losses equal to a CPU reference; then 2 ranks x
# 8 threads training and reducing at once for 3 minutes (stress_threads.py). ~15 min on 2 cores.
SOAK_STEPS ?= 10000
SOAK_DDP_STEPS ?= 2000
soak: build
	@mkdir -p build/soak
	$(PYTHON) tests/reliability/soak.py --mode eager --steps $(SOAK_STEPS) --out build/soak/eager.json
	$(PYTHON) tests/reliability/soak.py --mode compiled --steps $(SOAK_STEPS) --out build/soak/compiled.json
	$(PYTHON) tests/reliability/soak.py --mode ddp --steps $(SOAK_DDP_STEPS) --out build/soak/ddp.json
	$(PYTHON) tests/reliability/stress_threads.py --seconds 180 --out build/soak/stress.json

# Sanitizers (docs/reliability.md): the runtime gtests under ThreadSanitizer and under
# AddressSanitizer + UBSan, then the extension built with ASan + UBSan running the fast
# pytest subset (SANITIZE_TESTS) with libasan preloaded into the Python interpreter.
SANITIZE_TESTS ?= tests/test_streams_events.py tests/test_memory.py tests/test_stream_ordered_reuse.py \
  tests/test_threads.py tests/test_copy.py tests/test_ops.py tests/test_autograd.py tests/test_errors.py
sanitize: $(SYS_STAMP) $(DEPS_STAMP)
	cmake -S . -B build-tsan -G Ninja -DNEURONX_RUNTIME_ONLY=ON -DNEURONX_SANITIZE=thread >/dev/null
	cmake --build build-tsan -j2
	TSAN_OPTIONS=second_deadlock_stack=1 ctest --test-dir build-tsan --output-on-failure -j2
	cmake -S . -B build-asan -G Ninja -DNEURONX_RUNTIME_ONLY=ON -DNEURONX_SANITIZE=address,undefined >/dev/null
	cmake --build build-asan -j2
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan --output-on-failure -j2
	$(PYTHON) tests/reliability/sanitize_extension.py --build-dir build-asan-ext $(SANITIZE_TESTS)

# Full benchmark (~10 min on 2 cores): regenerates docs/performance.md.
bench: build
	$(PYTHON) -m pip install -q matplotlib
	$(PYTHON) bench/run.py --out bench/results/$$(date -u +%F).json
	$(PYTHON) bench/report.py bench/results/$$(date -u +%F).json
	$(PYTHON) bench/collectives.py --gloo-path --control --docs
	$(PYTHON) bench/compile.py --docs
	$(PYTHON) bench/flex_attention.py --docs

# Smoke test of the harness (tiny sizes, no thresholds); the report goes to a temp dir.
bench-quick: build
	$(PYTHON) -m pip install -q matplotlib
	$(PYTHON) bench/run.py --quick --out $$(mktemp -d)/quick.json | tee /tmp/neuronx-bench-quick.log
	$(PYTHON) bench/report.py $$(tail -1 /tmp/neuronx-bench-quick.log | sed 's/^wrote //') --out-dir $$(mktemp -d)
	$(PYTHON) bench/collectives.py --quick --out $$(mktemp -d)/collectives.json
	$(PYTHON) bench/compile.py --quick
	$(PYTHON) bench/flex_attention.py --quick

clean:
	rm -rf build build-rt torch_neuronx/_C*.so *.egg-info
