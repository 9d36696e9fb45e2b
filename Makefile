# dtrain developer commands. Each target installs what it needs into .venv by itself.
# The CPU torch wheel is pinned here for dev/CI; pyproject keeps a range for GPU users.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.installed
PEERS_VENV := bench/.venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help install run test test-fast lint format bench bench-peers-env clean

help:  ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e ".[dev,hf,plots]"
	touch $(STAMP)

install: $(STAMP)  ## Create .venv and install dtrain (editable) with the CPU torch wheel

run: $(STAMP)  ## Train the built-in default: gpt_small, 2 processes, on Python's stdlib sources
	$(VENV)/bin/dtrain launch recipe=gpt_small dp=2

# The unit room is pure CPU work in one process per test: pytest-xdist spreads it over the
# cores. The launch room too, a test file per worker (its shared launches stay in one
# worker), except the tests of the one local SLURM cluster (marked serial): one at a time,
# beside the rest from the start (installing and starting SLURM, and its jobs waiting for
# the scheduler, leave the cores to the other rooms); their output is printed at the end.
UNIT_JOBS ?= 2
LAUNCH_JOBS ?= 2
SERIAL_LOG ?= $(or $(TMPDIR),/tmp)/dtrain-serial-tests.log

test: $(STAMP)  ## Run the whole test suite (CPU, gloo): tests/unit, then tests/launch
	@status=0; \
	$(PY) -m pytest -q -m serial tests/launch $(PYTEST_ARGS) > $(SERIAL_LOG) 2>&1 & serial=$$!; \
	$(PY) -m pytest -q -n $(UNIT_JOBS) tests/unit $(PYTEST_ARGS) || status=$$?; \
	$(PY) -m pytest -q -n $(LAUNCH_JOBS) --dist loadfile -m "not serial" tests/launch \
		$(PYTEST_ARGS) || status=$$?; \
	wait $$serial || status=$$?; \
	echo "--- the SLURM tests (-m serial), run beside the others:"; cat $(SERIAL_LOG); \
	exit $$status

test-fast: $(STAMP)  ## Run the unit room (tests/unit: no process started): after every change
	$(PY) -m pytest -q -n $(UNIT_JOBS) tests/unit $(PYTEST_ARGS)

lint: $(STAMP)  ## ruff format check + lint
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

format: $(STAMP)  ## Apply ruff formatting and autofixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP) $(PEERS_STAMP)  ## Run the benchmarks; results go to bench/RESULTS.md
	$(PY) bench/run.py

# Lightning and accelerate for the peer comparison (bench/peers.py): their own venv, never
# dtrain dependencies; the same pinned CPU torch.
$(PEERS_STAMP): bench/peers-requirements.txt pyproject.toml
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q $(TORCH_PIN)
	$(PEERS_VENV)/bin/python -m pip install -q -r bench/peers-requirements.txt -e .
	touch $(PEERS_STAMP)

bench-peers-env: $(PEERS_STAMP)  ## The peers' environment for make bench (Lightning, accelerate)

clean:  ## Remove .venv, runs and caches
	rm -rf $(VENV) $(PEERS_VENV) runs .pytest_cache .ruff_cache dist build
