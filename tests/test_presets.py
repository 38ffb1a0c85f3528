"""The presets that reach the papers' depth on a laptop (issue 27): CRATE, ToST and CRATE-alpha at 12 layers for
28x28 and 32x32 images (patch 4), their 8x8-digit companions, and ``--name`` for a variant of one's own."""

from __future__ import annotations

import pytest
import torch

import crate_compose as cc
from crate_compose import cli

pytestmark = pytest.mark.usefixtures("one_thread")

DEEP = ["crate-mini", "tost-mini", "crate-alpha-mini"]
DIGITS = ["tost-digits", "crate-alpha-digits"]


@pytest.mark.parametrize("name", DEEP)
@pytest.mark.parametrize("channels, side, tokens", [(1, 28, 49), (3, 32, 64)])
def test_the_deep_presets_take_fashion_mnist_and_cifar_sized_images(name, channels, side, tokens):
    """What the data sets: 49 tokens of 4x4 patches at 28x28 (Fashion-MNIST), 64 at 32x32x3 (a CIFAR folder)."""
    spec = cc.load_spec(name, overrides=[f"sizes.channels={channels}", f"sizes.image_size={side}"])
    assert spec.sizes["depth"] == 12 and spec.sizes["patch_size"] == 4
    model = cc.compile_spec(spec, seed=0).eval()
    patch = next(n for n in model.graph.nodes if n.name == "patch_embed")
    assert patch.meta["shape"] == ("B", tokens, spec.sizes["d"])
    with torch.no_grad():
        logits = model(torch.randn(2, channels, side, side))["output"]
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", DIGITS)
def test_the_digit_companions_of_crate_digits_take_8x8_digits(name):
    model = cc.compile_spec(cc.load_spec(name), seed=0).eval()
    with torch.no_grad():
        assert model(torch.randn(3, 1, 8, 8))["output"].shape == (3, 10)


def test_a_network_changed_on_the_command_line_takes_the_name_given(capsys):
    sets = ["--set", "sizes.d=32", "--set", "sizes.heads=2"]
    assert cli.main(["inspect", "tost-digits", *sets, "--name", "tost-narrow"]) == 0
    assert capsys.readouterr().out.startswith("tost-narrow:")
    assert cli.main(["inspect", "tost-digits", *sets]) == 0
    assert capsys.readouterr().out.startswith("tost-digits.d-32.heads-2:")
