# Fermium: the two commands a fresh machine needs.
#   make demo  - set up, bring the stack up on the bundled demo model, stream a chat turn with a tool call
#   make test  - set up and run the test suite
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
BASE    = $(VENV)/.installed
TESTING = $(VENV)/.installed-test

.PHONY: demo test setup clean

# the package and its native kernels (compiled by pip through cffi)
$(BASE): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(BASE)

# the tests' extras: PyTorch 2.13.0 for the CPU and transformers as the reference, and the
# system tools that the deployment tests run (systemd-analyze, promtool, prometheus)
$(TESTING): $(BASE)
	bash tools/ci_system_deps.sh
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(TESTING)

setup: $(TESTING)

demo: $(BASE)
	$(VENV)/bin/fermium demo

test: $(TESTING)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -rs tests

clean:
	rm -rf $(VENV) build *.egg-info
