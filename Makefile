# Quick start: `make train` runs the main job, `make test` runs the test suite.
# Both create .venv and install the pinned requirements on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= configs/default.py

.PHONY: train test test-quick bench clean-venv

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

# The daily tier for core changes (about a minute on 2 cores once JAX's compilation cache is warm): rewards,
# methods, rollout -> train batch, the learner on tiny models, configs, evaluator schema and protocol, static
# checks, import layers, the README. `make test` runs the full suite.
QUICK_TESTS := tests/test_rewards.py tests/test_rewards_reference.py tests/test_rollout_methods.py \
	tests/test_rollout_harness.py tests/test_learner.py tests/test_configs.py tests/test_schema.py \
	tests/test_protocol.py tests/test_static_check.py tests/test_cuda_static.py tests/test_layers.py \
	tests/test_hooks.py tests/test_readme.py tests/test_learner_shared_prefix.py

test-quick: $(STAMP)
	$(PY) -m pytest -q --durations=10 $(QUICK_TESTS)

bench: $(STAMP)
	$(PY) bench/rewards.py

clean-venv:
	rm -rf $(VENV)
