"""The primitive registry: every optimization step a spec may name.

A primitive is one step of an optimization algorithm (a gradient step on the coding rate, a
proximal step on a LASSO, ...). It is registered under a name with

* ``args``: a pydantic model of the arguments a spec may give it (unknown keys rejected);
* ``objective``: what the step descends (or ascends), in words;
* ``equation``: where the papers define it (e.g. ``"003 eq. 17"``);
* ``update``: the update in the papers' notation, for summaries and diagrams: a string, or a
  function of the step's arguments when a setting changes the math (``norm: false`` drops the
  ``LN``, ``output: tied`` goes back through ``U``);
* ``inverse``: an :class:`Inverse` rule naming the primitive that undoes it in a derived decoder
  (``None``: the step has no inverse, and deriving a decoder through it is an error);
* ``consumes`` / ``publishes``: named values besides the token stream that the step reads (extra
  positional inputs, e.g. ``restore``) or writes (extra outputs after the tokens, e.g. ``mask``);
* ``footprint``: what the step does to shapes, known without building it or importing torch: a
  function ``f(args, input_shape, context, *consumed_shapes) -> Footprint`` (output shape,
  parameter shapes, published shapes, residual form) that raises ``ValueError`` for an input the
  step cannot take. It is optional: with one for every step, ``validate`` answers in a fraction of
  torch's import time; without, it infers shapes on the meta device. The registry-wide tests
  check it against the built module for every primitive;
* ``example``: arguments and a per-sample input shape on which the step builds; the registry-wide
  tests run every primitive on it (shapes, gradients, dtypes, export), so a new entry is tested
  for free;
* ``measure``: how to measure the objective the step claims to move, and which way it claims to
  move it: a :class:`crate_compose.modules.measures.Measure` or a tuple of them (``None``: the step is no
  step on a measurable objective), or a function of no arguments returning them (so a declaration
  need not import torch); :func:`crate_compose.assessment.layer_probes.probe` reads it, layer by layer;
* a *factory* ``f(args, input_shape) -> nn.Module``, where ``input_shape`` is the per-sample
  shape of the step's input (batch axis excluded), inferred by the builder. A factory that also
  takes a ``context`` keyword receives the :class:`Context` of the build: what earlier steps
  established about the token stream (the patch grid, the image, whether tokens were dropped).

Built-in primitives are declared in the modules of :mod:`crate_compose.primitives` (:data:`BUILTIN`,
imported when the registry is first read; torch-free: arguments, footprints, inverse rules) and
implemented in :mod:`crate_compose.modules`, which a factory imports when it builds. Every registry
of the package works this way (:mod:`crate_compose.registering`). Other packages add their own with
the same :func:`primitive` decorator, either by importing it themselves or through the entry-point
group ``crate_compose.primitives`` (loaded on first use). A spec only ever names a registered
primitive: it can never make the tool import code by a dotted path.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from importlib import import_module, metadata
from types import FunctionType
from typing import TYPE_CHECKING, Any, Callable, Literal, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from .errors import PluginError
from .registering import Registry

if TYPE_CHECKING:
    from torch import nn

    from .modules.measures import Measure

Shape = tuple[int, ...]
Factory = Callable[..., "nn.Module"]
Measures = "Measure | tuple[Measure, ...] | Callable[[], Measure | tuple[Measure, ...]] | None"

KINDS = ("preprocess", "compress", "sparsify", "denoise", "diffuse", "mask", "head", "norm", "attention", "mlp")


def _admits_bool(annotation: Any) -> bool:
    if annotation is bool or annotation is Any:
        return True
    return any(_admits_bool(arg) for arg in get_args(annotation))


LARGEST = 2**63 - 1  # integers of a spec fit in 64 bits (torch's sizes do)


def numbers_not_booleans(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """``depth: true`` is not 1: a boolean only where the field takes one (pydantic would cast it);
    an integer beyond 64 bits (``classes: 10^30``) is refused where it is written."""
    field = cls.model_fields.get(info.field_name) if info.field_name else None
    if isinstance(value, bool) and field is not None and not _admits_bool(field.annotation):
        raise ValueError(f"expected a number, not {str(value).lower()}")
    huge = _huge_integer(value if not isinstance(value, dict) or info.field_name == "sizes" else None)
    if huge is not None:
        key, number = huge
        raise ValueError(f"{key + ': ' if key else ''}{number:.3g} is too large: integers in a spec fit in 64 bits")
    return value


def _huge_integer(value: Any) -> tuple[str, int] | None:
    """The first integer beyond 64 bits in ``value``: a number, or a direct item of a list (``shape``)
    or of the ``sizes`` mapping; a step's ``args`` are checked by the primitive's own model."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else [("", value)]
    for key, item in items:
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > LARGEST:
            return str(key), item
    return None


