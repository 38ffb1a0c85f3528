"""CRATE-MAE: derived decoders, masking, the reconstruction loss, and learning on synthetic images."""

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import crate_compose as cc
import crate_compose.cli
from crate_compose.errors import SpecError

SMALL = ["sizes.image_size=32", "sizes.patch_size=8", "sizes.d=32", "sizes.heads=2", "sizes.head_dim=16",
         "sizes.depth=2"]


# --------------------------------------------------------------- an independent Listing 3 (paper 001, App. B.2)

class ListingMSSA(torch.nn.Module):
    """MSSA of Listing 1: qkv = Linear(dim, inner, bias=False); to_out = Linear(inner, dim)."""

    def __init__(self, dim, heads, dim_head):
        super().__init__()
        self.heads, self.scale = heads, dim_head ** -0.5
        self.qkv = torch.nn.Linear(dim, heads * dim_head, bias=False)
        self.to_out = torch.nn.Linear(heads * dim_head, dim)

    def forward(self, x):
        w = rearrange(self.qkv(x), "b n (h d) -> b h n d", h=self.heads)
        attn = torch.softmax(w @ w.transpose(-1, -2) * self.scale, dim=-1)
        return self.to_out(rearrange(attn @ w, "b h n d -> b n (h d)"))


class ListingDecoderLayer(torch.nn.Module):
    """One iteration of Listing 3's loop: x_ = f_linear(ln1(x)); x = ln2(x_) - attn(ln2(x_))."""

    def __init__(self, dim, heads, dim_head):
        super().__init__()
        self.ln1, self.f_linear = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, dim, bias=False)
        self.ln2, self.attn = torch.nn.LayerNorm(dim), ListingMSSA(dim, heads, dim_head)

    def forward(self, x):
        x_ = self.f_linear(self.ln1(x))
        return self.ln2(x_) - self.attn(self.ln2(x_))


def _copy_decoder_layer(model, layer, reference):
    dictionary = model.get_submodule(f"decoder.layer_{layer}.inverse_sparsify")
    ascent = model.get_submodule(f"decoder.layer_{layer}.inverse_compress")
    with torch.no_grad():
        reference.ln1.load_state_dict(dictionary.norm.state_dict())
        reference.f_linear.weight.copy_(dictionary.dictionary)
        reference.ln2.load_state_dict(ascent.norm.state_dict())
        reference.attn.qkv.weight.copy_(ascent.subspaces.weight)
        reference.attn.to_out.load_state_dict(ascent.out.state_dict())


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_derived_decoder_layer_equals_listing_3(dtype, tol):
    model = cc.build("crate-mae-base", overrides=SMALL, dtype=dtype)
    reference = ListingDecoderLayer(32, 2, 16).to(dtype)
    x = torch.randn(3, 17, 32, dtype=dtype)
    for layer in range(2):
        _copy_decoder_layer(model, layer, reference)
        ours = model.get_submodule(f"decoder.layer_{layer}.inverse_compress")(
            model.get_submodule(f"decoder.layer_{layer}.inverse_sparsify")(x)
        )
        torch.testing.assert_close(ours, reference(x), atol=tol, rtol=tol)


def test_decoder_mirrors_encoder_with_untied_weights():
    spec = cc.derive("crate-mae-base", SMALL)
    assert [s.primitive for s in spec.decoder.layer] == ["dictionary", "mssa_ascent"]
    assert [s.inverts for s in spec.decoder.layer] == ["encoder.layer.sparsify", "encoder.layer.compress"]
    assert [s.primitive for s in spec.decoder.pre] == ["positions"]
    assert [s.primitive for s in spec.decoder.post] == ["drop_tokens", "pixel_head"]
    assert spec.decoder.depth == spec.encoder.depth
    model = cc.build(spec)
    encoder_u = model.get_submodule("encoder.layer_1.compress").subspaces.weight
    decoder_u = model.get_submodule("decoder.layer_0.inverse_compress").subspaces.weight
    assert encoder_u.shape == decoder_u.shape and encoder_u.data_ptr() != decoder_u.data_ptr()
    assert not torch.equal(encoder_u, decoder_u)


def test_derive_names_the_step_without_inverse_and_the_ones_with():
    with pytest.raises(SpecError) as caught:
        cc.derive("vit")
    problems = caught.value.problems
    assert {p.path for p in problems} == {("encoder", "layer", 0), ("encoder", "layer", 1)}
    assert "'attend' (mhsa) has no inverse" in problems[0].message
    assert "mssa" in problems[0].hint and "ista" in problems[0].hint
    assert problems[0].location.line == 29


def test_derive_cli_writes_a_spec_that_builds(tmp_path, capsys):
    out = tmp_path / "ae.yaml"
    assert cc.cli.main(["derive", "crate-tiny", *sum((["--set", o] for o in SMALL), []), "--out", str(out)]) == 0
    assert "the head is left out" in capsys.readouterr().out
    assert "# The head [classify (classify)] is left out" in out.read_text()
    model = cc.build(out)
    images = torch.randn(2, 3, 32, 32)
    assert model(images).shape == (2, 16, 8 * 8 * 3)
    assert cc.cli.main(["derive", "vit"]) == 2
    assert "no inverse" in capsys.readouterr().err


