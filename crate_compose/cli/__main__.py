"""``python -m crate_compose.cli``: the ``crate-compose`` command (torchrun ... -m crate_compose.cli too)."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
