"""Architecture diagrams with Graphviz, drawn from the spec and the built graph.

Clusters follow the spec (pre-processing, encoder, layer, decoder, head). Repeated layers are
collapsed to one drawn layer marked "× L" unless ``expand=True``. Each step shows its name, its
primitive, its update in the papers' notation, its output shape and its parameter count. A derived
decoder is drawn mirrored against its encoder (its flow runs upward, as in paper 001 Fig. 4) with
a dashed edge from each encoder step to the step that inverts it.

The DOT source is deterministic (golden-tested); rendering to svg/png/pdf needs Graphviz's
``dot`` program, and without it the ``.dot`` file is still written.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import graphviz
from torch import fx

from .. import registry
from ..building.builder import spec_of
from ..building.plan import tied
from ..errors import DiagramError
from ..files import writable, write_atomic
from ..settings import FORMATS

KIND_COLORS = {
    "preprocess": "#eeeeee",
    "compress": "#cfe2f3",
    "sparsify": "#fce5cd",
    "diffuse": "#d9ead3",
    "denoise": "#d9ead3",
    "mask": "#fff2cc",
    "head": "#ead1dc",
    "norm": "#f3f3f3",
    "attention": "#f4cccc",
    "mlp": "#f4cccc",
}
ROLE_TITLES = {"preprocess": "pre-processing", "encoder": "encoder", "decoder": "decoder", "head": "head"}


@dataclass
class DrawnStep:
    """One box: a step (in collapsed mode, standing for the same step of every layer)."""

    key: str
    name: str
    primitive: str
    role: str
    layer: int | None
    spec_path: tuple
    shape: tuple
    params: int
    update: str
    part: str | None = None
    depth: int = 1
    inputs: list[tuple[str, str]] = field(default_factory=list)  # (drawn step key, value name or "")
    tied: dict[str, str] = field(default_factory=dict)  # own parameter -> the parameter it shares


def _params(module: fx.GraphModule, target: str, tied: dict[str, str]) -> int:
    """The step's own parameters; a tied one counts at the step it is tied to."""
    named = module.get_submodule(target).named_parameters(remove_duplicate=False)
    return sum(p.numel() for name, p in named if f"{target}.{name}" not in tied)


def _steps(module: fx.GraphModule, expand: bool) -> tuple[list[DrawnStep], dict]:
    """The boxes to draw and the graph's input/output description."""
    spec = spec_of(module)
    producers: dict[fx.Node, tuple[str, str]] = {}  # fx node -> (drawn key, published value name)
    steps: dict[str, DrawnStep] = {}
    ends = {"input": None, "outputs": [], "modules": {}}  # modules: module path -> drawn key
    ties = tied(spec)
    for node in module.graph.nodes:
        if node.op == "placeholder":
            producers[node] = ("input", "")
            ends["input"] = (node.name, node.meta["shape"])
        elif node.op == "call_module" and "spec_path" not in node.meta:  # the input cast
            producers[node] = producers[node.args[0]]
        elif node.op == "call_module":
            meta = node.meta
            layer = meta["layer"]
            drawn_layer = layer if expand or layer is None else 0
            key = (
                f"{meta['role']}_{drawn_layer}_{meta['step']}"
                if layer is not None
                else f"{meta['role']}_{meta['step']}"
            )
            shape = meta["shape"] or next(iter(node.users)).meta["shape"]
            if key not in steps:
                depth = _stack(spec, meta["spec_path"]).depth if layer is not None and not expand else 1
                step = _spec_step(spec, meta["spec_path"])
                primitive = registry.get(step.primitive)
                update = primitive.update_for(step.args) if primitive else ""
                if step.layer_scale is not None:
                    update += f"  (γ₀ = {step.layer_scale:g})"
                steps[key] = DrawnStep(
                    key,
                    meta["step"],
                    meta["primitive"],
                    meta["role"],
                    drawn_layer,
                    meta["spec_path"],
                    shape,
                    _params(module, node.target, ties),
                    update,
                    meta.get("part"),
                    depth,
                    tied=dict(step.tie),
                )
                for arg in node.args:
                    source, value = producers[arg]
                    if source != key and (source, value) not in steps[key].inputs:
                        steps[key].inputs.append((source, value))
            ends["modules"][node.target] = key
            producers[node] = (key, "")
        elif node.op == "call_function":  # getitem on a step with several outputs
            source, _ = producers[node.args[0]]
            value = node.meta.get("value", "")
            producers[node] = (source, value)
        elif node.op == "output":
            result = node.args[0]
            items = result.items() if isinstance(result, dict) else [("output", result)]
            ends["outputs"] = [(name, producers[value], value.meta["shape"]) for name, value in items]
    return list(steps.values()), ends


