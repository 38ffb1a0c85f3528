"""``dino_head``: DINO's projection head (Caron et al. 2021, Sec. 3.1; ``vision_transformer.py``'s ``DINOHead``).

Checked against an independent implementation written here from DINO's code (an ``nn.Sequential`` of
Linear/GELU, ``F.normalize``, and a last layer whose weight is ``g * v / ‖v‖_row``): the same outputs
with the same weights, the same parameter count at ViT-S/16's sizes, the frozen scale ``g``, the unit
bottleneck, and a spec whose head is ``dino_head``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import crate_compose as cc
from crate_compose import registry
from crate_compose.modules.head import DinoHead

SMALL = {"out_dim": 32, "hidden": 16, "bottleneck": 8}


class ReferenceDinoHead(nn.Module):
    """DINO's DINOHead (use_bn=False) on the class token, written out independently."""

    def __init__(
        self, in_dim: int, out_dim: int, nlayers: int = 3, hidden_dim: int = 2048, bottleneck_dim: int = 256
    ) -> None:
        super().__init__()
        if nlayers == 1:
            self.mlp = nn.Linear(in_dim, bottleneck_dim)
        else:
            layers = [nn.Linear(in_dim, hidden_dim), nn.GELU()]
            for _ in range(nlayers - 2):
                layers += [nn.Linear(hidden_dim, hidden_dim), nn.GELU()]
            layers.append(nn.Linear(hidden_dim, bottleneck_dim))
            self.mlp = nn.Sequential(*layers)
        self.g = nn.Parameter(torch.ones(out_dim, 1))
        self.v = nn.Parameter(torch.randn(out_dim, bottleneck_dim))

    def forward(self, cls: torch.Tensor) -> torch.Tensor:  # (B, d), the backbone's class-token feature
        x = nn.functional.normalize(self.mlp(cls), dim=-1, p=2)
        weight = self.g * self.v / self.v.norm(dim=1, keepdim=True)
        return x @ weight.T


def _ours(dim: int, layers: int, dtype=torch.float32, **kwargs) -> DinoHead:
    torch.manual_seed(0)
    return DinoHead(
        dim,
        SMALL["out_dim"],
        hidden=SMALL["hidden"],
        bottleneck=SMALL["bottleneck"],
        layers=layers,
        norm=False,
        **kwargs,
    ).to(dtype)


