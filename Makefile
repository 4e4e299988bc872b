# Quick start: `make train` runs the main job, `make test` runs the test suite.
# Both create .venv and install the pinned requirements on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= configs/default.py

.PHONY: train test bench clean-venv

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

train: $(STAMP)
	$(PY) launch/train.py --config $(CONFIG)

test: $(STAMP)
	$(PY) -m pytest -q --durations=25 tests

bench: $(STAMP)
	$(PY) bench/rewards.py

clean-venv:
	rm -rf $(VENV)
