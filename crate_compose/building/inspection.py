"""The whole-spec answers of the API: ``validate``, ``derive`` and ``inspect``.

Each reads the spec first and loads the builder (and torch) only after: a wrong path or a YAML
syntax error is reported before torch is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from ..spec_language.loader import load as load_spec
from ..spec_language.spec import Spec
from .derivation import explicit
from .footprints import walk

if TYPE_CHECKING:
    from .summary import Summary


def validate(spec: str | Path | Spec, overrides: Iterable[str] = ()) -> Spec:
    """Load ``spec`` and check that it builds, without weights: through the primitives' footprints
    when every step has one (no torch imported), else by placing the steps on the meta device,
    which also says where and why a spec does not build."""
    resolved = spec if isinstance(spec, Spec) else load_spec(spec, overrides)
    if walk(explicit(resolved)) is None:
        from .builder import compile_spec

        compile_spec(resolved, meta=True)
    return resolved


def derive(spec: str | Path | Spec, overrides: Iterable[str] = ()) -> Spec:
    """``spec`` as an autoencoder: its decoder written out (the inverse of every encoder step).

    The task head and any further stacks are dropped: the derived decoder's output is the
    reconstruction. Values written as ``${size}`` references stay references when dumped with
    ``dump_spec(spec, references=True)``, in the derived steps too.
    """
    resolved = spec if isinstance(spec, Spec) else load_spec(spec, overrides)
    from .derivation import derive_decoder

    changed = resolved.decoder is None or resolved.head or resolved.stacks  # a network other than the spec's
    name = f"{resolved.name}-autoencoder" if changed else resolved.name
    return resolved.model_copy(
        update={"name": name, "decoder": derive_decoder(resolved), "stacks": {}, "head": [], "reference": None}
    )


def inspect(spec: str | Path | Spec, overrides: Iterable[str] = ()) -> Summary:
    """Per-step output shapes and parameter counts, without allocating weights: the march's records
    from the footprints when every step has one, else from the steps placed on the meta device."""
    from .summary import summarize_march

    resolved = spec if isinstance(spec, Spec) else load_spec(spec, overrides)
    full = explicit(resolved)
    records = walk(full)
    if records is None:
        from .placement import place

        records = list(place(full, meta=True))
    return summarize_march(full, records)
