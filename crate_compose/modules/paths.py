"""One switch for the modules' fast paths: each step computes its formula fast, or as written.

Several steps compute their equation in fewer passes than it is written in (issue 20):

* ISTA (003 eq. 17), ``ReLU(u + eta (u - u D^T) D - eta lambda)``, as one ``addmm`` against
  ``M = I + eta (D - D^T D)`` for at least ``d`` tokens, else two ``addmm`` (:func:`.sparsify.ista_step`);
  the MM step and CRATE-alpha's two ODL steps with their scales and biases folded into ``addmm``;
* softmax attention, ``softmax(q k^T * scale [+ mask]) v`` (MSSA, MHSA, AoT, class attention, causal
  decoding), through ``F.scaled_dot_product_attention`` or, for bfloat16 on the CPU, three products
  with PyTorch's bfloat16 softmax (:func:`.causal.softmax_attention`);
* a half-precision LayerNorm without gradients on the CPU, through PyTorch's mixed-precision kernel
  (:class:`.precision.LayerNorm`).

Each computes the same formula; they differ by rounding (``tests/test_speed_paths.py``,
``docs/precision.md``). With the formulas **as written** every such step computes its equation in
plain torch ops, in the order it is written: ISTA's two products and its threshold, the MM and ODL
steps' products and ReLUs, attention's scores, their softmax (in float32 for half inputs, as
:mod:`.precision` computes it) and its product with the values, and a half LayerNorm through its
float32 copy. What is not a fast path stays as it is (the projections, TSSA, the MLP).

The switch is read every time a step runs, so a model built before it was set follows it:
``fast`` (the default), or ``written`` from ``$CRATE_COMPOSE_FORMULAS``, :func:`set_formulas`, or for a
block of code :func:`formulas_as_written` / :func:`use_formulas`. It is one value for the process
(not per thread). Under ``torch.compile`` the value is part of what a compiled graph assumes: a
compiled model recompiles when it changes. ``train --formulas`` makes it one of a run's settings
(``Settings.formulas``): the run holds the switch there while it trains and evaluates.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from ..errors import WorkbenchError
from ..settings import FORMULAS, formulas_from_environment

_FAST = formulas_from_environment() == "fast"  # read once, at import; set_formulas changes it


def fast() -> bool:
    """Whether the steps take their fast paths (False: every formula as written)."""
    return _FAST


def formulas() -> str:
    """``"fast"`` or ``"written"``: what the steps compute now."""
    return "fast" if _FAST else "written"


def set_formulas(name: str) -> None:
    """Take the fast paths (``"fast"``) or compute every formula as written (``"written"``) from now on."""
    global _FAST
    if name not in FORMULAS:
        raise WorkbenchError(f"formulas {name!r} is not one of: {', '.join(FORMULAS)}")
    _FAST = name == "fast"


@contextlib.contextmanager
def use_formulas(name: str) -> Iterator[None]:
    """Within the block, the formulas ``name`` (``"fast"`` or ``"written"``); the previous choice after it."""
    before = formulas()
    set_formulas(name)
    try:
        yield
    finally:
        set_formulas(before)


def formulas_as_written() -> contextlib.AbstractContextManager[None]:
    """Within the block, every step computes its equation as written (no fast path)::

    with crate_compose.formulas_as_written():
        logits = model(images)["output"]
    """
    return use_formulas("written")
