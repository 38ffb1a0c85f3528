"""From YAML files and ``--set`` overrides to a validated :class:`~crate_compose.spec_language.spec.Spec`.

The pipeline, each stage collecting problems rather than stopping at the first:

1. read YAML keeping the file:line:column of every key (:mod:`.source`);
2. follow ``extends:`` (a path relative to the file, or a zoo preset) and merge: mappings merge
   key by key, lists and scalars replace, and a mapping keyed by step names patches those steps
   of a list of steps (``layer: {sparsify: {primitive: ista_soft}}``) (:mod:`.extends`);
3. apply ``--set path=value`` overrides (``encoder.layer.0.args.heads=8``,
   ``encoder.layer[sparsify].primitive=ista_soft``) (:mod:`.overrides`); a spec changed this way
   (or by an ``extends`` child that changes the architecture) is a *variant*: it gets a name of
   its own and loses a ``reference`` count that no longer applies (:mod:`.naming`);
4. substitute ``${size}`` references from ``sizes`` (:mod:`.substitution`);
5. validate against the pydantic models and each step's primitive argument model (:mod:`.validation`);
6. fill in every default, so the resolved spec is explicit and reproducible.

Any problem raises :class:`~crate_compose.errors.SpecError` listing all of them. :func:`dump`
writes a resolved spec back as YAML (:mod:`.dumping`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Iterable

import yaml

from ..errors import Problem
from .dumping import spec_data
from .extends import load_source
from .naming import mark_variant_by_overrides
from .overrides import apply_overrides
from .source import Source
from .spec import Spec
from .substitution import substitute, substitute_swap
from .validation import validate


def read(ref: str | Path | dict | Source) -> Source:
    """Stages 1-2: a spec file or zoo preset read, with everything it ``extends``, merged (each file opened
    once, here); a dict is taken as parsed; a :class:`Source` already read is given back as it is.

    A command reads its spec once and hands the reading down (``load(source, overrides)`` opens no
    file), so every variant of a long ablation grid is built from the same text even if the file is
    edited meanwhile."""
    if isinstance(ref, Source):
        return ref
    if isinstance(ref, dict):
        return Source(copy.deepcopy(ref))
    return load_source(ref)


def load(ref: str | Path | dict | Source, overrides: Iterable[str] = ()) -> Spec:
    """Load a spec (file path, zoo preset name, an already-parsed dict, or a :class:`Source` from
    :func:`read`, which is not changed) with overrides.

    Overrides that change the network (anything but ``name``, ``description``, ``reference``)
    make a variant: unless they also set them, its name gets a suffix saying what changed
    (``crate-tiny.sparsify-ista_soft``: its own default output folder) and the baseline's
    ``reference`` count is dropped, so a variant never claims the paper's count.
    """
    overrides = list(overrides)
    source = copy.deepcopy(ref) if isinstance(ref, Source) else read(ref)
    apply_overrides(source, overrides)
    mark_variant_by_overrides(source, overrides)
    return resolve(source)


def resolve(source: Source) -> Spec:
    """Stages 4-6: references, validation, defaults. Raises SpecError with every problem."""
    references: list[Problem] = []
    data = substitute(source, references)
    spec = validate(data, source, references)
    spec._locations = dict(source.marks)
    spec._references = dict(source.via)
    spec._swaps = {path: substitute_swap(swap, spec.sizes) for path, swap in source.swaps.items()}
    spec._notes = list(source.notes)
    return spec


def dump(spec: Spec, *, references: bool = False) -> str:
    """The resolved spec as YAML: no extends, every default written out.

    ``references=False``: every ``${size}`` substituted (a build's ``spec.yaml``, reproducible
    alone). ``references=True``: values written as a whole ``${size}`` reference keep it, and so
    do the steps derived from them (``crate-compose derive``), so ``--set sizes.d=...`` still
    changes the whole network.
    """
    return yaml.safe_dump(spec_data(spec, references=references), sort_keys=False, default_flow_style=None, width=100)
