# Fermium: the two commands a fresh machine needs.
#   make demo  - set up, bring the stack up on the bundled demo model, stream one chat answer
#   make test  - set up and run the test suite
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: demo test setup clean

$(STAMP): pyproject.toml setup.py
	bash tools/ci_system_deps.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fermium demo

test: $(STAMP)
	$(PY) -m pytest -q -rs tests

clean:
	rm -rf $(VENV) build *.egg-info
