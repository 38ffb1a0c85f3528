"""crate-compose: white-box transformers from declarative specs of optimization steps.

The Python API does everything the command line does::

    import crate_compose as cc
    spec = cc.load_spec("crate-base", overrides=["sizes.depth=6"])
    model = cc.build(spec, seed=0)          # a torch.fx.GraphModule
    print(cc.summarize(model).table())
    cc.save(model, "out/crate-base")        # spec.yaml + model.safetensors
    same = cc.load_build("out/crate-base")

Importing the package is cheap: each name loads its module (and torch) on first use, so the
command line answers ``--help``, a wrong path or a YAML syntax error before torch is imported.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .deprecation import deprecated
from .errors import DiagramError, PluginError, Problem, SpecError, WorkbenchError

__version__ = "0.1.0"

# public name -> (module, attribute): loaded on first access (PEP 562)
_LAZY = {
    "load_build": ("artifacts", "load_build"),
    "save": ("artifacts", "save"),
    "build": ("builder", "build"),
    "compile_spec": ("builder", "compile_spec"),
    "spec_of": ("builder", "spec_of"),
    "dump_spec": ("loader", "dump"),
    "load_spec": ("loader", "load"),
    "CachedModel": ("decoding", "CachedModel"),
    "generate": ("decoding", "generate"),
    "derive_decoder": ("derivation", "derive_decoder"),
    "masked_reconstruction_loss": ("losses", "masked_reconstruction_loss"),
    "reconstruction_loss": ("losses", "reconstruction_loss"),
    "diagram": ("figures", "diagram"),
    "render": ("figures", "render"),
    **{name: ("registry", name) for name in
       ("Args", "Context", "Example", "Footprint", "Inverse", "Primitive", "all_primitives", "load_plugins",
        "primitive")},
    "Residual": ("modules.residual", "Residual"),
    "ResourceError": ("budget", "ResourceError"),
    "json_schema": ("schema", "json_schema"),
    **{name: ("spec", name) for name in ("Derive", "Spec", "Stack", "Step")},
    "Summary": ("summary", "Summary"),
    "summarize": ("summary", "summarize"),
    "presets": ("zoo", "presets"),
    **{name: ("api", name) for name in ("validate", "derive", "inspect")},
}

# old public name -> its new name: each use warns (DeprecationWarning); removed in the next release
_RENAMED = {"Decoder": "CachedModel", "load": "load_build"}

if TYPE_CHECKING:  # what type checkers and editors see
    from .api import derive, inspect, validate
    from .artifacts import load_build, save
    from .builder import build, compile_spec, spec_of
    from .decoding import CachedModel, generate
    from .derivation import derive_decoder
    from .figures import diagram, render
    from .loader import dump as dump_spec
    from .loader import load as load_spec
    from .losses import masked_reconstruction_loss, reconstruction_loss
    from .registry import Args, Context, Example, Footprint, Inverse, Primitive, all_primitives, load_plugins, primitive
    from .budget import ResourceError
    from .modules.residual import Residual
    from .schema import json_schema
    from .spec import Derive, Spec, Stack, Step
    from .summary import Summary, summarize
    from .zoo import presets


def __getattr__(name: str) -> Any:
    if name in _RENAMED:  # never cached, so every use warns
        return deprecated(__name__, name, _RENAMED[name], __getattr__(_RENAMED[name]))
    if name not in _LAZY:
        raise AttributeError(f"module 'crate_compose' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(import_module(f".{module}", __name__), attribute)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = sorted(["DiagramError", "PluginError", "Problem", "SpecError", "WorkbenchError", *_LAZY])
