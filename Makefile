# The two commands of the README: `make demo` and `make test`.
# Each (re)creates .venv with pip when it is missing or pyproject.toml changed.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[dev,cluster]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python pipelines/train.py

test: $(STAMP)
	$(VENV)/bin/python -m ruff check csclip pipelines tune tests benchmarks research
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/python -m ruff check csclip pipelines tune tests benchmarks research

clean:
	rm -rf $(VENV) mlflow.db runs
