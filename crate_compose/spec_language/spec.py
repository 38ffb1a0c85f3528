"""The spec language: a network as pre-processing steps, named stacks of layers, and a head.

A *stack* is a layer of steps repeated ``depth`` times (fresh weights each time), with optional
steps before (``pre``) and after (``post``) its layers. Every spec has an ``encoder`` stack; a
``decoder`` stack (written out, or ``{derive: inverse}``) and further named ``stacks`` (ToST's
class-attention blocks) follow it, in that order, then the ``head``.

Every model rejects unknown keys; every field has a description, so ``crate-compose schema``
is the reference of the language. A step names a registered primitive and gives its arguments;
the arguments are validated against that primitive's own model (see
:mod:`crate_compose.registry`). See ``docs/spec.md`` for a tour.
"""

from __future__ import annotations

import keyword
import re
from collections import Counter
from typing import Annotated, Any, Iterator, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    field_validator,
    model_validator,
)

from ..registry import numbers_not_booleans

IDENTIFIER = r"^[A-Za-z][A-Za-z0-9_]*$"
MAX_DEPTH = 1024  # layers of one stack: deeper than any published network, and placed in seconds
MAX_STEPS = 1024  # steps of a whole network, layers unrolled (CRATE-Large has 52): placed in about 7 s
RESERVED = ("preprocess", "encoder", "decoder", "stacks", "head", "input", "output", "cast")
# Names a step, stack or input may not take: they become attributes of torch.nn.Module and
# torch.fx.GraphModule objects and names in the generated forward(). Kept without importing torch;
# tests/test_hostile_input.py checks it covers every public attribute of both classes.
MODULE_ATTRIBUTES = frozenset(
    {
        "T_destination",
        "add_module",
        "add_submodule",
        "apply",
        "bfloat16",
        "buffers",
        "call_super_init",
        "children",
        "code",
        "compile",
        "cpu",
        "cuda",
        "delete_all_unused_submodules",
        "delete_submodule",
        "double",
        "dump_patches",
        "eval",
        "extra_repr",
        "float",
        "forward",
        "get_buffer",
        "get_extra_state",
        "get_parameter",
        "get_submodule",
        "graph",
        "half",
        "ipu",
        "load_state_dict",
        "modules",
        "mtia",
        "named_buffers",
        "named_children",
        "named_modules",
        "named_parameters",
        "parameters",
        "print_readable",
        "recompile",
        "register_backward_hook",
        "register_buffer",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_full_backward_hook",
        "register_full_backward_pre_hook",
        "register_load_state_dict_post_hook",
        "register_load_state_dict_pre_hook",
        "register_module",
        "register_parameter",
        "register_state_dict_post_hook",
        "register_state_dict_pre_hook",
        "requires_grad_",
        "set_extra_state",
        "set_submodule",
        "share_memory",
        "state_dict",
        "to",
        "to_empty",
        "to_folder",
        "train",
        "type",
        "xpu",
        "zero_grad",
        "training",
        "meta",
        "self",  # instance attributes, and forward's own first parameter
    }
)


def _usable_name(name: str) -> str:
    """A step, stack or input name that is a Python identifier, not a keyword, not an attribute of a module."""
    if not re.fullmatch(IDENTIFIER[1:-1], name):
        raise ValueError(f"'{name}' must be letters, digits and '_', starting with a letter")
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise ValueError(f"'{name}' is a Python keyword; the generated code could not name it")
    if name in MODULE_ATTRIBUTES:
        raise ValueError(f"'{name}' is an attribute of every torch module; choose another name")
    return name


