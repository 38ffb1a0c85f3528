"""Importing the authors' checkpoints into built networks, and exporting built networks to their code.

``import_checkpoint(spec, file, family)`` reads ``file`` safely (:mod:`.reading`), optionally sets
the spec's sizes from the checkpoint's shapes (``infer_sizes``), checks every tensor on the meta
device first (a checkpoint that does not fit is refused before any memory is spent, with every
missing, extra and ill-shaped tensor named on both sides), then builds the network and loads the
tensors. ``export_checkpoint(module, family)`` gives the authors' state dict back; ``write_checkpoint``
writes it as their training script would (``torch.save`` of the nested dict) or as safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import torch
from torch import fx

from ..building.builder import compile_spec, spec_of
from ..building.derivation import explicit
from ..building.plan import plan, tied
from ..errors import did_you_mean
from ..files import save_tensors, staged
from ..language import loader
from ..language.spec import Spec
from .families import FAMILIES, Family
from .mapping import Pair, check, correspond, notes_on_arguments, to_ours, to_theirs
from .reading import Checkpoint, InteropError, read_checkpoint

SHOWN = 20  # problems listed before "... and N more"


@dataclass
class Imported:
    """A network with the authors' weights, and what the import did."""

    module: fx.GraphModule
    family: Family
    checkpoint: Checkpoint
    sizes: dict[str, int] = field(default_factory=dict)  # set from the checkpoint (infer_sizes)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # the authors' tensors their forward never reads

    def provenance(self) -> dict[str, str]:
        """What the saved artifact records about its origin (safetensors metadata)."""
        return {"imported_from": str(self.checkpoint.path), "family": self.family.name,
                "checkpoint_sha256": self.checkpoint.sha256}


def family(name: str) -> Family:
    """The family called ``name``; an unknown one is refused with the known ones."""
    if name not in FAMILIES:
        hint = did_you_mean(name, FAMILIES)
        raise InteropError(f"unknown family {name!r}: expected one of {', '.join(FAMILIES)}"
                              + (f" ({hint})" if hint else ""))
    return FAMILIES[name]


def infer_sizes(found: Family, checkpoint: Checkpoint, spec_sizes: dict) -> tuple[dict[str, int], list[str]]:
    """The sizes a checkpoint's shapes give (patch size, width, depth, heads, classes...) that differ
    from the spec's ``sizes``, and notes. Where the shapes cannot tell the heads apart (one shared projection)
    and the width is not a published one, the spec's heads are kept and the head dimension follows."""
    try:
        sizes = {k: v if isinstance(v, bool) else int(v) for k, v in found.sizes(checkpoint.tensors).items()}
    except (KeyError, IndexError, ZeroDivisionError) as error:
        raise InteropError(f"{checkpoint.path}: cannot read the sizes of a {found.name} checkpoint from it "
                              f"({type(error).__name__}: {error}); is it a {found.name} checkpoint?") from None
    notes = []
    inner = sizes.pop("inner", None)
    if inner is not None and isinstance(spec_sizes.get("heads"), int) and inner % spec_sizes["heads"] == 0:
        sizes["head_dim"] = inner // spec_sizes["heads"]
        notes.append(f"the checkpoint's shapes do not give the number of heads: kept the spec's {spec_sizes['heads']} "
                     f"(head dimension {sizes['head_dim']}); --set sizes.heads=K to choose another")
    elif "head_dim" in sizes:  # heads from the published width (families whose heads the shapes give set no head_dim)
        notes.append(f"heads={sizes['heads']}: the published model of width {sizes['d']} (the shapes do not give it)")
    for name in ("image_size", "context"):
        if name in spec_sizes and name not in sizes:
            notes.append(f"a {found.name} checkpoint does not give {name}: kept the spec's {spec_sizes[name]} "
                         f"(--set sizes.{name}=N to choose another)")
    return {k: v for k, v in sizes.items() if k in spec_sizes and spec_sizes[k] != v}, notes  # only what changes


