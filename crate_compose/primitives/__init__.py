"""Built-in primitives; importing this package registers them (see :mod:`crate_compose.registry`).

One module per family of steps: ``embed`` (pre-processing), ``compress`` (gradient steps on the
coding rate), ``sparsify`` (proximal steps on a LASSO), ``norm``, ``head``.
"""

from . import compress, embed, head, norm, sparsify  # noqa: F401
