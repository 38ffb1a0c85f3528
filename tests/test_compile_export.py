"""The built module is ordinary PyTorch: it compiles without graph breaks and exports."""

import torch

import crate_compose as cc

SMALL = [
    "sizes.d=32",
    "sizes.heads=2",
    "sizes.head_dim=16",
    "sizes.depth=2",
    "sizes.image_size=32",
    "sizes.patch_size=8",
    "sizes.classes=10",
]


def _model():
    return cc.build("crate-tiny", overrides=SMALL, seed=0).eval()


def test_torch_compile_fullgraph_matches_eager():
    model = _model()
    images = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(model, fullgraph=True)  # inductor: generates and compiles C++
    torch.testing.assert_close(compiled(images), model(images), atol=1e-5, rtol=1e-5)


def test_torch_export_matches_eager():
    model = _model()
    images = torch.randn(2, 3, 32, 32)
    exported = torch.export.export(model, (images,))
    torch.testing.assert_close(exported.module()(images), model(images), atol=1e-5, rtol=1e-5)
    other = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(exported.module()(other), model(other), atol=1e-5, rtol=1e-5)


def test_masked_autoencoder_exports_with_its_named_outputs():
    model = cc.build(
        "mae-drop",
        overrides=[
            "sizes.image_size=32",
            "sizes.patch_size=8",
            "sizes.d=32",
            "sizes.heads=2",
            "sizes.head_dim=16",
            "sizes.depth=1",
        ],
    )
    images = torch.randn(2, 3, 32, 32)
    exported = torch.export.export(model, (images,))
    torch.manual_seed(1)
    expected = model(images)
    torch.manual_seed(1)
    got = exported.module()(images)
    assert set(got) == {"output", "mask", "restore"}
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], atol=1e-5, rtol=1e-5)