def _reference_with(ours: DinoHead, dim: int, layers: int, dtype) -> ReferenceDinoHead:
    reference = ReferenceDinoHead(dim, SMALL["out_dim"], layers, SMALL["hidden"], SMALL["bottleneck"]).to(dtype)
    weights = {name: p for name, p in ours.named_parameters()}
    with torch.no_grad():
        for name, p in reference.mlp.named_parameters():  # the same nn.Sequential numbering as DINO's
            p.copy_(weights[f"mlp.{name}"])
        reference.g.copy_(weights["last_layer.weight_g"])
        reference.v.copy_(weights["last_layer.weight_v"])
    return reference


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-6), (torch.float64, 1e-12)], ids=str)
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_the_head_computes_dinos(layers, dtype, tolerance):
    dim = 24
    ours = _ours(dim, layers, dtype)
    with torch.no_grad():  # g away from 1, so the scale is exercised too
        ours.last_layer.weight_g.uniform_(0.5, 2.0)
    reference = _reference_with(ours, dim, layers, dtype)
    tokens = torch.randn(5, 7, dim, dtype=dtype, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, expected = ours(tokens), reference(tokens[:, 0])
    assert got.shape == (5, SMALL["out_dim"])
    assert (got - expected).abs().max() <= tolerance


def test_pool_and_norm_read_the_token_as_classify_does():
    """``pool: mean`` reads the mean token and ``norm`` is classify's LayerNorm: the same pooled vector."""
    classify = cc.all_primitives()["classify"]
    for pool in ("cls", "mean"):
        torch.manual_seed(0)
        head = DinoHead(16, 8, hidden=8, bottleneck=4, pool=pool)
        torch.manual_seed(0)
        other = classify.build(classify.args.model_validate({"classes": 3, "pool": pool}), (5, 16))
        other.norm.load_state_dict(head.norm.state_dict())
        x = torch.randn(2, 5, 16)
        torch.testing.assert_close(head.pooled(x), other.pooled(x), rtol=0, atol=0)


def test_the_parameter_count_at_vit_s_16_is_dinos():
    """ViT-S/16 (d = 384) with DINO's defaults (65536 prototypes, hidden 2048, bottleneck 256, 3 layers):
    22,352,128 parameters = 788,480 (Linear 384 -> 2048) + 4,196,352 (2048 -> 2048) + 524,544
    (2048 -> 256) + 16,777,216 (weight_v) + 65,536 (weight_g); the same in our head, in DINO's, and in
    the footprint (which adds LN's 768 with ``norm: true``; DINO's ViT has it in its final norm)."""
    with torch.device("meta"):
        reference = ReferenceDinoHead(384, 65536)
        ours = DinoHead(384, 65536, norm=False)
    expected = sum(p.numel() for p in reference.parameters())
    assert expected == 22_352_128
    assert sum(p.numel() for p in ours.parameters()) == expected
    primitive = registry.get("dino_head")
    for norm, extra in ((False, 0), (True, 2 * 384)):
        footprint = primitive.footprint(primitive.args.model_validate({"norm": norm}), (197, 384), registry.Context())
        count = sum(torch.Size(shape).numel() for shape in footprint.parameters.values())
        assert count == expected + extra
        assert footprint.output == (65536,) and footprint.frozen == {"last_layer.weight_g"}
    trainable = sum(p.numel() for p in ours.parameters() if p.requires_grad)
    assert trainable == expected - 65536  # g is frozen at 1 (norm_last_layer: true)


@pytest.mark.parametrize("norm_last_layer", [True, False])
def test_norm_last_layer_freezes_the_scale_at_one(norm_last_layer):
    head = _ours(16, 3, norm_last_layer=norm_last_layer)
    assert torch.equal(head.last_layer.weight_g, torch.ones(SMALL["out_dim"], 1))
    assert head.last_layer.weight_g.requires_grad is not norm_last_layer
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        out = head(torch.randn(4, 3, 16))
        F.cross_entropy(out / 0.1, torch.randint(0, SMALL["out_dim"], (4,))).backward()
        optimizer.step()
    g = head.last_layer.weight_g
    if norm_last_layer:
        assert g.grad is None and torch.equal(g, torch.ones_like(g))
    else:
        assert g.grad is not None and not torch.equal(g, torch.ones_like(g))
    assert not torch.equal(head.last_layer.weight_v, _ours(16, 3).last_layer.weight_v)  # V trains either way


def test_the_initialization_is_dinos():
    head = DinoHead(384, 4096, norm=False)
    linears = [m for m in head.mlp if isinstance(m, nn.Linear)]
    for linear in linears:  # trunc_normal_(std=0.02), bias 0
        assert abs(linear.weight.std().item() - 0.02) < 2e-3 and torch.equal(linear.bias, torch.zeros_like(linear.bias))
    v = head.last_layer.weight_v  # nn.Linear's default: uniform within 1/sqrt(fan_in)
    assert v.abs().max() <= 256**-0.5 and v.abs().max() > 0.9 * 256**-0.5


def test_batch_norm_follows_dinos_use_bn_layout():
    head = DinoHead(16, 8, hidden=12, bottleneck=4, layers=3, batch_norm=True)
    kinds = [type(m).__name__ for m in head.mlp]
    assert kinds == ["Linear", "BatchNorm1d", "GELU", "Linear", "BatchNorm1d", "GELU", "Linear"]
    primitive = registry.get("dino_head")
    args = primitive.args.model_validate({"out_dim": 8, "hidden": 12, "bottleneck": 4, "batch_norm": True})
    footprint = primitive.footprint(args, (5, 16), registry.Context())
    assert footprint.parameters == {n: tuple(p.shape) for n, p in head.named_parameters()}
    assert head.train()(torch.randn(3, 5, 16)).shape == (3, 8)


def test_the_bottleneck_is_a_unit_vector():
    head = _ours(16, 3)
    with torch.no_grad():
        h = head.bottleneck(torch.randn(6, 4, 16) * 10)
    assert h.shape == (6, SMALL["bottleneck"])
    torch.testing.assert_close(h.norm(dim=-1), torch.ones(6), rtol=0, atol=1e-6)


def test_a_spec_with_a_dino_head_builds():
    head = "[{name: dino, primitive: dino_head, args: {out_dim: 32, hidden: 16, bottleneck: 8}}]"
    model = cc.build(
        "crate-digits", overrides=["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1", f"head={head}"]
    )
    out = model(torch.randn(3, 1, 8, 8))["output"]
    assert out.shape == (3, 32) and torch.isfinite(out).all()
    names = {n for n, _ in model.named_parameters()}
    assert {"head.dino.last_layer.weight_g", "head.dino.last_layer.weight_v", "head.dino.mlp.0.weight"} <= names
    assert not model.get_parameter("head.dino.last_layer.weight_g").requires_grad
