"""A row per step: name, primitive, output shape, parameters; and totals.

From a built graph (:func:`summarize`), or from the march's records (:func:`summarize_march`,
what ``inspect`` prints and the memory budget counts: the footprints' when every step has one,
else the meta placement's): the two agree to the last parameter, as the tests check on every preset.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ..spec_language.spec import Spec
from .march import Marched
from .plan import tied

if TYPE_CHECKING:
    from torch import fx


@dataclass
class StepRow:
    name: str
    module: str
    role: str
    layer: int | None
    primitive: str
    spec_path: str
    output_shape: list[int | str]
    params: int  # its own parameters; a tied one is counted at the step it is tied to
    trainable: int
    tied: dict[str, str] = field(default_factory=dict)  # own parameter -> the tensor it shares


@dataclass
class Summary:
    """A spec's steps (a :class:`StepRow` each) and totals; shown (``repr``, ``str``, ``print``) as the table
    ``crate-compose inspect`` prints (:meth:`table`)."""

    name: str
    input_shape: list[int | str]
    output_shape: list[int | str]
    params_total: int
    params_trainable: int
    steps: list[StepRow] = field(default_factory=list)
    reference: dict | None = None  # the paper's count (see Spec.reference), with this build's deviation
    notes: list[str] = field(default_factory=list)  # what loading did on its own (variant name, swaps)

    def to_dict(self) -> dict:
        return asdict(self)

    def __repr__(self) -> str:
        """The table ``crate-compose inspect`` prints (:meth:`table`): what a REPL or ``print`` shows."""
        return self.table()

    __str__ = __repr__

    def by_role(self) -> dict[str, int]:
        """Parameters per role (preprocess, encoder, decoder, head)."""
        totals: dict[str, int] = {}
        for row in self.steps:
            totals[row.role] = totals.get(row.role, 0) + row.params
        return totals

    def table(self) -> str:
        """The summary as aligned text, one row per step."""
        header = ("step", "primitive", "output shape", "params")
        rows = [header] + [(r.module, r.primitive, _shape(r.output_shape), f"{r.params:,}") for r in self.steps]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [f"{self.name}: input {_shape(self.input_shape)} -> output {_shape(self.output_shape)}"]
        notes = ["", *(_ties(r) for r in self.steps)]
        for i, row in enumerate(rows):
            lines.append(
                f"  {row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]:>{widths[3]}}{notes[i]}"
            )
            if i == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        parts = ", ".join(f"{role} {count:,}" for role, count in self.by_role().items())
        lines.append(f"parameters: {self.params_total:,} total, {self.params_trainable:,} trainable ({parts})")
        for note in self.notes:
            lines.append(f"note: {note}")
        if self.reference:
            ref = self.reference
            verdict = "exact" if ref["deviation"] == 0 else f"{ref['deviation']:+.2%}"
            lines.append(f"paper: {ref['params']:,} ({ref['source']}); this build: {verdict}")
            if ref["note"]:
                lines.append(f"  difference: {ref['note']}")
        return "\n".join(lines)


def _ties(row: StepRow) -> str:
    return "".join(f"  ({own} tied to {source})" for own, source in row.tied.items())


def _shape(shape: list[int | str]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def summarize(module: fx.GraphModule) -> Summary:
    """Summarize a module built by :func:`crate_compose.build` (shapes come from node metadata)."""
    steps, input_shape, output_shape = [], [], []
    ties = tied(module.meta["spec"])
    for node in module.graph.nodes:
        if node.op == "placeholder":
            input_shape = list(node.meta["shape"])
        elif node.op == "call_module" and "spec_path" in node.meta:
            sub = module.get_submodule(node.target)
            shape = node.meta["shape"] or next(iter(node.users)).meta["shape"]  # tokens of a multi-output step
            own = {f"{node.target}.{name}": p for name, p in sub.named_parameters(remove_duplicate=False)}
            params = [p for name, p in own.items() if name not in ties]
            steps.append(
                StepRow(
                    name=node.name,
                    module=node.target,
                    role=node.meta["role"],
                    layer=node.meta["layer"],
                    primitive=node.meta["primitive"],
                    spec_path=".".join(str(p) for p in node.meta["spec_path"]),
                    output_shape=list(shape),
                    params=sum(p.numel() for p in params),
                    trainable=sum(p.numel() for p in params if p.requires_grad),
                    tied={name[len(node.target) + 1 :]: ties[name] for name in own if name in ties},
                )
            )
            output_shape = list(shape)
    unique = {id(p): p for p in module.parameters()}.values()
    total = sum(p.numel() for p in unique)
    return _summary(
        module.meta["spec"], input_shape, output_shape, steps, total, sum(p.numel() for p in unique if p.requires_grad)
    )


def summarize_march(spec: Spec, walked: list[Marched]) -> Summary:
    """The summary of ``spec`` (its decoder explicit) from the records of a march over it (the
    footprints' walk, :func:`crate_compose.building.footprints.walk`, or a placement), without
    building it: what :func:`summarize` gives for the built module."""
    ties = tied(spec)
    steps = []
    for w in walked:
        own = {f"{w.target}.{name}": shape for name, shape in w.footprint.parameters.items()}
        counted = {name: math.prod(shape) for name, shape in own.items() if name not in ties}
        frozen = {f"{w.target}.{name}" for name in w.footprint.frozen}
        steps.append(
            StepRow(
                name=f"{w.node}{'_outputs' if w.footprint.publishes else ''}",
                module=w.target,
                role=w.role,
                layer=w.layer,
                primitive=w.step.primitive,
                spec_path=".".join(str(p) for p in w.path),
                output_shape=["B", *w.footprint.output],
                params=sum(counted.values()),
                trainable=sum(n for name, n in counted.items() if name not in frozen),
                tied={name[len(w.target) + 1 :]: ties[name] for name in own if name in ties},
            )
        )
    total = sum(row.params for row in steps)
    return _summary(
        spec,
        ["B", *spec.input.shape],
        steps[-1].output_shape if steps else ["B", *spec.input.shape],
        steps,
        total,
        sum(row.trainable for row in steps),
    )


def _summary(
    spec: Spec, input_shape: list, output_shape: list, steps: list[StepRow], total: int, trainable: int
) -> Summary:
    reference = None
    if spec.reference is not None:
        reference = dict(spec.reference.model_dump(), deviation=(total - spec.reference.params) / spec.reference.params)
    return Summary(
        name=spec.name,
        input_shape=input_shape,
        output_shape=output_shape,
        params_total=total,
        params_trainable=trainable,
        steps=steps,
        reference=reference,
        notes=list(spec.notes()),
    )
