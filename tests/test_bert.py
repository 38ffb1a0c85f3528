"""BERT (Devlin et al. 2019) and CRATE-BERT: specs/bert.yaml counts and computes what transformers' BertForMaskedLM
does; token_embed's segments and mlm_head against their formulas written out here; CRATE-BERT's stated count.

transformers is a test extra (never imported by crate_compose): BertForMaskedLM is built on the meta device for
the count, and at a small, unpublished size with random weights in float64 for the logits.
"""

from __future__ import annotations

import pytest
import torch

import crate_compose as cc
from crate_compose import registry

pytestmark = pytest.mark.usefixtures("one_thread")

BERT_BASE = 109_514_298  # BertForMaskedLM(BertConfig()): the decoder tied to the word embeddings, no pooler
CRATE_BERT_BASE = 45_741_114  # 23,837,184 + 12 x 1,773,312 + 1,536 + 622,650 (specs/crate-bert.yaml)

SMALL = dict(vocab=50, d=32, depth=2, heads=4, context=16, intermediate=128)
SEP = 3  # the [SEP] id of the small models
CLS = 2


def _transformers():
    """transformers, imported after torchvision's missing operators are declared (see tests/test_peers.py)."""
    from crate_compose.data.batches import transforms_v2

    transforms_v2()
    return pytest.importorskip("transformers")


def _small_hf(transformers, seed: int = 0) -> torch.nn.Module:
    config = transformers.BertConfig(
        vocab_size=SMALL["vocab"],
        hidden_size=SMALL["d"],
        num_hidden_layers=SMALL["depth"],
        num_attention_heads=SMALL["heads"],
        intermediate_size=SMALL["intermediate"],
        max_position_embeddings=SMALL["context"],
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = transformers.BertForMaskedLM(config).double().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # every parameter random (biases and LayerNorms too); the tied decoder once
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64) * 0.3)
    return model


def _ours_from(hf: torch.nn.Module) -> torch.nn.Module:
    """specs/bert.yaml at the small sizes, with ``hf``'s tensors copied in by name."""
    sizes = {
        "vocab": SMALL["vocab"],
        "d": SMALL["d"],
        "depth": SMALL["depth"],
        "heads": SMALL["heads"],
        "context": SMALL["context"],
        "sep": SEP,
    }
    model = cc.build("bert", overrides=[f"sizes.{k}={v}" for k, v in sizes.items()], dtype="float64").eval()
    t = hf.state_dict()
    state = {
        "preprocess.embed.weight": t["bert.embeddings.word_embeddings.weight"],
        "preprocess.embed.segment.weight": t["bert.embeddings.token_type_embeddings.weight"],
        "preprocess.positions.embedding": t["bert.embeddings.position_embeddings.weight"][None],
        "preprocess.norm.weight": t["bert.embeddings.LayerNorm.weight"],
        "preprocess.norm.bias": t["bert.embeddings.LayerNorm.bias"],
        "head.mlm.weight": t["cls.predictions.decoder.weight"],  # tied: the word embeddings
        "head.mlm.bias": t["cls.predictions.bias"],
        "head.mlm.dense.weight": t["cls.predictions.transform.dense.weight"],
        "head.mlm.dense.bias": t["cls.predictions.transform.dense.bias"],
        "head.mlm.norm.weight": t["cls.predictions.transform.LayerNorm.weight"],
        "head.mlm.norm.bias": t["cls.predictions.transform.LayerNorm.bias"],
    }
    for i in range(SMALL["depth"]):
        hf_layer, layer = f"bert.encoder.layer.{i}.", f"encoder.layer_{i}."
        for kind in ("weight", "bias"):
            state[f"{layer}attend.qkv.{kind}"] = torch.cat(
                [t[f"{hf_layer}attention.self.{name}.{kind}"] for name in ("query", "key", "value")]
            )
            state[f"{layer}attend.out.{kind}"] = t[f"{hf_layer}attention.output.dense.{kind}"]
            state[f"{layer}attend_norm.{kind}"] = t[f"{hf_layer}attention.output.LayerNorm.{kind}"]
            state[f"{layer}mlp.expand.{kind}"] = t[f"{hf_layer}intermediate.dense.{kind}"]
            state[f"{layer}mlp.contract.{kind}"] = t[f"{hf_layer}output.dense.{kind}"]
            state[f"{layer}mlp_norm.{kind}"] = t[f"{hf_layer}output.LayerNorm.{kind}"]
    model.load_state_dict(state, strict=True)
    return model