def _shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _count(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if n >= 1_000:
        return f"{n / 1e3:.1f}K"
    return str(n)


def _spec_step(spec, path: tuple):
    """The step at a spec path such as ``("encoder", "layer", 0)`` or ``("stacks", "ca", "pre", 1)``."""
    owner = spec
    for part in path:
        owner = owner[part] if isinstance(part, int) or isinstance(owner, dict) else getattr(owner, part)
    return owner


def _stack(spec, path: tuple):
    return spec.stacks[path[1]] if path[0] == "stacks" else getattr(spec, path[0])


def _label(step: DrawnStep, show_shape: bool) -> str:
    update = html.escape(step.update)
    params = _count(step.params) + (f" × {step.depth}" if step.depth > 1 and step.params else "")
    own = f"{params} params" if step.params else ("no own params" if step.tied else "no params")
    tied = f"{', '.join(step.tied)} tied" if step.tied else ""
    details = [f"{_shape(step.shape)}" if show_shape else "", own, tied]
    return (
        f'<<b>{html.escape(step.name)}</b>  <font color="#555555">{html.escape(step.primitive)}</font>'
        f'<br/><i>{update}</i><br/><font point-size="10">{" · ".join(d for d in details if d)}</font>>'
    )


def diagram(
    module: fx.GraphModule,
    *,
    expand: bool = False,
    direction: str = "TB",
    edge_shapes: bool = True,
) -> graphviz.Digraph:
    """The architecture diagram of a built module (build with ``meta=True`` for speed)."""
    if direction not in ("TB", "LR"):
        raise ValueError(f"direction must be TB or LR, not {direction!r}")
    spec = spec_of(module)
    steps, ends = _steps(module, expand)
    by_key = {s.key: s for s in steps}
    total = sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
    dot = graphviz.Digraph(
        spec.name,
        graph_attr={
            "rankdir": direction,
            "label": _title(spec.name, total, mirrored=_is_mirrored(spec), tied=bool(tied(spec))),
            "labelloc": "t",
            "fontname": "Helvetica",
            "newrank": "true",
            "nodesep": "0.35",
            "ranksep": "0.3",
        },
    )
    dot.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="11", margin="0.12,0.05")
    dot.attr("edge", fontname="Helvetica", fontsize="9", color="#444444")
    in_name, in_shape = ends["input"]
    dot.node("input", f"<<b>{html.escape(in_name)}</b><br/>{_shape(in_shape)}>", shape="oval", fillcolor="white")

    roles = list(dict.fromkeys(s.role for s in steps))
    for role in roles:
        members = [s for s in steps if s.role == role]
        with dot.subgraph(name=f"cluster_{role}") as cluster:
            depth = next((_stack(spec, s.spec_path).depth for s in members if s.part is not None), None)
            title = ROLE_TITLES.get(role, role.replace("_", " ")) + (f" ({depth} layers)" if depth else "")
            cluster.attr(label=title, style="rounded", color="#999999", fontname="Helvetica-Bold", fontsize="13")
            layers = sorted({s.layer for s in members if s.layer is not None})
            for s in (s for s in members if s.layer is None and s.part != "post"):
                _node(cluster, s, edge_shapes)
            for layer in layers:
                with cluster.subgraph(name=f"cluster_{role}_layer_{layer}") as box:
                    label = f"layer × {depth}" if not expand else f"layer {layer}"
                    box.attr(label=label, style="rounded,dashed", color="#777777", fontname="Helvetica", fontsize="11")
                    for s in (s for s in members if s.layer == layer):
                        _node(box, s, edge_shapes)
            for s in (s for s in members if s.layer is None and s.part == "post"):
                _node(cluster, s, edge_shapes)

    mirrored = {s.key for s in steps if s.role == "decoder"} if _is_mirrored(spec) else set()
    for step in steps:
        for source, value in step.inputs:
            _edge(
                dot, source, step.key, by_key, value, edge_shapes, backward=step.key in mirrored and source in mirrored
            )
    if not expand:  # one "repeat" edge per collapsed stack, from its last step back to its first
        for role in roles:
            layer_steps = [s for s in steps if s.role == role and s.layer is not None]
            if layer_steps and layer_steps[0].depth > 1:
                dot.edge(
                    layer_steps[-1].key,
                    layer_steps[0].key,
                    label=f"× {layer_steps[0].depth}",
                    style="bold",
                    color="#777777",
                    constraint="false",
                )
    outputs = ends["outputs"]
    rows = "<br/>".join(f"<b>{html.escape(name)}</b> {_shape(shape)}" for name, _, shape in outputs)
    dot.node("output", f"<{rows}>", shape="oval", fillcolor="white")
    published: dict[str, list[str]] = {}  # step -> the values it publishes to the output (mask, restore)
    for name, (source, value), shape in outputs:
        if value:
            published.setdefault(source, []).append(name)
        else:
            dot.edge(source, "output", label=_shape(shape) if edge_shapes else "")
    for source, names in published.items():  # one dotted, unlabelled edge: the output oval names the values
        dot.edge(source, "output", style="dotted", constraint="false", tooltip=", ".join(names))
    for step in steps:  # dashed edges: encoder step -> the decoder step that inverts it
        inverts = _inverts(spec, step)
        if inverts is not None:
            for target in steps:
                if (
                    target.role in ("preprocess", "encoder")
                    and _spec_name(target) == inverts
                    and (expand is False or target.layer in (None, spec.encoder.depth - 1 - (step.layer or 0)))
                ):
                    dot.edge(
                        target.key,
                        step.key,
                        style="dashed",
                        color="#aa3333",
                        arrowhead="empty",
                        constraint="false",
                        tooltip="inverse",
                    )
    for step in steps:  # dashed blue edges: a tied weight, from the step that holds it
        for own, source in step.tied.items():
            owner = max((m for m in ends["modules"] if source.startswith(m + ".")), key=len, default=None)
            if owner is not None:
                dot.edge(
                    ends["modules"][owner],
                    step.key,
                    label=f"tied: {own}",
                    style="dashed",
                    color="#3355aa",
                    fontcolor="#3355aa",
                    arrowhead="none",
                    constraint="false",
                    tooltip=f"{own} = {source}",
                )
    return dot