@pytest.mark.parametrize("preset, paper", [("crate-mae-small", 25_400_000), ("crate-mae-base", 44_600_000)])
def test_mae_presets_within_two_percent_and_explained(preset, paper):
    summary = cc.inspect(preset)
    assert abs(summary.params_total - paper) / paper < 0.02
    d = {"crate-mae-small": 576, "crate-mae-base": 768}[preset]
    unused_decoder_embedding = d * d + d  # the authors' code defines it and never uses it (DESIGN section 2)
    assert abs(summary.params_total + unused_decoder_embedding - paper) / paper < 0.001
    assert summary.reference["params"] == paper and "Linear(d, d)" in summary.reference["note"]
    frozen = summary.params_total - summary.params_trainable
    n = 197
    assert frozen == 2 * n * d  # encoder and decoder sine-cosine tables


@pytest.mark.parametrize("spec", ["crate-mae-base", "mae-drop"])
def test_mask_hides_the_requested_fraction(spec):
    torch.manual_seed(0)
    model = cc.build(spec, overrides=SMALL)
    out = model(torch.randn(4, 3, 32, 32))
    assert out["output"].shape == (4, 16, 192)
    assert out["mask"].shape == (4, 16)
    assert torch.all(out["mask"].sum(1) == 12)  # 75% of 16 patches
    assert not torch.equal(out["mask"][0], out["mask"][1])  # a fresh mask per image


def test_drop_mode_encoder_sees_only_visible_tokens():
    model = cc.build("mae-drop", overrides=SMALL)
    summary = cc.summarize(model)
    shapes = {row.module: row.output_shape for row in summary.steps}
    assert shapes["preprocess.mask"] == ["B", 4, 32]  # 16 patches, 4 visible
    assert shapes["encoder.layer_1.sparsify"] == ["B", 5, 32]  # plus the class token
    assert shapes["decoder.inverse_mask"] == ["B", 17, 32]  # mask tokens back in place


def test_drop_mode_unmask_restores_positions():
    """Visible tokens come back at their own positions; hidden ones become the mask token."""
    model = cc.build("mae-drop", overrides=SMALL)
    masker, unmasker = model.get_submodule("preprocess.mask"), model.get_submodule("decoder.inverse_mask")
    x = torch.randn(2, 16, 32)
    visible, mask, restore = masker(x)
    class_token = torch.randn(2, 1, 32)  # added after masking, so the decoder's unmask keeps it in front
    back = unmasker(torch.cat([class_token, visible], dim=1), restore)
    assert torch.equal(back[:, :1], class_token)
    back, hidden = back[:, 1:], mask.bool()
    torch.testing.assert_close(back[~hidden], x[~hidden])
    assert torch.all(back[hidden] == unmasker.mask_token.reshape(-1))


def test_replace_mode_leaves_visible_tokens_and_class_token_alone():
    model = cc.build("crate-mae-base", overrides=SMALL)
    masker = model.get_submodule("preprocess.mask")
    x = torch.randn(2, 16, 32)
    replaced, mask, _ = masker(x)
    hidden = mask.bool()
    torch.testing.assert_close(replaced[~hidden], x[~hidden])
    assert torch.all(replaced[hidden] == masker.mask_token.reshape(-1))


def test_masked_loss_counts_hidden_patches_only():
    images = torch.randn(2, 3, 32, 32)
    target = rearrange(images, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=8, p2=8)
    mask = torch.zeros(2, 16)
    mask[:, :4] = 1
    prediction = target.clone()
    prediction[:, 4:] += 100.0  # errors on visible patches must not count
    prediction[:, :4] += 1.0
    loss = cc.masked_reconstruction_loss(prediction, images, mask, 8)
    assert loss.item() == pytest.approx(1.0)
    assert F.mse_loss(prediction, target).item() > 1000


def _synthetic_images(count, generator):
    """Smooth colour blobs on a gradient: structure a masked autoencoder can learn to fill in."""
    grid = torch.linspace(-1, 1, 32)
    yy, xx = torch.meshgrid(grid, grid, indexing="ij")
    centers = torch.rand(count, 2, generator=generator) * 1.4 - 0.7
    colours = torch.rand(count, 3, 1, 1, generator=generator)
    radius = ((yy - centers[:, :1, None]) ** 2 + (xx - centers[:, 1:, None]) ** 2).unsqueeze(1)
    blob = torch.exp(-radius / 0.15)
    return colours * blob + 0.3 * xx.expand(count, 1, 32, 32)


def test_crate_mae_learns_masked_reconstruction():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = cc.build("crate-mae-base", overrides=[*SMALL, "sizes.d=64", "sizes.heads=4"], seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    data = _synthetic_images(256, generator)
    losses = []
    for step in range(60):
        batch = data[torch.randint(0, 256, (32,), generator=generator)]
        loss = cc.reconstruction_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert last < 0.3 * first, f"masked reconstruction loss went from {first:.4f} to {last:.4f}"
