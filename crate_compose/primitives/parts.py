"""Parameter shapes of torch's building blocks, for footprints (no torch imported).

Each function returns ``{name: shape}`` as the block's ``named_parameters`` would, under the
attribute name the module gives it (``linear("subspaces", d, K * p, bias=False)`` is
``{"subspaces.weight": (K * p, d)}``).
"""

from __future__ import annotations

Shape = tuple[int, ...]


def linear(name: str, inputs: int, outputs: int, *, bias: bool = True) -> dict[str, Shape]:
    """``nn.Linear(inputs, outputs)``: weight ``(outputs, inputs)``, bias ``(outputs,)``."""
    out = {f"{name}.weight": (outputs, inputs)}
    return {**out, f"{name}.bias": (outputs,)} if bias else out


def layernorm(name: str, dim: int, *, present: bool = True, bias: bool = True) -> dict[str, Shape]:
    """``LayerNorm(dim)`` with affine weights (``bias=False``: the scale only); nothing when the step has
    none (``norm: false``)."""
    if not present:
        return {}
    prefix = f"{name}." if name else ""  # a LayerNorm step of its own names its tensors weight and bias
    return {f"{prefix}weight": (dim,), f"{prefix}bias": (dim,)} if bias else {f"{prefix}weight": (dim,)}


def conv2d(name: str, inputs: int, outputs: int, kernel: int, *, bias: bool = True) -> dict[str, Shape]:
    """``nn.Conv2d(inputs, outputs, kernel)``: weight ``(outputs, inputs, kernel, kernel)``."""
    out = {f"{name}.weight": (outputs, inputs, kernel, kernel)}
    return {**out, f"{name}.bias": (outputs,)} if bias else out


def batchnorm(name: str, channels: int) -> dict[str, Shape]:
    """``nn.BatchNorm2d(channels)``: weight and bias (its running statistics are buffers)."""
    return {f"{name}.weight": (channels,), f"{name}.bias": (channels,)}