def _title(name: str, total: int, *, mirrored: bool, tied: bool = False) -> str:
    legend = "bold grey: the layer repeats"
    if tied:
        legend = "dashed blue: one weight shared by two steps (tied); " + legend
    if mirrored:
        legend = "dashed red: encoder step → the decoder step that inverts it; " + legend
    return f'<<font point-size="16">{html.escape(name)}: {_count(total)} parameters</font><br/><font point-size="10">{legend}</font>>'


def _is_mirrored(spec) -> bool:
    decoder = spec.decoder
    return decoder is not None and any(s.inverts for s in (*decoder.pre, *decoder.layer, *decoder.post))


def _spec_name(step: DrawnStep) -> str:
    """How a derived step's ``inverts`` names this step: ``preprocess.NAME``, ``encoder.layer.NAME``."""
    prefix = "preprocess." if step.role == "preprocess" else f"{step.role}.{step.part}."
    return prefix + step.name


def _inverts(spec, step: DrawnStep) -> str | None:
    if step.role != "decoder":
        return None
    return _spec_step(spec, step.spec_path).inverts


def _node(graph: graphviz.Digraph, step: DrawnStep, show_shape: bool) -> None:
    kind = registry.get(step.primitive).kind if registry.get(step.primitive) else "preprocess"
    graph.node(step.key, _label(step, show_shape), fillcolor=KIND_COLORS.get(kind, "#ffffff"))


def _edge(dot, source, target, by_key, value, edge_shapes, backward) -> None:
    shape = by_key[source].shape if source in by_key else None
    label = value or (_shape(shape) if edge_shapes and shape else "")
    style = {"style": "dotted"} if value else {}
    if backward:  # decoder flows upward, mirroring the encoder
        dot.edge(target, source, label=label, dir="back", **style)
    else:
        dot.edge(source, target, label=label, **style)


def render(
    module: fx.GraphModule,
    path: str | Path,
    *,
    format: str = "svg",
    expand: bool = False,
    direction: str = "TB",
    edge_shapes: bool = True,
) -> tuple[Path, str | None]:
    """Write the diagram to ``path`` (suffix replaced by the format).

    Returns ``(written file, note)``; the note says how to finish when ``dot`` is missing (then
    the ``.dot`` source is written instead).
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {format!r}")
    source = diagram(module, expand=expand, direction=direction, edge_shapes=edge_shapes).source
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dot_path = path.with_suffix(".dot")
    if format == "dot":
        write_atomic(dot_path, source)
        return dot_path, None
    if shutil.which("dot") is None:
        write_atomic(dot_path, source)
        target = path.with_suffix(f".{format}")
        return dot_path, (
            f"Graphviz 'dot' not found: wrote {dot_path}; render it with `dot -T{format} {dot_path} -o {target}` "
            "(install: apt-get install graphviz)"
        )
    target = path.with_suffix(f".{format}")
    writable(target)  # refused before dot runs
    result = subprocess.run(["dot", f"-T{format}"], input=source.encode(), capture_output=True)
    if result.returncode != 0:
        raise DiagramError(f"Graphviz dot failed: {result.stderr.decode().strip()}")
    write_atomic(target, result.stdout)  # dot draws to a pipe: a full disk is ours to report, naming target
    return target, None
