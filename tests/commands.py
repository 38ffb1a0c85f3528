"""How tests start Python and the ``crate-compose`` command line in processes of their own.

The console script beside the interpreter running the tests (``.venv/bin/crate-compose`` after ``make
setup``); where there is none (a GPU machine's own Python, the package importable from the checkout
through ``PYTHONPATH`` but not installed), ``python -m crate_compose.cli``, which runs the same ``main``.
"""

from __future__ import annotations

import sys
from pathlib import Path

PYTHON = Path(sys.executable)
CONSOLE = PYTHON.with_name("crate-compose")
CLI = [str(CONSOLE)] if CONSOLE.exists() else [str(PYTHON), "-m", "crate_compose.cli"]