def _segments_by_loop(ids: torch.Tensor, sep: int, segments: int) -> torch.Tensor:
    """BERT's token types, written out: the number of [SEP] tokens strictly before each position, at most
    ``segments - 1``."""
    out = torch.zeros_like(ids)
    for b in range(ids.shape[0]):
        seen = 0
        for i in range(ids.shape[1]):
            out[b, i] = min(seen, segments - 1)
            if int(ids[b, i]) == sep:
                seen += 1
    return out


def _ids(rows: list[list[int]], generator: torch.Generator, vocab: int) -> torch.Tensor:
    """Token ids with [SEP] and [CLS] where ``rows`` say (-1: a random ordinary token, never a special)."""
    ordinary = torch.arange(4, vocab)
    out = torch.tensor(rows)
    random = ordinary[torch.randint(len(ordinary), out.shape, generator=generator)]
    return torch.where(out < 0, random, out)


# ---------------------------------------------------------------- BERT against transformers


def test_bert_counts_what_transformers_bert_for_masked_lm_counts():
    transformers = _transformers()
    with torch.device("meta"):
        hf = transformers.BertForMaskedLM(transformers.BertConfig())
    assert hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight  # tied: counted once
    assert sum(p.numel() for p in hf.parameters()) == BERT_BASE
    for name in ("bert", "bert-base"):
        summary = cc.inspect(name)
        assert summary.params_total == BERT_BASE
        assert cc.load_spec(name).reference.params == BERT_BASE


@pytest.mark.parametrize("n", [SMALL["context"], 11])
def test_bert_computes_what_transformers_bert_for_masked_lm_computes(n):
    transformers = _transformers()
    hf = _small_hf(transformers)
    ours = _ours_from(hf)
    generator = torch.Generator().manual_seed(1)
    r = -1
    rows = [
        [CLS, r, r, r, SEP, r, r, r, r, r, SEP, r, r, r, r, SEP],  # [CLS] A [SEP] B [SEP] (and a third: segment 1)
        [CLS, r, r, r, r, r, r, r, SEP, r, r, r, r, r, r, SEP],
        [CLS, r, r, r, r, r, r, r, r, r, r, r, r, r, r, r],  # no [SEP]: all segment 0
    ]
    ids = _ids([row[:n] for row in rows], generator, SMALL["vocab"])
    token_types = _segments_by_loop(ids, SEP, 2)
    assert token_types[0].tolist()[:6] == [0, 0, 0, 0, 0, 1] and token_types[2].sum() == 0
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=token_types).logits  # default mask: every token attended
        got = ours(ids)["output"]
        without_types = hf(input_ids=ids).logits
    assert got.shape == (3, n, SMALL["vocab"]) and got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    assert not torch.allclose(without_types[:2], expected[:2])  # the segments matter


# ---------------------------------------------------------------- token_embed's segments, mlm_head


def _primitive(name: str, args: dict, shape: tuple[int, ...]) -> torch.nn.Module:
    primitive = cc.all_primitives()[name]
    return primitive.build(primitive.args.model_validate(args), shape, registry.Context(ids=name == "token_embed"))


def test_token_embed_with_segments_adds_the_segment_row_counted_from_the_seps_before():
    torch.manual_seed(0)
    embed = _primitive("token_embed", {"vocab": 20, "dim": 8, "segments": 3, "sep": 5}, (10,)).double()
    assert {k: tuple(v.shape) for k, v in embed.state_dict().items()} == {"weight": (20, 8), "segment.weight": (3, 8)}
    assert embed.tokenwise is False  # a token's segment depends on the tokens before it
    ids = torch.tensor(
        [
            [1, 5, 2, 5, 5, 3, 5, 4, 0, 9],  # four [SEP]s: the third segment and beyond clamp to 2
            [5, 5, 1, 2, 3, 4, 6, 7, 8, 9],  # starting with [SEP]: segment 0 for it
            [1, 2, 3, 4, 6, 7, 8, 9, 0, 1],
        ]
    )  # none
    segments = _segments_by_loop(ids, 5, 3)
    assert segments.tolist()[0] == [0, 0, 1, 1, 2, 2, 2, 2, 2, 2] and segments.tolist()[1][:3] == [0, 1, 2]
    expected = torch.stack(
        [
            torch.stack(
                [embed.weight[int(ids[b, i])] + embed.segment.weight[int(segments[b, i])] for i in range(ids.shape[1])]
            )
            for b in range(ids.shape[0])
        ]
    )
    with torch.no_grad():
        torch.testing.assert_close(embed(ids), expected, rtol=0, atol=0)
    # the segment table starts as the token table does: N(0, std^2)
    wide = _primitive("token_embed", {"vocab": 4, "dim": 4096, "segments": 2, "sep": 1, "std": 0.5}, (3,))
    assert abs(wide.segment.weight.std().item() - 0.5) < 0.02


