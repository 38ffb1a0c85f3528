"""The spec language: a network as pre-processing steps, a layer of steps repeated ``depth``
times, an optional decoder, and a head.

Every model rejects unknown keys; every field has a description, so ``crate-compose schema``
is the reference of the language. A step names a registered primitive and gives its arguments;
the arguments are validated against that primitive's own model (see
:mod:`crate_compose.registry`). See ``docs/spec.md`` for a tour.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Iterator, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, Tag, field_validator, model_validator

IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
ROLES = ("preprocess", "encoder", "decoder", "head")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Step(_Model):
    """One optimization step: a registered primitive and its arguments."""

    name: str = Field(
        pattern=IDENTIFIER,
        description="Name of the step, unique within its list; names the submodule and the graph node "
        "(e.g. 'compress', 'sparsify').",
    )
    primitive: str = Field(description="A registered primitive; `crate-compose list primitives` shows them all.")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments of the primitive, checked against its own argument model; sizes that follow "
        "from the input (such as d) are inferred.",
    )
    inverts: str | None = Field(
        default=None,
        description="The encoder step this step undoes, as 'preprocess.NAME' or 'encoder.layer.NAME'; written "
        "by decoder derivation, drawn as a dashed edge in diagrams.",
    )


def _unique_names(steps: list[Step]) -> list[Step]:
    seen: set[str] = set()
    for step in steps:
        if step.name in seen:
            raise ValueError(f"step name '{step.name}' is used twice in this list")
        seen.add(step.name)
    return steps


class Stack(_Model):
    """A layer (an ordered list of steps) repeated ``depth`` times, each repetition with its own weights."""

    depth: int = Field(ge=1, description="Number of layers L; each repeats `layer` with fresh weights.")
    layer: list[Step] = Field(min_length=1, description="The steps of one layer, in order.")

    _check_layer = field_validator("layer")(_unique_names)


class DecoderStack(_Model):
    """A decoder: optional steps before and after its layers, and the layers themselves."""

    pre: list[Step] = Field(
        default_factory=list,
        description="Steps before the decoder layers (mask tokens, decoder position embeddings).",
    )
    depth: int = Field(ge=1, description="Number of decoder layers; each repeats `layer` with fresh weights.")
    layer: list[Step] = Field(min_length=1, description="The steps of one decoder layer, in order.")
    post: list[Step] = Field(
        default_factory=list,
        description="Steps after the decoder layers (dropping the class token, predicting pixels).",
    )

    _check_lists = field_validator("pre", "layer", "post")(_unique_names)


class Derive(_Model):
    """A decoder derived from the encoder: each step replaced by its inverse, in reverse order."""

    derive: Literal["inverse"] = Field(
        description="'inverse': decoder layer l undoes encoder layer L-l, untied weights (001 Sec. 2.4-2.5)."
    )


def _decoder_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "derive" if "derive" in value else "stack"
    return "derive" if isinstance(value, Derive) else "stack"


Decoder = Annotated[
    Union[Annotated[DecoderStack, Tag("stack")], Annotated[Derive, Tag("derive")]], Discriminator(_decoder_kind)
]


class Input(_Model):
    """The network's input, per sample (the batch axis is not written)."""

    name: str = Field(default="images", pattern=IDENTIFIER, description="Name of the graph input (e.g. 'images').")
    shape: list[int] = Field(
        min_length=1, description="Shape of one sample, without the batch axis: [C, H, W] for images."
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

    params: int = Field(ge=0, description="Parameter count from the paper's table (all parameters).")
    source: str = Field(description="Where the number comes from, e.g. '003 Table 1'.")
    exact: bool = Field(default=True, description="True when a faithful build must match the count exactly.")
    note: str = Field(default="", description="Why a faithful build differs from the paper's count, if it does.")


class Spec(_Model):
    """A white-box network: input -> preprocess -> encoder (x depth) -> decoder -> head."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Name of the architecture (e.g. 'crate-base'); letters, digits, '.', '_' and '-', as it "
        "names the default build directory out/<name>.",
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
    head: list[Step] = Field(default_factory=list, description="Steps after the encoder and decoder (task head).")
    reference: Reference | None = Field(default=None, description="The paper's parameter count for this model.")

    _check_preprocess = field_validator("preprocess", "head")(_unique_names)
    _locations: dict = PrivateAttr(default_factory=dict)  # key path -> Location, set by the loader

    def __eq__(self, other: object) -> bool:
        """Specs are equal when they describe the same network; where they were written is not compared."""
        if not isinstance(other, Spec):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # mutable, like every pydantic model

    def locate(self, path: tuple[str | int, ...]) -> Any:
        """Where ``path`` (or its nearest ancestor) was written, if the spec came from a file."""
        for end in range(len(path), -1, -1):
            if path[:end] in self._locations:
                return self._locations[path[:end]]
        return None

    @model_validator(mode="after")
    def _no_name_clash(self) -> "Spec":
        once = [s.name for path, steps in self.step_lists() if "layer" not in path for s in steps]
        twice = sorted({name for name in once if once.count(name) > 1})
        if twice:
            raise ValueError(f"step names {twice} are used in more than one of preprocess, decoder pre/post, head")
        return self

    def step_lists(self) -> Iterator[tuple[tuple[str, ...], list[Step]]]:
        """Each list of steps with its spec path, in execution order."""
        for path in STEP_LISTS:
            owner: Any = self
            for key in path:
                owner = getattr(owner, key, None)
            if isinstance(owner, list):
                yield path, owner

    def stages(self) -> Iterator[tuple[str, int | None, tuple[str | int, ...], Step]]:
        """Every step in execution order: ``(role, layer index or None, spec path, step)``."""
        for path, steps in self.step_lists():
            block = getattr(self, path[0])
            for layer in range(block.depth) if path[-1] == "layer" else [None]:
                for i, step in enumerate(steps):
                    yield path[0], layer, (*path, i), step


# Where lists of steps live, in execution order.
STEP_LISTS = (
    ("preprocess",),
    ("encoder", "layer"),
    ("decoder", "pre"),
    ("decoder", "layer"),
    ("decoder", "post"),
    ("head",),
)


REFERENCE = re.compile(r"\$\{([^}]*)\}")