class _Model(BaseModel):
    """Unknown keys are errors; numbers are finite (no .inf or .nan) and never booleans."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    _numbers = field_validator("*", mode="before")(classmethod(numbers_not_booleans))


class Step(_Model):
    """One optimization step: a registered primitive and its arguments."""

    name: str = Field(
        description="Name of the step, unique within its list; names the submodule and the graph node "
        "(e.g. 'compress', 'sparsify'): letters, digits and '_', starting with a letter, not a Python keyword "
        "or a torch module attribute (forward, training, ...).",
    )
    primitive: str = Field(description="A registered primitive; `crate-compose list primitives` shows them all.")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments of the primitive, checked against its own argument model; sizes that follow "
        "from the input (such as d) are inferred.",
    )
    layer_scale: float | None = Field(
        default=None,
        description="LayerScale (CaiT; ToST, CRATE-alpha): scale the step's residual branch by a learned "
        "per-channel gamma initialized to this value. Only for steps with a residual (Z + f(Z)).",
    )
    tie: dict[str, str] = Field(
        default_factory=dict,
        description="Weight ties: this step's parameter -> an earlier step's parameter, by module path "
        "(e.g. {weight: preprocess.embed.weight}: the language-model head shares the token embedding, as "
        "GPT-2 and causal CRATE do). One tensor, counted once, saved once.",
    )
    inverts: str | None = Field(
        default=None,
        description="The encoder step this step undoes, as 'preprocess.NAME' or 'encoder.layer.NAME'; written "
        "by decoder derivation, drawn as a dashed edge in diagrams.",
    )

    _name = field_validator("name")(classmethod(lambda cls, name: _usable_name(name)))

    @field_validator("tie")
    @classmethod
    def _tie_paths(cls, tie: dict[str, str]) -> dict[str, str]:
        dotted = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$"
        for own, source in tie.items():
            if not re.match(dotted, own) or not re.match(dotted, source) or "." not in source:
                raise ValueError(
                    f"tie {own}: {source}: write PARAMETER: MODULE.PATH.PARAMETER, e.g. weight: preprocess.embed.weight"
                )
        return tie

    @field_validator("layer_scale")
    @classmethod
    def _finite_scale(cls, value: float | None) -> float | None:
        if value is not None and not (value == value and abs(value) != float("inf")):
            raise ValueError("layer_scale must be a finite number")
        return value


def _unique_names(steps: list[Step]) -> list[Step]:
    seen: set[str] = set()
    for step in steps:
        if step.name in seen:
            raise ValueError(f"step name '{step.name}' is used twice in this list")
        seen.add(step.name)
    return steps


class Stack(_Model):
    """Layers (an ordered list of steps repeated ``depth`` times, fresh weights each time), with
    optional steps before and after them."""

    pre: list[Step] = Field(
        default_factory=list,
        description="Steps before the layers (a decoder's mask tokens, a class token before class attention).",
    )
    depth: int = Field(
        ge=1,
        le=MAX_DEPTH,
        description=f"Number of layers L (at most {MAX_DEPTH}); each repeats `layer` with fresh weights.",
    )
    layer: list[Step] = Field(min_length=1, description="The steps of one layer, in order.")
    post: list[Step] = Field(
        default_factory=list,
        description="Steps after the layers (a final LayerNorm; a decoder's pixel prediction).",
    )

    _check_lists = field_validator("pre", "layer", "post")(_unique_names)

    @model_validator(mode="after")
    def _pre_post_names(self) -> "Stack":
        names = [s.name for s in (*self.pre, *self.post)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"step names {twice} are used in both pre and post")
        return self


class Derive(_Model):
    """A decoder derived from the encoder: each step replaced by its inverse, in reverse order."""

    derive: Literal["inverse"] = Field(
        description="'inverse': decoder layer l undoes encoder layer L-l, untied weights (001 Sec. 2.4-2.5)."
    )
    form: Literal["code", "listing3"] = Field(
        default="code",
        description="'code': as the authors' CRATE-MAE code computes it (decoder steps add back the "
        "un-normalized input, no positions re-added, final LayerNorm eps 1e-6); 'listing3': paper 001's "
        "Listing 3 (LN Y - MSSA(LN Y)) with positions re-added where the decoder starts.",
    )


def _decoder_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "derive" if "derive" in value else "stack"
    return "derive" if isinstance(value, Derive) else "stack"


Decoder = Annotated[
    Union[Annotated[Stack, Tag("stack")], Annotated[Derive, Tag("derive")]], Discriminator(_decoder_kind)
]


class Input(_Model):
    """The network's input, per sample (the batch axis is not written)."""

    name: str = Field(default="images", description="Name of the graph input (e.g. 'images', 'tokens').")

    _name = field_validator("name")(classmethod(lambda cls, name: _usable_name(name)))
    shape: list[int] = Field(
        min_length=1,
        description="Shape of one sample, without the batch axis: [C, H, W] for images; [N] for token ids, "
        "where N is the context size (any shorter sequence is taken too).",
    )
    dtype: Literal["float32", "int64"] = Field(
        default="float32", description="float32 for pixels or features, int64 for token ids."
    )

    @field_validator("shape")
    @classmethod
    def _positive(cls, shape: list[int]) -> list[int]:
        if any(size < 1 for size in shape):
            raise ValueError(f"every size must be positive; got {shape}")
        return shape


