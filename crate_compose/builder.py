"""Spec -> ``torch.fx.GraphModule``, one ``call_module`` node per step, built node by node.

This is the one place that creates fx nodes. Nothing is traced: the graph is written directly
from the spec, so the generated ``forward`` reads like the algorithm being unrolled::

    def forward(self, images):
        patch_embed = self.preprocess.patch_embed(images)
        ...
        compress_0 = self.encoder.layer_0.compress(positions)
        sparsify_0 = self.encoder.layer_0.sparsify(compress_0)
        ...

Each node's ``meta`` records the spec path, role, layer index, step name, primitive and the
output shape. Shapes are inferred while building, without data: each new module runs once on a
meta tensor (no data, no FLOPs), so the next primitive knows its input shape (e.g. ``d``).
"""

from __future__ import annotations

import contextlib
import operator
import re
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import fx, nn
from torch.func import functional_call

from . import loader, registry
from .errors import Problem, SpecError
from .derive import derive_decoder
from .spec import Derive, Spec

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
META_BATCH = 2  # batch size of the meta tensors used to infer shapes


def _target(role: str, layer: int | None, name: str) -> str:
    """The submodule path: ``preprocess.patch_embed``, ``encoder.layer_3.compress``."""
    return f"{role}.{name}" if layer is None else f"{role}.layer_{layer}.{name}"


def _node_name(role: str, layer: int | None, name: str) -> str:
    if layer is None:
        return name
    return f"{name}_{layer}" if role == "encoder" else f"{role}_{name}_{layer}"


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


def infer(module: nn.Module, *inputs: torch.Tensor) -> Any:
    """Run ``module`` on meta tensors: output shapes without data, FLOPs or touching its weights."""
    state = {name: t.to("meta") for name, t in [*module.named_parameters(), *module.named_buffers()]}
    return functional_call(module, state, inputs)


def resolve_device(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecError([Problem("device 'cuda' was asked for, but no CUDA device is available", ("device",))])
    return device


def compile_spec(
    spec: Spec,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    meta: bool = False,
) -> fx.GraphModule:
    """Build ``spec`` into a GraphModule.

    Args:
        seed: parameters are a function of the spec and the seed alone; the global RNG is untouched.
        device: where the parameters live; they are initialized on the CPU first, so a seed gives
            the same weights on every device.
        dtype: parameter dtype (``"float32"``, ``"float64"``, ``"bfloat16"``, ``"float16"``).
        meta: build on the meta device: shapes and parameter counts without memory or init cost.
    """
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    device = resolve_device(device)
    if isinstance(spec.decoder, Derive):
        spec = spec.model_copy(update={"decoder": derive_decoder(spec)})
    root, graph = nn.Module(), fx.Graph()
    shape = tuple(spec.input.shape)
    input_dtype = torch.int64 if spec.input.dtype == "int64" else torch.float32
    value = torch.empty((META_BATCH, *shape), dtype=input_dtype, device="meta")
    node = graph.placeholder(spec.input.name)
    node.meta.update(role="input", shape=("B", *shape))
    named: dict[str, tuple[fx.Node, torch.Tensor]] = {}  # values published by steps (mask, restore)

    context = torch.device("meta") if meta else contextlib.nullcontext()
    with torch.random.fork_rng(devices=[]), context:
        torch.manual_seed(seed)
        for role, layer, path, step in spec.stages():
            primitive = registry.get(step.primitive)
            args = primitive.args.model_validate(step.args)
            where = f"{role} layer {layer}" if layer is not None else role
            missing = [name for name in primitive.consumes if name not in named]
            if missing:
                message = f"step '{step.name}' ({step.primitive}) needs {missing}, which no earlier step publishes"
                raise SpecError([Problem(message, path, spec.locate(path))])
            extra = [named[name] for name in primitive.consumes]
            try:
                module = primitive.build(args, shape)
                value = infer(module, value, *(v for _, v in extra))
            except Exception as error:  # a shape the primitive cannot take, reported where the step is written
                reason = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
                message = f"step '{step.name}' ({step.primitive}, {where}) cannot take input of shape {shape}: {reason}"
                raise SpecError([Problem(message, path, spec.locate(path))]) from None
            target = _target(role, layer, step.name)
            _install(root, target, module)
            info = dict(spec_path=path, role=role, layer=layer, step=step.name, primitive=step.primitive)
            name = _node_name(role, layer, step.name)
            inputs = (node, *(n for n, _ in extra))
            if primitive.publishes:  # the step returns (tokens, *published): unpack into named nodes
                outputs = graph.create_node("call_module", target, inputs, name=f"{name}_outputs")
                outputs.meta.update(info, shape=None, publishes=primitive.publishes)
                value, *published = value
                node = graph.create_node("call_function", operator.getitem, (outputs, 0), name=f"{name}_tokens")
                for i, (key, tensor) in enumerate(zip(primitive.publishes, published), start=1):
                    item = graph.create_node("call_function", operator.getitem, (outputs, i), name=key)
                    item.meta.update(role=role, value=key, shape=("B", *tensor.shape[1:]))
                    named[key] = (item, tensor)
            else:
                node = graph.create_node("call_module", target, inputs, name=name)
            shape = tuple(value.shape[1:])
            node.meta.update(info, shape=("B", *shape))
    if named:
        graph.output({"output": node, **{key: item for key, (item, _) in named.items()}})
    else:
        graph.output(node)
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
) -> fx.GraphModule:
    """Load (if needed) and build a spec: a file path, a zoo preset name, or a :class:`Spec`.

    >>> model = build("crate-tiny")
    >>> model(torch.randn(2, 3, 224, 224)).shape
    torch.Size([2, 1000])
    """
    if not isinstance(spec, Spec):
        spec = loader.load(spec, overrides)
    elif overrides:
        raise TypeError("overrides apply when loading; pass a path or preset name, or load the spec first")
    return compile_spec(spec, seed=seed, device=device, dtype=dtype, meta=meta)


def spec_of(module: fx.GraphModule) -> Spec:
    """The resolved spec a module was built from."""
    return module.meta["spec"]
