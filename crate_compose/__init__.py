"""crate-compose: white-box transformers from declarative specs of optimization steps.

Every command of the command line is a function here (the command line is a thin layer over them:
docs/python.md)::

    import crate_compose as cc
    spec = cc.load_spec("crate-base", overrides=["sizes.depth=6"])
    model = cc.build(spec, seed=0)          # a torch.fx.GraphModule
    print(cc.summarize(model).table())
    cc.save(model, "out/crate-base")        # spec.yaml + model.safetensors
    same = cc.load_build("out/crate-base")
    result = cc.train("crate-tiny", cc.Settings(data="digits", steps=200), out="runs/tiny")

Importing the package is cheap: each name loads its module (and torch) on first use, so the
command line answers ``--help``, a wrong path or a YAML syntax error before torch is imported.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import DiagramError, PluginError, Problem, SpecError, WorkbenchError
from .version import __version__

# public name -> (module, attribute): loaded on first access (PEP 562)
_LAZY = {
    "load_build": ("building.artifacts", "load_build"),
    "save": ("building.artifacts", "save"),
    "build": ("building.builder", "build"),
    "compile_spec": ("building.builder", "compile_spec"),
    "spec_of": ("building.builder", "spec_of"),
    "dump_spec": ("spec_language.loader", "dump"),
    "load_spec": ("spec_language.loader", "load"),
    "CachedModel": ("generation.decoding", "CachedModel"),
    "generate": ("generation.decoding", "generate"),
    "derive_decoder": ("building.derivation", "derive_decoder"),
    "masked_reconstruction_loss": ("tasks.masked_autoencoding", "masked_reconstruction_loss"),
    "reconstruction_loss": ("tasks.masked_autoencoding", "reconstruction_loss"),
    "diagram": ("rendering.diagrams", "diagram"),
    "render": ("rendering.diagrams", "render"),
    **{
        name: ("registry", name)
        for name in (
            "Args",
            "Context",
            "Example",
            "Footprint",
            "Inverse",
            "Primitive",
            "all_primitives",
            "load_plugins",
            "primitive",
        )
    },
    "Residual": ("modules.residual", "Residual"),
    **{name: ("modules.paths", name) for name in ("formulas", "formulas_as_written", "set_formulas", "use_formulas")},
    "ResourceError": ("building.budget", "ResourceError"),
    "json_schema": ("spec_language.schema", "json_schema"),
    **{name: ("spec_language.spec", name) for name in ("Derive", "Spec", "Stack", "Step")},
    "Summary": ("building.summary", "Summary"),
    "summarize": ("building.summary", "summarize"),
    "presets": ("spec_language.zoo", "presets"),
    **{
        name: ("interop.exchange", name)
        for name in ("import_checkpoint", "export_checkpoint", "write_checkpoint", "load_checkpoint")
    },
    "read_checkpoint": ("interop.reading", "read_checkpoint"),
    "InteropError": ("interop.reading", "InteropError"),
    **{name: ("building.inspection", name) for name in ("validate", "derive", "inspect")},
    # the workbench: training, ablations, probes, scores, pictures, the data's set-up step
    "Settings": ("settings", "Settings"),
    "train": ("training.run", "train"),
    "describe": ("training.description", "describe"),
    "Grid": ("ablation.grids", "Grid"),
    "ablate": ("ablation.study", "ablate"),
    "probe": ("assessment.run_probes", "probe_run"),
    "evaluate": ("assessment.scoring", "evaluate_weights"),
    "linear_probe": ("assessment.scoring", "linear_probe_weights"),
    "segment": ("pictures.segmentation", "segment"),
    "fill": ("generation.fill", "fill"),
    "fetch": ("data.archives", "fetch"),
}

if TYPE_CHECKING:  # what type checkers and editors see
    from .ablation.grids import Grid
    from .ablation.study import ablate
    from .assessment.run_probes import probe_run as probe
    from .assessment.scoring import evaluate_weights as evaluate
    from .assessment.scoring import linear_probe_weights as linear_probe
    from .building.artifacts import load_build, save
    from .building.budget import ResourceError
    from .building.builder import build, compile_spec, spec_of
    from .building.derivation import derive_decoder
    from .building.inspection import derive, inspect, validate
    from .building.summary import Summary, summarize
    from .data.archives import fetch
    from .generation.decoding import CachedModel, generate
    from .generation.fill import fill
    from .interop.exchange import export_checkpoint, import_checkpoint, load_checkpoint, write_checkpoint
    from .interop.reading import InteropError, read_checkpoint
    from .modules.paths import formulas, formulas_as_written, set_formulas, use_formulas
    from .modules.residual import Residual
    from .pictures.segmentation import segment
    from .registry import Args, Context, Example, Footprint, Inverse, Primitive, all_primitives, load_plugins, primitive
    from .rendering.diagrams import diagram, render
    from .settings import Settings
    from .spec_language.loader import dump as dump_spec
    from .spec_language.loader import load as load_spec
    from .spec_language.schema import json_schema
    from .spec_language.spec import Derive, Spec, Stack, Step
    from .spec_language.zoo import presets
    from .tasks.masked_autoencoding import masked_reconstruction_loss, reconstruction_loss
    from .training.description import describe
    from .training.run import train


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'crate_compose' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(import_module(f".{module}", __name__), attribute)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = sorted(["DiagramError", "PluginError", "Problem", "SpecError", "WorkbenchError", *_LAZY])