class Args(BaseModel):
    """Base of every primitive's argument model: unknown keys are errors; numbers are finite
    (no ``.inf`` or ``.nan``) and never booleans (``heads: true`` is not 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    _numbers = field_validator("*", mode="before")(classmethod(numbers_not_booleans))


class NoArgs(Args):
    """This primitive takes no arguments."""


def _no_args(args: "Args", shape: "Shape") -> dict[str, Any]:
    return {}


@dataclass
class Context:
    """What earlier steps of a build established about the token stream.

    ``image``: the ``(C, H, W)`` input, when the input is an image. ``grid``: the ``(h, w)``
    grid of patch tokens, set by a patch embedding (positions read it, so any image shape gets
    the right table). ``shuffled``: tokens were dropped and reordered (a drop-mode mask), so
    their positions are no longer their order. ``ids``: the stream is still the network's input
    of integer token ids (a token embedding turns it into tokens).
    """

    image: Shape | None = None
    grid: tuple[int, int] | None = None
    shuffled: bool = False
    ids: bool = False


@dataclass(frozen=True)
class Example:
    """Arguments and a per-sample input shape on which a primitive builds (used by the tests);
    ``vocab``: the input is token ids below it (int64), not floats."""

    args: dict[str, Any]
    shape: Shape
    vocab: int | None = None


@dataclass(frozen=True)
class Footprint:
    """What one step does to shapes, computed without building it (see ``footprint`` in the module
    docstring): the per-sample ``output`` shape, the shape of every parameter by its name in the
    module (``norm.weight``, ``subspaces.weight``), the per-sample shapes of the values it
    ``publishes`` (in the order of the registration), whether the step is ``residual``
    (``skip + branch``, so LayerScale applies to it), and which parameters are ``frozen`` (not
    trained: ``requires_grad`` false)."""

    output: Shape
    parameters: dict[str, Shape] = field(default_factory=dict)
    publishes: tuple[Shape, ...] = ()
    residual: bool = False
    frozen: frozenset[str] = frozenset()

    def __post_init__(self) -> None:  # shapes given as lists, names as a set or list: one canonical form
        object.__setattr__(self, "output", tuple(self.output))
        object.__setattr__(self, "parameters", {name: tuple(s) for name, s in self.parameters.items()})
        object.__setattr__(self, "publishes", tuple(tuple(s) for s in self.publishes))
        object.__setattr__(self, "frozen", frozenset(self.frozen))


@dataclass(frozen=True)
class Inverse:
    """How a derived decoder undoes a step (001 Sec. 2.4-2.5).

    ``primitive``: the inverse step, or ``None`` when there is nothing to undo (identity).
    ``args(forward_args, forward_input_shape)``: the inverse step's arguments.
    ``where``: ``"reverse"`` undoes the step in mirror order (a layer's steps inside the decoder
    layer, the encoder's ``post`` steps before the decoder layers, its ``pre`` steps and the
    pre-processing after them); ``"prologue"`` re-applies it where the decoder starts instead
    (mask tokens; position embeddings in the ``listing3`` form, as MAE does).
    ``forms``: a different rule for a named derivation form (``listing3``); the rule itself is the
    default ``code`` form.
    """

    primitive: str | None
    args: Callable[["Args", "Shape"], dict[str, Any] | None] = _no_args
    where: Literal["reverse", "prologue"] = "reverse"
    forms: dict[str, "Inverse"] = field(default_factory=dict)

    def form(self, name: str) -> "Inverse":
        """The rule for a derivation form (``code`` is the default; ``listing3`` is paper 001's)."""
        return self.forms.get(name, self)


@dataclass(frozen=True)
class Primitive:
    """A registered optimization step (see the module docstring for the fields)."""

    name: str
    factory: Factory
    args: type[Args]
    kind: str
    objective: str
    equation: str
    update: str | Callable[[Any], str]
    description: str
    inverse: Inverse | None = None
    consumes: tuple[str, ...] = ()
    publishes: tuple[str, ...] = ()
    example: Example | None = None
    measure: "Measures" = None
    footprint: Callable[..., Footprint] | None = None
    plugin: str | None = None  # the plug-in that registered it (``--plugin my_steps.py``); None: built in or imported

    @property
    def measures(self) -> "tuple[Measure, ...]":
        """The step's measures as a tuple (empty when it has none)."""
        measure = self.measure() if isinstance(self.measure, FunctionType) else self.measure  # declared lazily
        if measure is None:
            return ()
        return measure if isinstance(measure, tuple) else (measure,)

    def build(
        self, args: Args, input_shape: Shape, context: Context | None = None, consumed: tuple[Shape, ...] = ()
    ) -> nn.Module:
        """The step's module for a per-sample ``input_shape``. A primitive with a footprint checks
        the input there first (and records what it establishes in ``context``); ``consumed``: the
        per-sample shapes of the values it consumes."""
        context = context if context is not None else Context()
        if self.footprint is not None:
            self.footprint(args, input_shape, context, *consumed)
        if "context" in inspect.signature(self.factory).parameters:
            return self.factory(args, input_shape, context=context)
        return self.factory(args, input_shape)

    def update_for(self, args: Args | dict | None = None) -> str:
        """The update in the papers' notation, for these arguments (defaults when none are given)."""
        if isinstance(self.update, str):
            return self.update
        if not isinstance(args, Args):
            if args is None:
                args = self.example.args if self.example else {}
            try:
                args = self.args.model_validate(args)
            except Exception:  # required arguments and no example: there is no update to show without them
                return "(depends on its arguments)"
        return self.update(args)


BUILTIN = tuple(
    f"crate_compose.primitives.{family}"
    for family in (  # the built-in families, declared there
        "embed",
        "compress",
        "coding_rate",
        "aot",
        "tssa",
        "tost",
        "denoise",
        "sparsify",
        "diffuse",
        "mask",
        "norm",
        "head",
        "language",
        "standard",
    )
)
_REGISTRY: Registry[Primitive] = Registry("primitive", BUILTIN, lambda held: _origin(held.factory))
_PLUGINS_LOADED = False
_PLUGIN_FAILURES: list[str] = []  # entry points that failed: reported on every look-up, not only the first
_LOADING: str | None = None  # the plug-in being imported, recorded on the primitives it registers
ENTRY_POINT_GROUP = "crate_compose.primitives"


def primitive(
    name: str,
    *,
    args: type[Args] = NoArgs,
    kind: str,
    objective: str,
    equation: str,
    update: str | Callable[[Any], str],
    description: str,
    inverse: Inverse | None = None,
    consumes: tuple[str, ...] = (),
    publishes: tuple[str, ...] = (),
    example: Example | None = None,
    measure: "Measures" = None,
    footprint: Callable[..., Footprint] | None = None,
) -> Callable[[Factory], Factory]:
    """Register ``factory`` as the primitive ``name``.

    Example::

        @primitive("my_step", args=MyArgs, kind="compress", objective="R^c",
                   equation="my paper eq. 3", update="Z - eta grad R^c(Z)",
                   description="one sentence")
        def my_step(args: MyArgs, shape: tuple[int, ...]) -> nn.Module:
            return MyStep(dim=shape[-1], ...)
    """
    if not name.isidentifier():
        raise ValueError(f"primitive name {name!r} must be a Python identifier")
    if kind not in KINDS:
        raise ValueError(f"primitive {name!r}: kind {kind!r} is not one of {KINDS}")

    def register(factory: Factory) -> Factory:
        _REGISTRY.add(
            name,
            Primitive(
                name=name,
                factory=factory,
                args=args,
                kind=kind,
                objective=objective,
                equation=equation,
                update=update,
                description=description,
                inverse=inverse,
                consumes=consumes,
                publishes=publishes,
                example=example,
                measure=measure,
                footprint=footprint,
                plugin=_LOADING,
            ),
            owner=lambda held: "a built-in primitive" if _REGISTRY.is_builtin(held) else held.plugin,
        )
        return factory

    return register


def _origin(factory: Factory) -> str:
    """Where a factory is defined; re-registering from the same place (a re-run notebook cell) replaces it."""
    return f"{factory.__module__}.{factory.__qualname__}"


def _load() -> dict[str, Primitive]:
    global _PLUGINS_LOADED
    _REGISTRY.load()  # the built-in primitives first

    if not _PLUGINS_LOADED:
        _PLUGINS_LOADED = True  # first: a plug-in that looks up primitives while imported must not recurse
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            failure = _import_plugin(f"{entry.name} ({getattr(entry, 'value', '?')})", entry.load)
            if failure:
                _PLUGIN_FAILURES.append(failure)
    if _PLUGIN_FAILURES:
        raise PluginError("primitive plugins failed to load: " + "; ".join(_PLUGIN_FAILURES))
    return _REGISTRY.load()


def load_plugins(names: list[str] | tuple[str, ...]) -> None:
    """Import the user's own primitive modules, named on the command line (``--plugin``).

    A name is a module on the Python path (``my_lab.steps``; the working directory included) or a
    ``.py`` file. Only the user chooses plugins: a spec can never make the tool import code. The
    built-in primitives are registered first, so a plug-in that reuses a built-in name is refused
    (the plug-in, not the built-in, is in error). Whatever a plug-in's import raises, ``sys.exit``
    included, becomes one :class:`PluginError` naming the plug-in and the line of its code that failed.
    """
    if not names:
        return
    _load()
    failures = [failure for name in names if (failure := _import_plugin(f"--plugin {name}", _importer(name)))]
    if failures:
        raise PluginError("; ".join(failures))


def _importer(name: str) -> Callable[[], Any]:
    """A function importing the plug-in ``name``: a ``.py`` file (as the module ``crate_compose_plugin_<stem>``)
    or a module on the Python path."""
    import importlib.util
    import sys
    from pathlib import Path

    def from_file() -> None:
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        module_name = f"crate_compose_plugin_{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None:
            raise ImportError(f"{path} is not a Python file (give a .py file or a module name)")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)

    def from_path() -> None:
        if "" not in sys.path and "." not in sys.path:
            sys.path.insert(0, "")
        import_module(name)

    return from_file if name.endswith(".py") or "/" in name else from_path