def test_token_embed_without_segments_is_as_before():
    torch.manual_seed(0)
    embed = _primitive("token_embed", {"vocab": 20, "dim": 8}, (10,))
    assert list(embed.state_dict()) == ["weight"] and embed.tokenwise is True
    ids = torch.randint(20, (2, 10))
    with torch.no_grad():
        assert torch.equal(embed(ids), embed.weight[ids])
    primitive = cc.all_primitives()["token_embed"]
    assert primitive.update_for({"vocab": 20, "dim": 8}) == "E[ids]"
    assert primitive.update_for({"vocab": 20, "dim": 8, "segments": 2, "sep": 1}) == "E[ids] + S[seg(ids)]"


def test_token_embed_with_segments_needs_sep():
    with pytest.raises(cc.SpecError, match=r"segments: 2 needs sep, the id of the \[SEP\] token"):
        cc.load_spec("bert", overrides=["preprocess.embed.args={vocab: 50, dim: 32, segments: 2}"])
    args = cc.all_primitives()["token_embed"].args
    with pytest.raises(ValueError, match="needs sep"):
        args.model_validate({"vocab": 50, "dim": 32, "segments": 2})
    assert args.model_validate({"vocab": 50, "dim": 32, "sep": 3}).segments == 0  # sep alone: nothing changes


def test_the_footprint_counts_the_segment_table():
    primitive = cc.all_primitives()["token_embed"]
    footprint = primitive.footprint(
        primitive.args.model_validate({"vocab": 20, "dim": 8, "segments": 2, "sep": 1}),
        (10,),
        registry.Context(ids=True),
    )
    assert footprint.parameters == {"weight": (20, 8), "segment.weight": (2, 8)} and footprint.output == (10, 8)


def test_mlm_head_computes_bert_s_formula():
    torch.manual_seed(0)
    head = _primitive("mlm_head", {"vocab": 30}, (7, 16)).double()
    with torch.no_grad():
        for parameter in head.parameters():  # every parameter random (the bias starts at zero)
            parameter.copy_(torch.randn_like(parameter))
    assert head.norm.eps == 1e-12 and head.tokenwise is True
    assert {k: tuple(v.shape) for k, v in head.state_dict().items()} == {
        "weight": (30, 16),
        "bias": (30,),
        "dense.weight": (16, 16),
        "dense.bias": (16,),
        "norm.weight": (16,),
        "norm.bias": (16,),
    }
    z = torch.randn(2, 7, 16, dtype=torch.float64)
    h = z @ head.dense.weight.T + head.dense.bias
    h = 0.5 * h * (1 + torch.erf(h / 2**0.5))  # exact GELU
    mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
    h = (h - mean) / torch.sqrt(var + 1e-12) * head.norm.weight + head.norm.bias
    expected = h @ head.weight.T + head.bias
    with torch.no_grad():
        torch.testing.assert_close(head(z), expected, rtol=0, atol=1e-12)
    assert torch.equal(_primitive("mlm_head", {"vocab": 30}, (7, 16)).bias, torch.zeros(30))


# ---------------------------------------------------------------- CRATE-BERT


def test_crate_bert_base_counts_what_it_states():
    for name in ("crate-bert", "crate-bert-base"):
        assert cc.inspect(name).params_total == CRATE_BERT_BASE
        assert cc.load_spec(name).reference.params == CRATE_BERT_BASE
    spec = cc.load_spec("crate-bert")
    assert not any(step.args.get("causal") for _, _, _, step in spec.stages())  # it reads the whole window


@pytest.mark.parametrize("name", ["bert-mini", "crate-bert-mini", "bert-mini-classify", "crate-bert-mini-classify"])
def test_the_minis_run_and_the_classifiers_read_cls(name):
    """bytes:text's ids (256 bytes, then [PAD] [UNK] [CLS] [SEP] [MASK]): [CLS] A [SEP] B [SEP]."""
    spec = cc.load_spec(name)
    assert (spec.sizes["vocab"], spec.sizes["sep"], spec.sizes["context"]) == (261, 259, 128)
    model = cc.build(spec, seed=0).eval()
    ids = torch.randint(256, (2, 128))
    ids[:, 0], ids[:, 60], ids[:, 127] = 258, 259, 259
    with torch.no_grad():
        out = model(ids)["output"]
    expected = (2, spec.sizes["classes"]) if "classify" in name else (2, 128, 261)
    assert out.shape == expected and torch.isfinite(out).all()