class Reference(_Model):
    """What the paper reports for this architecture, checked by the tests and shown by `inspect`."""

    params: int = Field(gt=0, description="Parameter count from the paper's table (all parameters), at least 1.")
    source: str = Field(description="Where the number comes from, e.g. '003 Table 1'.")
    exact: bool = Field(default=True, description="True when a faithful build must match the count exactly.")
    note: str = Field(default="", description="Why a faithful build differs from the paper's count, if it does.")


class Spec(_Model):
    """A white-box network: input -> preprocess -> encoder (x depth) -> decoder -> head."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        max_length=100,
        description="Name of the architecture (e.g. 'crate-base'); at most 100 letters, digits, '.', '_' and '-', "
        "as it names the default build directory out/<name>.",
    )
    description: str = Field(default="", description="One or two sentences for humans.")
    extends: str | None = Field(
        default=None,
        description="A spec file (relative to this one) or zoo preset to inherit from; this file overrides "
        "its keys (mappings merge, lists and values replace). Resolved at load time.",
    )
    sizes: dict[str, int | float | bool | str] = Field(
        default_factory=dict,
        description="Shared sizes declared once (d, heads, depth, ...), referenced anywhere below as '${name}'.",
    )
    input: Input = Field(description="The network's input.")
    preprocess: list[Step] = Field(default_factory=list, description="Steps before the encoder (patch embedding, ...).")
    encoder: Stack = Field(description="The encoder: one layer of steps, repeated depth times.")
    decoder: Decoder | None = Field(
        default=None,
        description="Optional decoder: an explicit stack, or {derive: inverse} to derive it from the encoder.",
    )
    stacks: dict[str, Stack] = Field(
        default_factory=dict,
        description="More named stacks, run in order after the encoder and decoder (e.g. ToST's "
        "class_attention). Each name is an identifier other than preprocess, encoder, decoder, stacks, head.",
    )
    head: list[Step] = Field(default_factory=list, description="Steps after every stack (task head).")
    reference: Reference | None = Field(default=None, description="The paper's parameter count for this model.")

    _check_preprocess = field_validator("preprocess", "head")(_unique_names)
    _locations: dict = PrivateAttr(default_factory=dict)  # key path -> Location, set by the loader
    _references: dict = PrivateAttr(default_factory=dict)  # key path -> size name, for values written "${name}"
    _swaps: dict = PrivateAttr(default_factory=dict)  # step path -> reading.Swap (the replaced primitive, its args)
    _notes: list = PrivateAttr(default_factory=list)  # what loading did that a user should hear about

    def swaps(self) -> dict[tuple, Any]:
        """Steps whose primitive an override or a patch replaced: step path -> what it replaced
        (``.primitive`` and its ``.args``)."""
        return self._swaps

    def notes(self) -> list[str]:
        """What loading did on its own (a variant's name, a dropped reference, dropped arguments)."""
        return self._notes

    def __eq__(self, other: object) -> bool:
        """Specs are equal when they describe the same network; where they were written is not compared."""
        if not isinstance(other, Spec):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # mutable, like every pydantic model

    def sizes_given_elsewhere(self, path: tuple[str | int, ...], scope: tuple[str | int, ...] | None = None) -> str:
        """Where the sizes used under ``scope`` (default: ``path``) were given, when that is another
        file or a ``--set`` than where ``path`` is written (``${d} given at child.yaml:4:3``), and the
        input shape, likewise; ``""`` when all were written beside ``path``."""
        home = getattr(self.locate(path), "source", None)
        scope = tuple(path if scope is None else scope)
        given = []
        shape = self.locate(("input", "shape"))
        if shape is not None and getattr(shape, "source", None) != home:
            given.append(f"the input shape is given at {shape}")
        for where, name in self._references.items():  # the step's own sizes, and the input's (every step sees it)
            if tuple(where[: len(scope)]) == scope or where[:1] == ("input",):
                at = self.locate(("sizes", name))
                if at is not None and getattr(at, "source", None) != home:
                    given.append(f"${{{name}}} given at {at}")
        return "; ".join(dict.fromkeys(given))

    def locate(self, path: tuple[str | int, ...]) -> Any:
        """Where ``path`` (or its nearest ancestor) was written, if the spec came from a file."""
        for end in range(len(path), -1, -1):
            if path[:end] in self._locations:
                return self._locations[path[:end]]
        return None

    @field_validator("stacks")
    @classmethod
    def _stack_names(cls, stacks: dict[str, Stack]) -> dict[str, Stack]:
        for name in stacks:
            if name in RESERVED:
                raise ValueError(f"stack name '{name}' must be an identifier other than {', '.join(RESERVED)}")
            _usable_name(name)
        return stacks

    def blocks(self) -> Iterator[tuple[str, tuple[str, ...], Stack | Derive]]:
        """The stacks in execution order: ``(role, spec path, stack)``."""
        yield "encoder", ("encoder",), self.encoder
        if self.decoder is not None:
            yield "decoder", ("decoder",), self.decoder
        for name, stack in self.stacks.items():
            yield name, ("stacks", name), stack

    def step_lists(self) -> Iterator[tuple[str, tuple[str, ...], list[Step]]]:
        """Each list of steps in execution order: ``(role, spec path, steps)``."""
        yield "preprocess", ("preprocess",), self.preprocess
        for role, path, stack in self.blocks():
            if isinstance(stack, Stack):
                for part in PARTS:
                    yield role, (*path, part), getattr(stack, part)
        yield "head", ("head",), self.head

    def stages(self) -> Iterator[tuple[str, int | None, tuple[str | int, ...], Step]]:
        """Every step in execution order: ``(role, layer index or None, spec path, step)``."""
        for role, path, steps in self.step_lists():
            layers = range(self._stack(path).depth) if path[-1] == "layer" else [None]
            for layer in layers:
                for i, step in enumerate(steps):
                    yield role, layer, (*path, i), step

    def _stack(self, path: tuple[str, ...]) -> Stack:
        return self.stacks[path[1]] if path[0] == "stacks" else getattr(self, path[0])

    def step_counts(self) -> dict[tuple[str, ...], int]:
        """Steps each list contributes to the unrolled network (a layer: its steps times the depth;
        a derived decoder: as many as the encoder), keyed by where the count is written."""
        counts = {}
        for _, path, steps in self.step_lists():
            if not steps:
                continue
            depth = self._stack(path).depth if path[-1] == "layer" else 1
            where = (*path[:-1], "depth") if depth > len(steps) else path  # the larger factor
            counts[where] = len(steps) * depth
        if isinstance(self.decoder, Derive):
            counts[("decoder",)] = sum(n for path, n in counts.items() if path[0] == "encoder")
        return counts

    @model_validator(mode="after")
    def _no_name_clash(self) -> "Spec":
        once = Counter(s.name for _, path, steps in self.step_lists() if path[-1] != "layer" for s in steps)
        twice = sorted(name for name, count in once.items() if count > 1)
        if twice:
            raise ValueError(f"step names {twice} are used in more than one list outside the layers")
        return self


PARTS = ("pre", "layer", "post")  # the lists of steps of a stack, in execution order


REFERENCE = re.compile(r"\$\{([^}]*)\}")
