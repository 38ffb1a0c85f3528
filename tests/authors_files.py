"""Checkpoints of the papers' authors' families, written as their training scripts write them, for the import tests.

``SMALL``: per family, the spec that builds it, small sizes in no published table (the reference's
``state_dict`` draws the tensors), and the ``--set`` overrides the shapes alone cannot give; ``saved`` nests
the state dict and prefixes its keys as the family's script does; ``ours_and_theirs`` runs a built network
and the reference's eager forward on the same input.
"""

from __future__ import annotations

from pathlib import Path

import torch
from reference.authors import forward

TOLERANCE = 1e-10

# family -> (the spec that builds it, the reference's small sizes, --set overrides the shapes cannot give)
SMALL = {
    "crate": (
        "crate-tiny",
        dict(image_size=32, channels=3, patch_size=8, d=48, depth=2, heads=4, head_dim=12, classes=10),
        ["sizes.heads=4"],
    ),
    "crate-mae": (
        "crate-mae-base",
        dict(image_size=32, channels=3, patch_size=8, d=48, depth=2, heads=4, head_dim=12),
        ["sizes.heads=4"],
    ),
    "crate-alpha": (
        "crate-alpha-base16",
        dict(image_size=32, channels=3, patch_size=8, d=48, depth=2, heads=4, head_dim=12, classes=10, ratio=4),
        ["sizes.heads=4"],
    ),  # the final LayerNorm's eps 1e-5 comes from the family
    "tost": (
        "tost-tiny",
        dict(image_size=32, channels=3, patch_size=16, d=64, depth=2, heads=4, class_depth=2, classes=10),
        ["sizes.image_size=32"],
    ),  # positions are computed: no image size
    "tost-lm": ("tost-lm-base", dict(vocab=64, context=16, d=48, depth=2, heads=4, bias=False), []),  # as released
    "crate-lm": ("crate-lm-base", dict(vocab=64, context=16, d=48, depth=2, heads=4, ratio=4), ["sizes.heads=4"]),
}
NESTING = {
    "crate": ("state_dict", "module."),
    "crate-mae": ("model", ""),
    "crate-alpha": (None, ""),
    "tost": ("model", "module."),
    "tost-lm": ("model", "_orig_mod."),
    "crate-lm": ("model", ""),
}


def saved(tmp_path: Path, family: str, tensors: dict, **recorded) -> Path:
    """The state dict as the authors' training script saves it (nested, wrapper prefixes), with what the script
    records beside it (``recorded``: ``arch=``, ``args=argparse.Namespace(...)``, ``model_args=``, ``model_ema=``)."""
    nest, prefix = NESTING[family]
    state = {prefix + k: v for k, v in tensors.items()}
    path = tmp_path / f"{family}.pth"
    torch.save({nest: state, "epoch": 7, **recorded} if nest else state, path)
    return path


def inputs(family: str, sizes: dict) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    if "vocab" in sizes:
        return torch.randint(0, sizes["vocab"], (2, sizes["context"] - 3), generator=generator)
    side = sizes["image_size"]
    return torch.randn(2, sizes["channels"], side, side, generator=generator, dtype=torch.float64)


def ours_and_theirs(
    module, family: str, state: dict, x: torch.Tensor, sizes: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """The built network's output and the reference's, on the same input (and, for CRATE-MAE, the same mask)."""
    torch.manual_seed(3)
    out = module(x)
    mask = out["mask"].bool() if "mask" in out else None
    reference = forward(family, state, x, sizes, mask=mask)
    key = "pred" if family == "crate-mae" else "logits"
    return out["output"], reference[key]
