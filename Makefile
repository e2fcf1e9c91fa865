# Every target works on a fresh machine with only Python and make:
# it creates .venv if missing and installs the package with the extras it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: test demo bench bench-gpu docs lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# One stamp per extras set, redone whenever the build inputs change (the editable
# install compiles the optional native kernels in place).
BUILD_INPUTS := pyproject.toml setup.py $(wildcard jaxsparse_rows/_native/*.cc jaxsparse_rows/_native/*.h)

$(VENV)/.stamp-%: $(BUILD_INPUTS) | $(PY)
	$(PIP) install --quiet -e ".[$*]"
	touch $@

$(VENV)/.stamp-base: $(BUILD_INPUTS) | $(PY)
	$(PIP) install --quiet -e .
	touch $@

# Two shards of the suite at once, one per core (CI's machine has two;
# pytest-xdist is not a test dependency): the second shard's output follows
# the first's, and the target fails if either does.
test: $(VENV)/.stamp-test
	@JSR_TEST_SHARD=1/2 $(PY) -m pytest -p no:cacheprovider > .test-shard-1.log 2>&1 & \
	shard1=$$!; \
	echo "--- shard 0/2 ---"; JSR_TEST_SHARD=0/2 $(PY) -m pytest; status0=$$?; \
	wait $$shard1; status1=$$?; \
	echo "--- shard 1/2 ---"; cat .test-shard-1.log; rm -f .test-shard-1.log; \
	exit $$(( status0 || status1 ))

demo: $(VENV)/.stamp-base
	$(PY) examples/sparse_linear_regression.py
	$(PY) examples/adagrad_semantics.py

# torch is pinned first so that pip takes the CPU build (a bare `torch` would pull
# several GB of CUDA wheels); it is never a dependency of the package or the tests.
$(VENV)/.stamp-torch: | $(PY)
	$(PIP) install --quiet torch==2.13.0 || echo "torch unavailable: its contenders will be skipped"
	touch $@

bench: $(VENV)/.stamp-torch $(VENV)/.stamp-bench
	$(PY) benchmarks/run_all.py

# The suite on an NVIDIA GPU: GPU sizes, torch on CUDA, fewer runs. torch is
# taken as found: one already installed (a CUDA build, typically) is never
# replaced with the CPU wheel `bench` pins. Where none is, pip's default torch
# is installed (built with CUDA on Linux x86_64), or the one from
# TORCH_INDEX_URL if set; then the bench extras, and JAX's CUDA plugin at the
# installed jax's version unless JAX already sees a GPU. Without nvidia-smi
# it stops there, with exit status 3.
TORCH_INDEX_URL ?=
$(VENV)/.stamp-gpu: | $(VENV)/.stamp-base
	@command -v nvidia-smi >/dev/null 2>&1 || { echo "bench-gpu: nvidia-smi not found: no NVIDIA GPU here (make bench runs the CPU benchmarks)"; exit 3; }
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet torch $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) || echo "torch unavailable: its contenders will be skipped"
	$(PY) -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null || $(PIP) install --quiet "jax[cuda12]==$$($(PY) -c 'import jax; print(jax.__version__)')"
	touch $@

bench-gpu: $(VENV)/.stamp-gpu $(VENV)/.stamp-bench
	$(PY) benchmarks/run_all.py --gpu --quick

docs: $(VENV)/.stamp-docs
	$(VENV)/bin/mkdocs build --strict

lint: $(VENV)/.stamp-lint
	$(VENV)/bin/ruff check jaxsparse_rows tests examples benchmarks
	$(VENV)/bin/ruff format --check jaxsparse_rows tests examples benchmarks

clean:
	rm -rf $(VENV) site .pytest_cache build jaxsparse_rows/_native/_kernels*.so