def _import_plugin(label: str, load: Callable[[], Any]) -> str | None:
    """Run ``load`` (a plug-in's import), registering its primitives as from ``label``; ``None`` when it
    succeeds, else one line: the line of the plug-in's code that failed (when the traceback reaches
    it), the plug-in, and what went wrong."""
    global _LOADING
    _LOADING = label
    try:
        load()
    except SystemExit as stop:  # the plug-in's own exit must not end this tool silently with its status
        return f"{_where(stop)}{label}: the plug-in called sys.exit({stop.code!r}) while being imported"
    except Exception as error:  # the user's code: report it, do not crash with its traceback
        message = " ".join(str(error).split())
        return f"{_where(error)}{label}: {type(error).__name__}: {message}"
    finally:
        _LOADING = None
    return None


def _where(error: BaseException) -> str:
    """``FILE:LINE: ``, the innermost line of the traceback outside crate-compose and Python's own
    library (the import system included): the plug-in's line that failed."""
    import sysconfig
    import traceback
    from pathlib import Path

    ours, stdlib = (str(Path(__file__).parent), "<frozen"), sysconfig.get_path("stdlib")
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if not f.filename.startswith(ours) and not (f.filename.startswith(stdlib) and "site-packages" not in f.filename)
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""


def all_primitives() -> dict[str, Primitive]:
    """All registered primitives by name (built-in and from plugins)."""
    return dict(sorted(_load().items()))


def get(name: str) -> Primitive | None:
    return _load().get(name)


def token_dim(shape: Shape, name: str) -> int:
    """The feature dimension d of a token input ``(n, d)``; a clear error for anything else."""
    if len(shape) != 2:
        raise ValueError(f"{name} takes tokens of shape (n, d); got input of shape {shape}")
    return shape[-1]
