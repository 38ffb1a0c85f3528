"""CRATE-MAE: derived decoders, masking, the reconstruction loss, and learning on synthetic images."""

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import crate_compose as cc
import crate_compose.cli
from crate_compose.errors import SpecError

SMALL = [
    "sizes.image_size=32",
    "sizes.patch_size=8",
    "sizes.d=32",
    "sizes.heads=2",
    "sizes.head_dim=16",
    "sizes.depth=2",
]


# --------------------------------------------------------------- an independent Listing 3 (paper 001, App. B.2)


class ListingMSSA(torch.nn.Module):
    """MSSA of Listing 1: qkv = Linear(dim, inner, bias=False); to_out = Linear(inner, dim)."""

    def __init__(self, dim, heads, dim_head):
        super().__init__()
        self.heads, self.scale = heads, dim_head**-0.5
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
    model = cc.build("crate-mae-base", overrides=[*SMALL, "decoder.form=listing3"], dtype=dtype)
    reference = ListingDecoderLayer(32, 2, 16).to(dtype)
    x = torch.randn(3, 17, 32, dtype=dtype)
    for layer in range(2):
        _copy_decoder_layer(model, layer, reference)
        ours = model.get_submodule(f"decoder.layer_{layer}.inverse_compress")(
            model.get_submodule(f"decoder.layer_{layer}.inverse_sparsify")(x)
        )
        torch.testing.assert_close(ours, reference(x), atol=tol, rtol=tol)


# --------------------------------------------------------------- an independent transcription of the authors' code


class AuthorsDecoderLayer(ListingDecoderLayer):
    """The authors' CRATE-MAE decoder block: the residual adds back the un-normalized y (docs/spec.md)."""

    def forward(self, x):
        y = self.f_linear(self.ln1(x))
        return y - self.attn(self.ln2(y))


class AuthorsCrateMAE(torch.nn.Module):
    """CRATE-MAE as the authors' code computes it (docs/spec.md), masking ratio 0: strided-conv patch
    embedding with bias and no LayerNorm, class token, fixed sine-cosine positions added once, CRATE encoder
    layers, LN(eps 1e-6); derived decoder layers with the un-normalized residual, LN(eps 1e-6), pixel head,
    class token dropped. Weights are copied from a built model; the formulas are written here."""

    def __init__(self, model, layers):
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, images):
        m = self.model
        x = F.conv2d(images, m.preprocess.patch_embed.project.weight, m.preprocess.patch_embed.project.bias, stride=8)
        x = rearrange(x, "b d h w -> b (h w) d")
        x = torch.cat([m.preprocess.class_token.token.expand(len(x), -1, -1), x], dim=1)
        x = x + m.preprocess.positions.embedding
        for layer in range(self.layers):
            compress = m.get_submodule(f"encoder.layer_{layer}.compress")
            u = F.layer_norm(x, (32,), compress.norm.weight, compress.norm.bias)
            w = rearrange(F.linear(u, compress.subspaces.weight), "b n (h p) -> b h n p", h=2)
            attn = torch.softmax(w @ w.transpose(-1, -2) * 16**-0.5, dim=-1)
            x = x + F.linear(rearrange(attn @ w, "b h n p -> b n (h p)"), compress.out.weight, compress.out.bias)
            sparsify = m.get_submodule(f"encoder.layer_{layer}.sparsify")
            u, D = F.layer_norm(x, (32,), sparsify.norm.weight, sparsify.norm.bias), sparsify.dictionary
            x = F.relu(u + 0.1 * (u @ D - (u @ D.T) @ D) - 0.1 * 0.5)  # ISTA, 003 eq. 17 in rows
        norm = m.encoder.norm
        x = F.layer_norm(x, (32,), norm.weight, norm.bias, eps=1e-6)
        for layer in range(self.layers):
            reference = AuthorsDecoderLayer(32, 2, 16).to(x.dtype)
            _copy_decoder_layer(m, layer, reference)
            x = reference(x)
        head = m.decoder.inverse_patch_embed
        x = F.linear(
            F.layer_norm(x, (32,), head.norm.weight, head.norm.bias, eps=1e-6), head.predict.weight, head.predict.bias
        )
        return x[:, 1:]


def test_crate_mae_computes_what_the_authors_code_computes():
    model = cc.build("crate-mae-base", overrides=[*SMALL, "sizes.mask_ratio=0"], dtype=torch.float64).eval()
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(images)["output"], AuthorsCrateMAE(model, 2)(images), atol=1e-12, rtol=1e-12)
        layer = AuthorsDecoderLayer(32, 2, 16).double()
        _copy_decoder_layer(model, 0, layer)
        listing = ListingDecoderLayer(32, 2, 16).double()
        listing.load_state_dict(layer.state_dict())
        x = torch.randn(2, 17, 32, dtype=torch.float64)
        assert (layer(x) - listing(x)).abs().max() > 1e-3  # the two forms differ: the check can fail


def test_decoder_mirrors_encoder_with_untied_weights():
    spec = cc.derive("crate-mae-base", SMALL)
    assert [s.primitive for s in spec.decoder.layer] == ["dictionary", "mssa_ascent"]
    assert [s.inverts for s in spec.decoder.layer] == ["encoder.layer.sparsify", "encoder.layer.compress"]
    assert spec.decoder.pre == []  # the authors' code adds positions once, at the encoder input
    assert [s.primitive for s in spec.decoder.post] == ["drop_tokens", "pixel_head"]
    assert spec.decoder.post[1].args["eps"] == 1e-6 and spec.decoder.layer[1].args["residual"] == "input"
    listing = cc.derive("crate-mae-base", [*SMALL, "decoder.form=listing3"])
    assert [s.primitive for s in listing.decoder.pre] == ["positions"]
    assert listing.decoder.post[1].args["eps"] == 1e-5 and listing.decoder.layer[1].args["residual"] == "normalized"
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
    assert model(images)["output"].shape == (2, 16, 8 * 8 * 3)
    assert cc.cli.main(["derive", "vit"]) == 2
    assert "no inverse" in capsys.readouterr().err


@pytest.mark.parametrize(
    "preset, authors, d", [("crate-mae-small", 25_405_824, 576), ("crate-mae-base", 44_638_464, 768)]
)
def test_mae_presets_count_the_authors_code_less_its_unused_tensors(preset, authors, d):
    summary = cc.inspect(preset)
    unused_decoder_embedding = d * d + d  # defined by the authors' code, never used (specs/mae.yaml's note)
    unused_decoder_positions = 197 * d  # a frozen sine-cosine table the code defines and never adds
    assert summary.params_total == authors - unused_decoder_embedding - unused_decoder_positions
    assert summary.reference["params"] == authors and not summary.reference["exact"]
    assert "Linear(d, d)" in summary.reference["note"]
    assert summary.params_total - summary.params_trainable == 197 * d  # the encoder's sine-cosine table
    listing = cc.inspect(preset, ["decoder.form=listing3"])  # positions added again where the decoder starts
    assert listing.params_total == authors - unused_decoder_embedding  # 25,073,472 and 44,047,872 (specs/mae.yaml)


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


@pytest.mark.slow  # a full training run (about a minute): make test-long
def test_crate_mae_learns_masked_reconstruction():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = cc.build("crate-mae-base", overrides=[*SMALL, "sizes.d=64", "sizes.heads=4"], seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    data = _synthetic_images(256, generator)
    losses = []
    for _step in range(60):
        batch = data[torch.randint(0, 256, (32,), generator=generator)]
        loss = cc.reconstruction_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert last < 0.3 * first, f"masked reconstruction loss went from {first:.4f} to {last:.4f}"
