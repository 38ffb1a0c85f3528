"""Every family whose checkpoints import and export read: the papers' authors' code bases
(:mod:`.families`) and the baselines' own releases (:mod:`.peers`). Read before torch is imported."""

from __future__ import annotations

from .families import AUTHORS
from .peers import PEERS

FAMILIES = {f.name: f for f in (*AUTHORS, *PEERS)}