def import_checkpoint(spec_ref, file: str | Path, family_name: str | None = None, *, overrides: Iterable[str] = (),
                      infer: bool = False, dtype: torch.dtype | None = None, seed: int = 0) -> Imported:
    """Build ``spec_ref`` (a path, preset name or Spec) with the weights of the authors' checkpoint ``file``.

    ``family_name``: whose code saved it (default: told by the names of its tensors, :func:`detect`).
    ``infer``: set the spec's sizes from the checkpoint first (``--set`` overrides still win).
    ``dtype``: of the built network (default: float64 for a float64 checkpoint, else float32).
    Raises :class:`InteropError` naming every tensor that does not fit."""
    named = None if family_name is None else family(family_name)  # an unknown name before the file is read
    checkpoint = read_checkpoint(file)
    found = named or detect(checkpoint)
    overrides = list(overrides)
    sizes: dict[str, int] = {}
    notes = list(checkpoint.notes)
    if isinstance(spec_ref, Spec):  # a loaded spec is taken as it is
        if overrides or infer:
            raise TypeError("overrides and infer apply when loading; pass a path or preset name")
        spec = spec_ref
    else:
        if infer:
            sizes, inferred = infer_sizes(found, checkpoint, loader.load(spec_ref, overrides).sizes)
            notes += inferred
            overrides = [*(f"sizes.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sizes.items()),
                         *overrides]
        spec = loader.load(spec_ref, overrides)
    theirs = checkpoint.tensors
    pairs, skipped = fitted(spec, compile_spec(spec, meta=True).state_dict(), checkpoint, found, infer)  # on meta:
    dtype = dtype or (torch.float64 if all(t.dtype == torch.float64 for t in theirs.values() if t.is_floating_point())
                      else torch.float32)  # a misfit is refused before memory is spent
    module = compile_spec(spec, seed=seed, dtype=dtype)
    module.load_state_dict(to_ours(pairs, theirs, dtype), strict=True)
    notes += notes_on_arguments(pairs, found)
    return Imported(module, found, checkpoint, sizes, notes, skipped)


def fitted(spec: Spec, ours: dict[str, torch.Tensor], checkpoint: Checkpoint, found: Family,
           inferred: bool | None = False) -> tuple[list[Pair], list[str]]:
    """The pairs of ``spec``'s tensors (its state dict ``ours``, on meta or not) with the checkpoint's,
    and the checkpoint's tensors left out on purpose; :class:`InteropError` naming every misfit."""
    pairs, problems = correspond(plan(explicit(spec)), ours, found)
    skipped: list[str] = []
    if not problems:
        problems, skipped = check(pairs, ours, checkpoint.tensors, found, tied(spec))
    if problems:
        raise InteropError(_refusal(checkpoint.path, spec.name, found, problems, inferred))
    return pairs, skipped


def load_checkpoint(module: fx.GraphModule, file: str | Path | Checkpoint, family_name: str | None = None) -> list[str]:
    """Load the authors' checkpoint ``file`` (a path, or a :class:`Checkpoint` already read) into a built
    ``module`` (its spec must fit: no sizes are inferred); returns the notes (what was unwrapped, left
    out, computed otherwise)."""
    named = None if family_name is None else family(family_name)
    checkpoint = file if isinstance(file, Checkpoint) else read_checkpoint(file)
    found = named or detect(checkpoint)
    ours = module.state_dict()
    pairs, skipped = fitted(spec_of(module), ours, checkpoint, found, inferred=None)
    dtype = next((t.dtype for t in ours.values() if t.is_floating_point()), torch.float32)
    module.load_state_dict(to_ours(pairs, checkpoint.tensors, dtype), strict=True)
    return [f"{checkpoint.path} read as a {found.name} checkpoint", *checkpoint.notes,
            *(f"not used: {s}" for s in skipped), *notes_on_arguments(pairs, found)]


def detect(checkpoint: Checkpoint) -> Family:
    """The family whose code saved ``checkpoint``, told by a tensor name only that family's code uses."""
    found = [f for f in FAMILIES.values() if f.marker in checkpoint.tensors]
    if len(found) != 1:
        some = ", ".join(list(checkpoint.tensors)[:4])
        raise InteropError(f"{checkpoint.path}: cannot tell whose code saved it (its tensors begin {some}); "
                              f"give --from {'|'.join(FAMILIES)}")
    return found[0]


def _refusal(path: Path, spec: str, found: Family, problems: list[str], inferred: bool | None) -> str:
    """The refusal: every problem (the first ``SHOWN``), and how sizes could be read (``inferred``: the
    import inferred them already; False: it could; None: the command cannot, ``import`` can)."""
    shown = problems[:SHOWN] + ([f"... and {len(problems) - SHOWN} more"] if len(problems) > SHOWN else [])
    hint = "" if inferred else ("\n  (--infer-sizes sets the spec's sizes from the checkpoint)" if inferred is False else
                                "\n  (crate-compose import SPEC FILE --infer-sizes builds the spec at the checkpoint's sizes)")
    return (f"{path} does not fit {spec} as a {found.name} checkpoint ({found.code}): "
            f"{len(problems)} problem{'s' if len(problems) != 1 else ''}:\n"
            + "\n".join(f"  {p}" for p in shown) + hint)


def export_checkpoint(module: fx.GraphModule, family_name: str) -> dict[str, torch.Tensor]:
    """The authors' state dict for ``module``: their names and layouts, and the tensors their module
    holds but never reads, filled in, so that their ``load_state_dict(strict=True)`` accepts it."""
    found = family(family_name)
    spec = spec_of(module)
    ours = module.state_dict()
    pairs, problems = correspond(plan(explicit(spec)), ours, found)
    if problems:
        raise InteropError(f"{spec.name} cannot be written as a {found.name} checkpoint ({found.code}):\n"
                              + "\n".join(f"  {p}" for p in problems[:SHOWN]))
    theirs = to_theirs(pairs, ours)
    if found.fill is not None:
        theirs.update(found.fill(theirs))
    return theirs


def write_checkpoint(tensors: dict[str, torch.Tensor], path: str | Path, *, nest: str | None = None) -> Path:
    """Write the authors' state dict: safetensors for a ``.safetensors`` path, else ``torch.save`` of
    ``{nest: tensors}`` (or of the tensors alone), which ``torch.load(weights_only=True)`` reads back.
    Written through a temporary sibling: a failed write leaves nothing."""
    path = Path(path)
    if path.suffix == ".safetensors":
        save_tensors(tensors, path, metadata={"format": "pt"})
        return path
    with staged(path) as staging:
        torch.save({nest: tensors} if nest else tensors, staging)
    return path
