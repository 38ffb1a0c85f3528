"""crate-compose: white-box transformers from declarative specs of optimization steps.

The Python API does everything the command line does::

    import crate_compose as cc
    spec = cc.load_spec("crate-base", overrides=["sizes.depth=6"])
    model = cc.build(spec, seed=0)          # a torch.fx.GraphModule
    print(cc.summarize(model).table())
    cc.save(model, "out/crate-base")        # spec.yaml + model.safetensors
    same = cc.load("out/crate-base")
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from .artifacts import load, save
from .builder import build, compile_spec, spec_of
from .errors import Problem, SpecError
from .loader import dump as dump_spec
from .decoding import Decoder, generate
from .derive import derive_decoder
from .loader import load as load_spec
from .objectives import masked_reconstruction_loss, reconstruction_loss
from .figures import diagram, render
from .registry import Args, Context, Example, Inverse, PluginError, Primitive, all_primitives, load_plugins, primitive
from .residual import Residual
from .schema import json_schema
from .spec import Derive, Spec, Stack, Step
from .summary import Summary, summarize
from .zoo import presets

__version__ = "0.1.0"


def validate(spec: str | Path | Spec, overrides: Iterable[str] = ()) -> Spec:
    """Load ``spec`` and check that it builds (shapes inferred on the meta device, no weights)."""
    resolved = spec if isinstance(spec, Spec) else load_spec(spec, overrides)
    compile_spec(resolved, meta=True)
    return resolved


def derive(spec: str | Path | Spec, overrides: Iterable[str] = ()) -> Spec:
    """``spec`` as an autoencoder: its decoder written out (the inverse of every encoder step).

    The task head and any further stacks are dropped: the derived decoder's output is the
    reconstruction. Values written as ``${size}`` references stay references when dumped with
    ``dump_spec(spec, references=True)``, in the derived steps too.
    """
    resolved = spec if isinstance(spec, Spec) else load_spec(spec, overrides)
    changed = resolved.decoder is None or resolved.head or resolved.stacks  # a network other than the spec's
    name = f"{resolved.name}-autoencoder" if changed else resolved.name
    return resolved.model_copy(
        update={"name": name, "decoder": derive_decoder(resolved), "stacks": {}, "head": [], "reference": None}
    )


def inspect(spec: str | Path | Spec, overrides: Iterable[str] = ()) -> Summary:
    """Per-step output shapes and parameter counts, without allocating weights."""
    return summarize(build(spec, overrides=overrides, meta=True))


__all__ = [
    "Args", "Context", "Decoder", "Derive", "Example", "Inverse", "PluginError", "Residual", "Stack", "Step", "load_plugins", "Primitive", "Problem", "Spec", "SpecError", "Summary", "all_primitives", "build", "compile_spec",
    "derive", "derive_decoder", "diagram", "dump_spec", "generate", "inspect", "json_schema", "load", "load_spec",
    "masked_reconstruction_loss", "presets", "primitive", "reconstruction_loss", "render", "save", "spec_of", "summarize",
    "validate",
]
