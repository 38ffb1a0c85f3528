"""Spec -> ``torch.fx.GraphModule``, one ``call_module`` node per step, built node by node.

This is the one place that creates fx nodes. Nothing is traced: the graph is written directly
from the spec, so the generated ``forward`` reads like the algorithm being unrolled::

    def forward(self, images):
        cast = self.cast(images)
        patch_embed = self.preprocess.patch_embed(cast)
        ...
        compress_0 = self.encoder.layer_0.compress(positions)
        sparsify_0 = self.encoder.layer_0.sparsify(compress_0)
        ...
        return {'output': classify, ...}

Every built model returns a dict: ``output`` (the last step's output: logits, pixels or tokens)
plus every value a step publishes (``mask``, ``restore``). Float inputs are cast to the model's
dtype first. Each node's ``meta`` records the spec path, role, layer index, step name, primitive
and the output shape; shapes are inferred by :mod:`crate_compose.building.placement`.
"""

from __future__ import annotations

import operator
import re
from pathlib import Path
from typing import Iterable

import torch
from torch import fx, nn

from ..errors import Problem, SpecError
from ..settings import DTYPE_NAMES, cuda_devices
from ..spec_language import loader
from ..spec_language.spec import Spec
from . import budget
from .derivation import explicit
from .placement import place
from .plan import plan

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


class InputCast(nn.Module):
    """Cast float inputs to the model's dtype (a model moved with ``.to(dtype)`` follows)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("anchor", torch.empty(0), persistent=False)  # carries the dtype, not saved

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.anchor.dtype) if x.is_floating_point() else x


def _install(root: nn.Module, target: str, module: nn.Module) -> None:
    *parents, leaf = target.split(".")
    owner = root
    for name in parents:
        if not hasattr(owner, name):
            owner.add_module(name, nn.Module())
        owner = getattr(owner, name)
    owner.add_module(leaf, module)


def class_name(spec_name: str) -> str:
    """``crate-base`` -> ``CrateBase`` (the generated module's class)."""
    words = re.split(r"[^A-Za-z0-9]+", spec_name)
    name = "".join(w[:1].upper() + w[1:] for w in words if w)
    return name if name[:1].isalpha() else f"Net{name}"


def resolve_device(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecError([Problem("device 'cuda' was asked for, but no CUDA device is available", ("device",))])
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise SpecError([Problem(f"device '{device}': {cuda_devices(torch.cuda.device_count())}", ("device",))])
    return device


def compile_spec(
    spec: Spec,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    meta: bool = False,
    memory_limit: str | float | None = None,
) -> fx.GraphModule:
    """Build ``spec`` into a GraphModule.

    Args:
        seed: parameters are a function of the spec and the seed alone; the global RNG is untouched.
            Each step draws from its own stream (seed and place in the network), so a variant that
            swaps one step keeps every other step's initial weights.
        device: where the parameters live; they are initialized on the CPU first, so a seed gives
            the same weights on every device.
        dtype: parameter dtype (``"float32"``, ``"float64"``, ``"bfloat16"``, ``"float16"``);
            float64 is initialized in float64, half types in float32 and then cast.
        meta: build on the meta device: shapes and parameter counts without memory or init cost.
        memory_limit: bytes (or ``"8GB"``, ``"none"``) the weights may take; the parameters are
            counted on the meta device first and a build over the limit raises
            :class:`~crate_compose.building.budget.ResourceError` before allocating (default: see
            :mod:`crate_compose.building.budget`).
    """
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    device = resolve_device(device)
    spec = explicit(spec)
    steps = plan(spec)  # each step's arguments validated once, for the budget's walk and the placement
    if not meta:  # weights are initialized in float32 (float64 builds: float64), then cast
        budget.check_build(spec, 8 if dtype == torch.float64 else 4, str(device), memory_limit, steps)
    root, graph = nn.Module(), fx.Graph()
    node = graph.placeholder(spec.input.name)
    node.meta.update(role="input", shape=("B", *spec.input.shape))
    if spec.input.dtype != "int64":
        root.add_module("cast", InputCast())
        node = graph.create_node("call_module", "cast", (node,), name="cast")
        node.meta.update(role="input", primitive=None, step=None, shape=("B", *spec.input.shape))
    named: dict[str, fx.Node] = {}  # values published by steps (mask, restore)
    for placed in place(spec, seed=seed, dtype=dtype, meta=meta, steps=steps):
        _install(root, placed.target, placed.module)
        info = dict(
            spec_path=placed.path,
            role=placed.role,
            layer=placed.layer,
            part=placed.part,
            step=placed.step.name,
            primitive=placed.step.primitive,
        )
        name = placed.node
        inputs = (node, *(named[key] for key in placed.consumes))
        if placed.published:  # the step returns (tokens, *published): unpack into named nodes
            outputs = graph.create_node("call_module", placed.target, inputs, name=f"{name}_outputs")
            outputs.meta.update(info, shape=None, publishes=tuple(placed.published))
            node = graph.create_node("call_function", operator.getitem, (outputs, 0), name=f"{name}_tokens")
            for i, (key, tensor) in enumerate(placed.published.items(), start=1):
                item = graph.create_node("call_function", operator.getitem, (outputs, i), name=key)
                item.meta.update(role=placed.role, value=key, shape=("B", *tensor.shape[1:]))
                named[key] = item
        else:
            node = graph.create_node("call_module", placed.target, inputs, name=name)
        node.meta.update(info, shape=("B", *placed.output.shape[1:]))
    graph.output({"output": node, **named})
    graph.lint()
    module = fx.GraphModule(root, graph, class_name=class_name(spec.name))
    if not meta:
        module.to(device=device, dtype=dtype)
    module.meta["spec"] = spec
    return module


def build(
    spec: Spec | str | Path,
    *,
    overrides: Iterable[str] = (),
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    meta: bool = False,
    memory_limit: str | float | None = None,
) -> fx.GraphModule:
    """Load (if needed) and build a spec: a file path, a zoo preset name, or a :class:`Spec`.

    >>> model = build("crate-tiny")
    >>> model(torch.randn(2, 3, 224, 224))["output"].shape
    torch.Size([2, 1000])
    """
    if not isinstance(spec, Spec):
        spec = loader.load(spec, overrides)
    elif overrides:
        raise TypeError("overrides apply when loading; pass a path or preset name, or load the spec first")
    return compile_spec(spec, seed=seed, device=device, dtype=dtype, meta=meta, memory_limit=memory_limit)


def spec_of(module: fx.GraphModule) -> Spec:
    """The resolved spec a module was built from."""
    return module.meta["spec"]
