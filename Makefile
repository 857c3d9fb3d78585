# The Makefile is the interface: every target works on a fresh clone and says what it does.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LAB ?=
LAB_IMPL ?= starter
OUT ?=
BENCH_ARGS ?=
# `make test PY=python3` (or bench, grade, ...) uses an existing Python, e.g. one with a CUDA
# build of torch, and installs nothing.
DEPS := $(if $(filter $(VENV)/bin/python,$(PY)),$(STAMP))

.DEFAULT_GOAL := help
.PHONY: help setup test test-slow test-lab grade bench gpu-report lint clean

# The instructor's tree tests the solutions; a student copy (no solution.py) tests the starters.
TEST_IMPL := $(if $(wildcard labs/*/solution.py),solution,starter)

help::
	@echo "make setup           create .venv with the pinned CPU packages (first time: a few minutes)"
	@echo "make test            run the CPU suite ($(TEST_IMPL).py of every lab), without the slow tests"
	@echo "make test-slow       run only the slow tests (end-to-end grading, every kernel compiled for sm_90)"
	@echo "make grade LAB=00    grade your starter.py (LAB_IMPL=starter); omit LAB for all labs"
	@echo "make test-lab LAB=00 run one lab's tests ($(TEST_IMPL).py)"
	@echo "make bench           benchmark the Triton kernels (interpreter mode without CUDA)"
	@echo "make gpu-report      compile the kernels for sm_80/90/100 on the CPU: regs, spills, smem, MMAs"
	@echo "make lint            ruff"

# One stamp per requirements file: a second `make test` installs nothing.
$(STAMP): requirements-cpu.txt
	@test -x $(PY) || { echo ">> creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@echo ">> installing pinned CPU requirements into $(VENV) (torch 2.13.0 CPU, triton 3.9.0)"
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-cpu.txt
	@touch $@

setup: $(STAMP)

test: $(DEPS)
	@echo ">> running the CPU suite (LAB_IMPL=$(TEST_IMPL))"
	LAB_IMPL=$(TEST_IMPL) $(PY) -m pytest -q

# The `slow` tests, which `make test` leaves out (pyproject's addopts: -m "not slow").
test-slow: $(DEPS)
	@echo ">> running the slow tests (LAB_IMPL=$(TEST_IMPL))"
	LAB_IMPL=$(TEST_IMPL) $(PY) -m pytest -q -m slow

test-lab: $(DEPS)
	LAB_IMPL=$(TEST_IMPL) $(PY) -m pytest -q $$(ls -d labs/lab-$(LAB)* | head -n1)

grade: $(DEPS)
	@echo ">> grading LAB_IMPL=$(LAB_IMPL) $(if $(LAB),lab $(LAB),all labs)"
	LAB_IMPL=$(LAB_IMPL) $(PY) -m common.grading $(if $(LAB),--lab $(LAB))

bench: $(DEPS)
	@echo ">> benchmarking the lab kernels"
	$(PY) -m bench --impl $(TEST_IMPL) $(BENCH_ARGS)

gpu-report: $(DEPS)
	@echo ">> compiling the lab kernels for sm_80, sm_90, sm_100 (compiled, not run; cached in build/gpu-report/)"
	$(PY) -m bench.gpu_report
	@echo ">> checking every kernel on sm_90 from the warm cache (the slow test of tests/test_gpu_report.py)"
	$(PY) -m pytest -q -m slow tests/test_gpu_report.py

lint: $(STAMP)
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache

# >>> not in the student copy (`make release` drops this block): instructors' commands
.PHONY: release autograder mutants figures vllm-check

help::
	@echo "For instructors:"
	@echo "make figures         regenerate every README figure from the labs' own code"
	@echo "make release OUT=dir build the student copy (no solutions)"
	@echo "make autograder      build the Gradescope autograder zip"
	@echo "make mutants [LAB=03] every planted mistake under tests/mutants must fail its lab's tests"
	@echo "make vllm-check      conformance of lab-02 against the real vLLM 0.33.0 (own venv)"

release: $(DEPS)
	$(PY) -m common.grading.release --out "$(OUT)" $(if $(FORCE),--force)

autograder: $(DEPS)
	$(PY) -m common.grading.autograder $(if $(OUT),--out "$(OUT)")

mutants: $(DEPS)
	@echo ">> planting each mistake of tests/mutants/ in a scratch copy of the solution"
	$(PY) -m common.grading.mutants $(if $(LAB),--lab $(LAB))

figures: $(DEPS)
	@echo ">> drawing every lab's figures from the lab's own code"
	@set -e; shopt -s nullglob; for f in labs/*/figures.py; do echo "   $$f"; MPLBACKEND=Agg PYTHONPATH=. $(PY) $$f; done

vllm-check: $(STAMP)
	bash tools/vllm_check.sh

# <<< not in the student copy
