# Two entry points, both starting from nothing: `make demo` and `make test`.
# The virtual environment pins torch to the CPU wheel these machines carry (a bare `torch`
# would pull a multi-GB CUDA build); Graphviz's `dot` comes from Debian where we can install it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: setup demo test clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

demo: setup
	$(BIN)/crate-compose build crate-base

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out .pytest_cache
