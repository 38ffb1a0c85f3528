"""Every family whose checkpoints ``import`` and ``export`` read, registered where it is declared
(:func:`family`, the one call a plug-in uses too): the papers' authors' code bases (:mod:`.authors`) and the
baselines' own releases (:mod:`.peers`), imported when the catalog is first read
(:class:`crate_compose.registering.Registry`). Read before torch is imported."""

from __future__ import annotations

import dataclasses
import sys

from ..registering import Registry
from .families import Family

__all__ = ["FAMILIES", "family"]

BUILTIN = (f"{__package__}.authors", f"{__package__}.peers")
FAMILIES: Registry[Family] = Registry("checkpoint family", BUILTIN, lambda held: f"{held.declared_in}.{held.name}")


def family(one: Family) -> Family:
    """Register the family ``one`` under its name, as declared by the calling module; returns it."""
    if not one.declared_in:
        one = dataclasses.replace(one, declared_in=sys._getframe(1).f_globals.get("__name__", "?"))
    return FAMILIES.add(one.name, one)
