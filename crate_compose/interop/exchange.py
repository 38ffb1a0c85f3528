"""Importing the authors' checkpoints into built networks, and exporting built networks to their code.

``import_checkpoint(spec, file, family)`` reads ``file`` safely (:mod:`.reading`), sets the spec's
sizes from what the checkpoint records and from its shapes (``infer_sizes``) and its steps' arguments
from what the family's code fixes (``family_arguments``), checks every tensor on the meta
device first (a checkpoint that does not fit is refused before any memory is spent, with every
missing, extra and ill-shaped tensor named on both sides), then builds the network and loads the
tensors. ``export_checkpoint(module, family)`` gives the authors' state dict back; ``write_checkpoint``
writes it as their training script would (``torch.save`` of the nested dict) or as safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

import torch
import yaml
from torch import fx

from ..building.builder import compile_spec, spec_of
from ..building.derivation import explicit
from ..building.plan import plan, tied
from ..errors import did_you_mean
from ..files import save_tensors, staged
from ..spec_language import loader
from ..spec_language.spec import Derive, Spec
from .catalog import FAMILIES
from .families import Family
from .mapping import Pair, check, correspond, notes_on_arguments, to_ours, to_theirs
from .reading import Checkpoint, InteropError, read_checkpoint

SHOWN = 20  # problems listed before "... and N more"
BODY = ("d", "depth", "ratio", "class_depth", "context", "vocab")  # sizes that tell a published model's heads


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
        return {
            "imported_from": str(self.checkpoint.path),
            "family": self.family.name,
            "checkpoint_sha256": self.checkpoint.sha256,
        }


def family(name: str) -> Family:
    """The family called ``name``; an unknown one is refused with the known ones."""
    if name not in FAMILIES:
        hint = did_you_mean(name, FAMILIES)
        raise InteropError(
            f"unknown family {name!r}: expected one of {', '.join(FAMILIES)}" + (f" ({hint})" if hint else "")
        )
    return FAMILIES[name]


def infer_sizes(
    found: Family, checkpoint: Checkpoint, spec_sizes: dict, chosen: Iterable[str] = ()
) -> tuple[dict[str, Any], list[str]]:
    """The sizes of the network the checkpoint holds that differ from the spec's ``sizes``, and notes.

    Each size comes from, in this order: the user's ``--set sizes.K`` (``chosen``: the names set), the
    arguments the training script recorded beside the weights (``Family.recorded``), the tensors' shapes
    (``Family.sizes``). The heads of one shared projection (``K*p`` rows) are not in its shape: they come
    from the recorded arguments, the user, or a published model whose every shape matches; otherwise the
    import is refused, naming the ``--set`` that settles it (the spec's own number is never taken as known).
    A recorded size that contradicts a shape is refused, naming both."""
    chosen = set(chosen)
    try:
        shapes = {k: v if isinstance(v, bool) else int(v) for k, v in found.sizes(checkpoint.tensors).items()}
    except (KeyError, IndexError, ZeroDivisionError, ValueError) as error:
        raise InteropError(
            f"{checkpoint.path}: cannot read the sizes of a {found.name} checkpoint from it "
            f"({type(error).__name__}: {error}); is it a {found.name} checkpoint?"
        ) from None
    try:
        recorded = found.recorded(checkpoint.recorded) if found.recorded else {}
    except (ValueError, TypeError, KeyError) as error:
        raise InteropError(f"{checkpoint.path}: {error}") from None
    contradictions = [
        f"{k}={recorded[k]} recorded, {shapes[k]} in the shapes"
        for k in recorded
        if k in shapes and shapes[k] != recorded[k]
    ]
    if contradictions:
        raise InteropError(
            f"{checkpoint.path}: the arguments recorded in the checkpoint contradict its tensors ("
            + "; ".join(contradictions)
            + "): which model it holds cannot be told"
        )
    sizes = {**shapes, **recorded}
    notes = (
        [
            "sizes read from the arguments recorded in the checkpoint: "
            + ", ".join(f"{k}={v}" for k, v in recorded.items())
        ]
        if recorded
        else []
    )
    inner = sizes.pop("inner", None)
    if inner is not None:
        heads, why = _heads(found, checkpoint, sizes, spec_sizes.get("heads") if "heads" in chosen else None, inner)
        sizes.update(heads=heads, head_dim=inner // heads)
        if why:
            notes.append(why)
    for name in ("image_size", "context"):
        if name in spec_sizes and name not in sizes and name not in chosen:
            notes.append(
                f"a {found.name} checkpoint does not give {name}: kept the spec's {spec_sizes[name]} "
                f"(--set sizes.{name}=N to choose another)"
            )
    changed = {k: v for k, v in sizes.items() if k in spec_sizes and k not in chosen and spec_sizes[k] != v}
    return changed, notes


def _heads(found: Family, checkpoint: Checkpoint, sizes: dict, chosen: int | None, inner: int) -> tuple[int, str]:
    """The number of heads of a shared projection of ``inner`` rows, and how it was known."""
    if "heads" in sizes:  # recorded
        heads, why = sizes["heads"], ""
    elif chosen is not None:
        heads, why = chosen, ""
    else:
        shapes = {k: v for k, v in sizes.items() if k in BODY}  # heads are the body's: patch, image, classes aside
        fits = {
            name: found.published[name]["heads"]
            for name in found.matching(shapes)
            if inner
            == found.published[name].get("head_dim", inner // found.published[name]["heads"])
            * found.published[name]["heads"]
        }
        if len(set(fits.values())) != 1:
            known = (
                (
                    f"; {found.name}'s published models: "
                    + ", ".join(f"{n} ({m['heads']})" for n, m in found.published.items())
                )
                if found.published
                else ""
            )
            raise InteropError(
                f"{checkpoint.path}: the number of heads is neither recorded in the checkpoint nor told by its shapes "
                f"(one shared projection of {inner} rows, width {sizes.get('d')}) and its sizes are those of no "
                f"published model{known}. Give it: --set sizes.heads=K (K divides {inner})"
            )
        heads = next(iter(fits.values()))
        why = (
            f"heads={heads}: the checkpoint's shapes are those of {found.name}'s published "
            f"{' / '.join(fits)} (it records no arguments; --set sizes.heads=K to choose another)"
        )
    if heads < 1 or inner % heads:
        raise InteropError(
            f"{checkpoint.path}: {heads} heads do not divide the shared projection's {inner} rows "
            f"(--set sizes.heads=K with K dividing {inner})"
        )
    return heads, why


def family_arguments(spec: Spec, found: Family) -> list[str]:
    """``--set`` overrides giving each step the arguments the family's code fixes (a CRATE-alpha's final
    LayerNorm eps 1e-5, a CRATE-MAE's lambda 0.5...) where the spec differs. Steps of a derived decoder
    follow their encoder step and are left as they are (a note says where they differ)."""
    derived = isinstance(spec.decoder, Derive)
    overrides: dict[str, str] = {}
    for step in plan(explicit(spec)):
        place = found.place(step.role, step.part, step.step.primitive)
        if place is None or step.args is None or (derived and step.path[0] == "decoder"):
            continue
        where = ".".join(str(p) for p in step.path)
        for key, value in place.args.items():
            if getattr(step.args, key, None) != value:
                overrides[f"{where}.args.{key}"] = (
                    yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
                )
    return [f"{path}={value}" for path, value in overrides.items()]


def chosen_sizes(overrides: Iterable[str]) -> set[str]:
    """The sizes ``--set sizes.K=V`` overrides set."""
    return {o.partition("=")[0].strip()[len("sizes.") :] for o in overrides if o.strip().startswith("sizes.")}


def import_checkpoint(
    spec_ref,
    file: str | Path,
    family_name: str | None = None,
    *,
    overrides: Iterable[str] = (),
    infer: bool = True,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    key: str | None = None,
) -> Imported:
    """Build ``spec_ref`` (a path, preset name or Spec) with the weights of the checkpoint ``file``.

    ``family_name``: whose code saved it (default: told by the names of its tensors, :func:`detect`).
    ``infer`` (default): build the spec at the sizes the checkpoint gives (:func:`infer_sizes`) and with the
    arguments the family's code fixes (:func:`family_arguments`); ``overrides`` (``--set``) still win.
    False: the spec as it is (a checkpoint that does not fit is refused).
    ``dtype``: of the built network (default: float64 for a float64 checkpoint, else float32).
    ``key``: the checkpoint's entry holding the weights (``model_ema``; default: found).
    Raises :class:`InteropError` naming every tensor that does not fit."""
    named = None if family_name is None else family(family_name)  # an unknown name before the file is read
    checkpoint = read_checkpoint(file, key)
    found = named or detect(checkpoint)
    checkpoint = in_family_names(checkpoint, found)
    overrides = list(overrides)
    sizes: dict[str, Any] = {}
    notes = list(checkpoint.notes)
    if isinstance(spec_ref, Spec):  # a loaded spec is taken as it is
        if overrides:
            raise TypeError("overrides apply when loading; pass a path or preset name")
        spec = spec_ref
    else:
        spec = loader.load(spec_ref, overrides)
        if infer:
            sizes, inferred = infer_sizes(found, checkpoint, spec.sizes, chosen_sizes(overrides))
            notes += inferred
            overrides = [
                *(f"sizes.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sizes.items()),
                *overrides,
            ]
            spec = loader.load(spec_ref, overrides)
            fixed = family_arguments(spec, found)
            if fixed:
                notes.append(f"as {found.name}'s code computes: " + ", ".join(fixed))
                spec = loader.load(spec_ref, [*fixed, *overrides])
    theirs = checkpoint.tensors
    pairs, skipped = fitted(spec, compile_spec(spec, meta=True).state_dict(), checkpoint, found, infer)  # on meta:
    dtype = dtype or (
        torch.float64
        if all(t.dtype == torch.float64 for t in theirs.values() if t.is_floating_point())
        else torch.float32
    )  # a misfit is refused before memory is spent
    module = compile_spec(spec, seed=seed, dtype=dtype)
    module.load_state_dict(to_ours(pairs, theirs, dtype), strict=True)
    notes += notes_on_arguments(pairs, found)
    return Imported(module, found, checkpoint, sizes, notes, skipped)


def fitted(
    spec: Spec, ours: dict[str, torch.Tensor], checkpoint: Checkpoint, found: Family, inferred: bool | None = False
) -> tuple[list[Pair], list[str]]:
    """The pairs of ``spec``'s tensors (its state dict ``ours``, on meta or not) with the checkpoint's,
    and the checkpoint's tensors left out on purpose; :class:`InteropError` naming every misfit."""
    pairs, problems = correspond(plan(explicit(spec)), ours, found)
    skipped: list[str] = []
    if not problems:
        problems, skipped = check(pairs, ours, checkpoint.tensors, found, tied(spec))
    if problems:
        raise InteropError(_refusal(checkpoint.path, spec.name, found, problems, inferred))
    broken = not_finite(checkpoint.tensors, [pair.theirs for pair in pairs])
    if broken:  # a diverged run: as a build folder's NaN is refused (probing.load_weights, checkpoint.verify)
        shown = ", ".join(broken[:SHOWN]) + (f", ... and {len(broken) - SHOWN} more" if len(broken) > SHOWN else "")
        raise InteropError(
            f"{checkpoint.path}: {len(broken)} tensor{'s' if len(broken) != 1 else ''} "
            f"{'hold' if len(broken) != 1 else 'holds'} NaN or infinite values ({shown}; "
            "the weights of a diverged run?)"
        )
    return pairs, skipped


def not_finite(tensors: dict[str, torch.Tensor], names: Iterable[str]) -> list[str]:
    """The names (of ``names``, each once, in order) of the floating tensors holding NaN or an infinity; the
    tensors a network would take, so a constant the authors' module keeps but never reads is not judged."""
    found = []
    for name in dict.fromkeys(names):
        tensor = tensors.get(name)
        if (
            tensor is not None
            and tensor.is_floating_point()
            and not tensor.is_meta
            and not torch.isfinite(tensor).all()
        ):
            found.append(name)
    return found


def load_checkpoint(module: fx.GraphModule, file: str | Path | Checkpoint, family_name: str | None = None) -> list[str]:
    """Load the authors' checkpoint ``file`` (a path, or a :class:`Checkpoint` already read) into a built
    ``module`` (its spec must fit: no sizes are inferred); returns the notes (what was unwrapped, left
    out, computed otherwise)."""
    named = None if family_name is None else family(family_name)
    checkpoint = file if isinstance(file, Checkpoint) else read_checkpoint(file)
    found = named or detect(checkpoint)
    checkpoint = in_family_names(checkpoint, found)
    ours = module.state_dict()
    pairs, skipped = fitted(spec_of(module), ours, checkpoint, found, inferred=None)
    dtype = next((t.dtype for t in ours.values() if t.is_floating_point()), torch.float32)
    module.load_state_dict(to_ours(pairs, checkpoint.tensors, dtype), strict=True)
    return [
        f"{checkpoint.path} read as a {found.name} checkpoint",
        *checkpoint.notes,
        *(f"not used: {s}" for s in skipped),
        *notes_on_arguments(pairs, found),
    ]


def in_family_names(checkpoint: Checkpoint, found: Family) -> Checkpoint:
    """``checkpoint`` with its tensors under the names the family's tables use (``Family.canonical``: one
    layout of a family's files named as the other), and a note when a name changed."""
    if found.canonical is None:
        return checkpoint
    tensors = found.canonical(checkpoint.tensors)
    if tensors.keys() == checkpoint.tensors.keys():
        return checkpoint
    note = f"tensor names read as {found.name}'s tables name them"
    return replace(checkpoint, tensors=tensors, notes=[*checkpoint.notes, note])


def detect(checkpoint: Checkpoint) -> Family:
    """The family whose code saved ``checkpoint``, told by a tensor name only that family's code uses."""
    found = [f for f in FAMILIES.values() if f.holds(checkpoint.tensors)]
    if len(found) != 1:
        some = ", ".join(list(checkpoint.tensors)[:4])
        raise InteropError(
            f"{checkpoint.path}: cannot tell whose code saved it (its tensors begin {some}); "
            f"give --from {'|'.join(FAMILIES)}"
        )
    return found[0]


def _refusal(path: Path, spec: str, found: Family, problems: list[str], inferred: bool | None) -> str:
    """The refusal: every problem (the first ``SHOWN``), and how sizes could be read (``inferred``: the
    import inferred them already; False: it could; None: the command cannot, ``import`` can)."""
    shown = problems[:SHOWN] + ([f"... and {len(problems) - SHOWN} more"] if len(problems) > SHOWN else [])
    hint = (
        ""
        if inferred
        else (
            "\n  (without --keep-spec, import builds the spec at the checkpoint's sizes)"
            if inferred is False
            else "\n  (crate-compose import SPEC FILE builds the spec at the checkpoint's sizes)"
        )
    )
    return (
        f"{path} does not fit {spec} as a {found.name} checkpoint ({found.code}): "
        f"{len(problems)} problem{'s' if len(problems) != 1 else ''}:\n" + "\n".join(f"  {p}" for p in shown) + hint
    )


def export_checkpoint(module: fx.GraphModule, family_name: str) -> dict[str, torch.Tensor]:
    """The authors' state dict for ``module``: their names and layouts, and the tensors their module
    holds but never reads, filled in, so that their ``load_state_dict(strict=True)`` accepts it."""
    found = family(family_name)
    spec = spec_of(module)
    ours = module.state_dict()
    pairs, problems = correspond(plan(explicit(spec)), ours, found)
    if problems:
        raise InteropError(
            f"{spec.name} cannot be written as a {found.name} checkpoint ({found.code}):\n"
            + "\n".join(f"  {p}" for p in problems[:SHOWN])
        )
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
