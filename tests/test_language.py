"""Language models: causal steps, weight ties, cached decoding, training on text, generation.

Formulas are checked against independent transcriptions (a loop over positions, explicit masks);
causality is a property tested with hypothesis over lengths and seeds; cached decoding is checked
against a full recompute at every step.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import crate_compose as cc
from crate_compose import cli, registry
from crate_compose.errors import SpecError, TrainError
from crate_compose.generation.decoding import CachedModel, DecodingError, decode_bytes, encode_bytes, generate
from crate_compose.registry import Context
from crate_compose.settings import Settings

LANGUAGE_PRESETS = ["causal-crate-bytes", "gpt2-bytes", "tost-lm-bytes"]
SMALL = ["sizes.d=32", "sizes.heads=2", "sizes.depth=2", "sizes.context=24", "sizes.vocab=40"]
SHORT = ["sizes.d=64", "sizes.depth=2", "sizes.context=64"]  # a language model that learns in seconds
CAUSAL_STEPS = {  # every causal step of the registry, with arguments for d = 12
    "mssa": {"heads": 3, "causal": True},
    "tssa": {"heads": 3, "causal": True},
    "mhsa": {"heads": 3, "causal": True},
}


def _ln(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps) * w + b


def _randomize(module, seed=3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=param.dtype)
            param.copy_(
                1 + 0.3 * noise
                if param.ndim == 1 and name.endswith("weight")
                else 0.3 * noise
                if param.ndim == 1
                else noise / math.sqrt(param[0].numel())
            )
    return module


def _step(name, args, tokens=10, dim=12, seed=3):
    primitive = registry.get(name)
    module = primitive.build(primitive.args.model_validate(args), (tokens, dim), Context()).double()
    return _randomize(module, seed).eval()


def _x(shape, seed=5):
    return 1.5 * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.3


# ----------------------------------------------------------------------------------------- formulas


def test_causal_tssa_is_tosts_running_sums():
    """Transcribed from book exercise 5.6 (ToST's statistics as running sums), position by position."""
    heads, n, d = 3, 9, 12
    step = _step("tssa", {"heads": heads, "causal": True}, tokens=n, dim=d)
    with torch.no_grad():
        step.temp.copy_(torch.tensor([[0.5], [2.0], [4.0]], dtype=torch.float64))
        step.denom_bias.copy_(0.4 * torch.randn(heads, n, 1, dtype=torch.float64))
    prm = {k: v.detach() for k, v in step.named_parameters()}
    x = _x((2, n, d))
    p = d // heads
    w = _ln(x, prm["norm.weight"], prm["norm.bias"]) @ prm["qkv.weight"].T + prm["qkv.bias"]
    w = w.reshape(2, n, heads, p)
    y = torch.zeros_like(w)
    for b in range(2):
        for t in range(n):
            q = torch.stack(
                [
                    (
                        w[b, t, k] ** 2 / (w[b, : t + 1, k] ** 2).sum(0).clamp_min(1e-12) + prm["denom_bias"][k, t, 0]
                    ).sum()
                    * prm["temp"][k, 0]
                    for k in range(heads)
                ]
            )
            pi_t = torch.softmax(q, 0)
            for k in range(heads):
                pis = []
                for s in range(t + 1):  # Pi at every earlier position s, recomputed from its own prefix
                    qs = torch.stack(
                        [
                            (
                                w[b, s, j] ** 2 / (w[b, : s + 1, j] ** 2).sum(0).clamp_min(1e-12)
                                + prm["denom_bias"][j, s, 0]
                            ).sum()
                            * prm["temp"][j, 0]
                            for j in range(heads)
                        ]
                    )
                    pis.append(torch.softmax(qs, 0)[k])
                pis = torch.stack(pis)
                m = (pis[:, None] * w[b, : t + 1, k] ** 2).sum(0) / (pis.sum() + 1e-8)
                y[b, t, k] = -pi_t[k] * w[b, t, k] / (1 + m)
    expected = x + y.reshape(2, n, d) @ prm["to_out.weight"].T + prm["to_out.bias"]
    with torch.no_grad():
        got = step(x)
    assert (got - expected).abs().max() < 1e-10


def test_causal_tssa_parameters_are_tosts():
    step = registry.get("tssa").build(
        registry.get("tssa").args.model_validate({"heads": 12, "causal": True}), (1024, 768), Context()
    )
    assert tuple(step.denom_bias.shape) == (12, 1024, 1) and not step.denom_bias.any()
    assert sum(p.numel() for p in step.parameters()) == 1536 + 590_592 + 12 + 12_288 + 590_592


def test_causal_mssa_is_the_masked_softmax():
    """Book eq. 5.3.33-5.3.35: softmax(w w^T / sqrt(p) + M_N) w, M_N = -inf above the diagonal."""
    heads, n, d = 3, 8, 12
    step = _step("mssa", {"heads": heads, "causal": True}, tokens=n, dim=d)
    prm = {k: v.detach() for k, v in step.named_parameters()}
    x = _x((2, n, d))
    p = d // heads
    w = (_ln(x, prm["norm.weight"], prm["norm.bias"]) @ prm["subspaces.weight"].T).reshape(2, n, heads, p)
    mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
    h = torch.zeros_like(w)
    for k in range(heads):
        wk = w[:, :, k]
        h[:, :, k] = torch.softmax(wk @ wk.transpose(1, 2) / math.sqrt(p) + mask, -1) @ wk
    expected = x + h.reshape(2, n, d) @ prm["out.weight"].T + prm["out.bias"]
    with torch.no_grad():
        assert (step(x) - expected).abs().max() < 1e-10


# ----------------------------------------------------------------------------------------- causality


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(CAUSAL_STEPS)), length=st.integers(1, 16), seed=st.integers(0, 2**16))
def test_a_causal_step_on_a_prefix_gives_the_prefix_of_its_outputs(name, length, seed):
    step = _step(name, CAUSAL_STEPS[name], tokens=16, seed=seed)
    x = _x((2, 16, 12), seed)
    with torch.no_grad():
        full, prefix = step(x), step(x[:, :length])
    assert (full[:, :length] - prefix).abs().max() < 1e-10


@pytest.mark.parametrize("name", sorted(CAUSAL_STEPS))
def test_without_causal_the_prefix_property_fails(name):
    """The property test can fail: the same steps without the mask see later tokens."""
    step = _step(name, {**CAUSAL_STEPS[name], "causal": False}, tokens=16)
    x = _x((2, 16, 12))
    with torch.no_grad():
        assert (step(x)[:, :5] - step(x[:, :5])).abs().max() > 1e-4


@settings(max_examples=12, deadline=None)
@given(preset=st.sampled_from(LANGUAGE_PRESETS), length=st.integers(1, 24), seed=st.integers(0, 2**16))
def test_a_language_model_on_a_prefix_gives_the_prefix_of_its_logits(preset, length, seed):
    model = cc.build(preset, overrides=SMALL, seed=seed % 7, dtype="float64")
    ids = torch.randint(0, 40, (2, 24), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full, prefix = model(ids)["output"], model(ids[:, :length])["output"]
    assert prefix.shape == (2, length, 40)
    assert (full[:, :length] - prefix).abs().max() < 1e-9


def test_a_sequence_longer_than_the_context_is_refused_clearly():
    model = cc.build("causal-crate-bytes", overrides=SMALL)
    with pytest.raises(ValueError, match="position table holds 24"):
        model(torch.zeros(1, 25, dtype=torch.long))


# ----------------------------------------------------------------------------------------- weight ties


def test_the_head_is_the_embedding_counted_once_saved_once_and_reloaded_tied(tmp_path):
    model = cc.build("gpt2-bytes")
    assert model.head.lm_head.weight is model.preprocess.embed.weight
    summary = cc.summarize(model)
    assert summary.params_total == sum(p.numel() for p in model.parameters()) == 842_496
    head = next(row for row in summary.steps if row.primitive == "lm_head")
    assert head.params == 0 and head.tied == {"weight": "preprocess.embed.weight"}
    assert "(weight tied to preprocess.embed.weight)" in summary.table()
    assert sum(r.params for r in summary.steps) == summary.params_total  # the rows add up to the total
    with torch.no_grad():
        model.preprocess.embed.weight.add_(1.0)  # trained weights: the head follows
    cc.save(model, tmp_path / "build")
    stored = load_file(tmp_path / "build" / "model.safetensors")
    assert "preprocess.embed.weight" in stored and "head.lm_head.weight" not in stored
    again = cc.load_build(tmp_path / "build")
    assert again.head.lm_head.weight is again.preprocess.embed.weight
    ids = torch.randint(0, 256, (2, 20))
    assert torch.equal(again(ids)["output"], model(ids)["output"])


def test_a_tied_weight_is_trained_once():
    model = cc.build("causal-crate-bytes", overrides=SMALL)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    ids = torch.randint(0, 40, (2, 12))
    model(ids)["output"].square().mean().backward()
    before = model.head.lm_head.weight.clone()
    optimizer.step()
    assert model.head.lm_head.weight is model.preprocess.embed.weight
    assert not torch.equal(before, model.preprocess.embed.weight)


def test_ties_survive_dumping_extends_and_casting(tmp_path):
    spec = cc.load_spec("causal-crate-bytes")
    path = tmp_path / "dumped.yaml"
    path.write_text(cc.dump_spec(spec, references=True))
    again = cc.load_spec(path)
    assert again.head[0].tie == {"weight": "preprocess.embed.weight"}
    model = cc.compile_spec(again, dtype="bfloat16")
    assert model.head.lm_head.weight is model.preprocess.embed.weight
    assert model.head.lm_head.weight.dtype == torch.bfloat16


def test_the_diagram_draws_the_tie():
    source = cc.diagram(cc.build("gpt2-bytes", meta=True)).source
    assert "tied: weight" in source and "one weight shared by two steps" in source


@pytest.mark.parametrize(
    "tie, message",
    [
        ({"weight": "preprocess.nowhere.weight"}, "no earlier step is 'preprocess.nowhere'"),
        ({"weight": "preprocess.positions.embedding"}, "shapes differ, (256, 128) here and (1, 128, 128) there"),
        ({"bias": "preprocess.embed.weight"}, "step 'lm_head' has no parameter 'bias'"),
        ({"weight": "preprocess.embed.scale"}, "'preprocess.embed' has no parameter 'scale'"),
    ],
)
def test_a_bad_tie_is_located_and_says_what_does_not_fit(tmp_path, tie, message):
    text = cc.dump_spec(cc.load_spec("causal-crate-bytes")).replace(
        "weight: preprocess.embed.weight", f"{next(iter(tie))}: {next(iter(tie.values()))}"
    )
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as error:
        cc.validate(path)
    problem = error.value.problems[0]
    assert message in problem.message and problem.path[-1] == "tie"
    assert problem.location.line > 0


# ----------------------------------------------------------------------------------------- cached decoding


@pytest.mark.parametrize("preset", LANGUAGE_PRESETS)
def test_cached_logits_equal_a_full_recompute_at_every_step(preset):
    model = cc.build(preset, seed=1)  # float32, as decoding runs
    with torch.no_grad():  # LayerScale 1e-5 would hide a wrong TSSA state: make every branch count
        for name, param in model.named_parameters():
            if name.endswith("layer_scale"):
                param.fill_(0.5)
    ids = torch.randint(0, 256, (2, 90), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids)["output"]
    decoder = CachedModel(model)
    pieces = [decoder(ids[:, :7])]  # a prompt at once, then one token at a time, then a chunk
    pieces += [decoder(ids[:, t : t + 1]) for t in range(7, 80)]
    pieces.append(decoder(ids[:, 80:90]))
    cached = torch.cat(pieces, 1)
    assert (cached - full).abs().max() < 1e-5
    assert decoder.length == 90


def test_causal_mssa_keeps_half_the_cache_of_standard_attention():
    """Query = key = value: one cache of U^T z where multi-head attention keeps keys and values."""
    sizes = {}
    for preset in ("causal-crate-bytes", "gpt2-bytes"):
        decoder = CachedModel(cc.build(preset))
        decoder(torch.randint(0, 256, (1, 100)))
        sizes[preset] = decoder.nbytes
    assert sizes["causal-crate-bytes"] * 2 == sizes["gpt2-bytes"]


def test_causal_tssa_state_does_not_grow_with_the_context():
    decoder = CachedModel(cc.build("tost-lm-bytes"))
    decoder(torch.randint(0, 256, (1, 4)))
    early = decoder.nbytes
    for _ in range(100):
        decoder(torch.randint(0, 256, (1, 1)))
    assert decoder.nbytes == early


def test_a_non_causal_model_cannot_be_decoded_with_a_cache():
    with pytest.raises(DecodingError, match="not causal"):
        CachedModel(cc.build("causal-crate-bytes", overrides=[*SMALL, "encoder.layer.compress.args.causal=false"]))
    with pytest.raises(DecodingError, match="language model"):
        CachedModel(cc.build("crate-digits"))


def test_decoding_past_the_context_is_refused():
    model = cc.build("causal-crate-bytes", overrides=SMALL)
    decoder = CachedModel(model)
    decoder(torch.zeros(1, 20, dtype=torch.long))
    with pytest.raises(DecodingError, match="exceed the context of 24"):
        decoder(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(DecodingError, match="exceed the context of 24"):
        generate(model, torch.zeros(1, 20, dtype=torch.long), 5)


@pytest.mark.parametrize("preset", LANGUAGE_PRESETS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_with_and_without_the_cache_agree(preset, temperature):
    model = cc.build(preset, overrides=SMALL, seed=2)
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    cached = generate(model, prompt, 15, temperature=temperature, seed=4)
    recomputed = generate(model, prompt, 15, temperature=temperature, seed=4, cache=False)
    assert cached.shape == (2, 20) and torch.equal(cached[:, :5], prompt)
    assert torch.equal(cached, recomputed)
    assert torch.equal(cached, generate(model, prompt, 15, temperature=temperature, seed=4))  # seeded


def test_bytes_round_trip():
    assert decode_bytes(encode_bytes("déf f(x):")[0]) == "déf f(x):"


# ----------------------------------------------------------------------------------------- training and the CLI


def _run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("preset", ["causal-crate-bytes", pytest.param("tost-lm-bytes", marks=pytest.mark.slow)])
def test_a_small_language_model_beats_the_unigram_baseline(tmp_path, capsys, preset):
    """A short version of the documented runs (docs/language.md): a narrower, shallower model (d 64, 2 layers,
    context 64) for 200 steps, about 30 s each on 2 cores. It ends near 0.85 of the unigram loss."""
    code, out, err = _run(
        capsys,
        "train",
        preset,
        "--task",
        "lm",
        "--data",
        "text",
        "--steps",
        200,
        "--batch-size",
        32,
        "--lr",
        1e-2,
        "--out",
        tmp_path / "run",
        "--no-progress",
        *[arg for size in SHORT for arg in ("--set", size)],
    )
    assert code == 0, err
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    metrics = result["metrics"]
    assert metrics["test_loss"] < 0.9 * metrics["test_unigram_loss"], metrics
    sets = [arg for size in SHORT for arg in ("--set", size)]
    code, out, err = _run(
        capsys,
        "generate",
        preset,
        "--weights",
        tmp_path / "run" / "final",
        "--prompt",
        "import ",
        "--tokens",
        40,
        "--seed",
        3,
        *sets,
    )
    assert code == 0, err
    assert out.startswith("import ") and len(out.encode()) >= len("import ") + 40 - 10  # invalid UTF-8 shrinks
    _, again, _ = _run(
        capsys,
        "generate",
        preset,
        "--weights",
        tmp_path / "run" / "final",
        "--prompt",
        "import ",
        "--tokens",
        40,
        "--seed",
        3,
        "--no-cache",
        *sets,
    )
    assert again == out


@pytest.mark.parametrize("vocab", [5, 50_257])
def test_the_bigram_baseline_is_add_one_pair_counts(vocab):
    """``bigram_loss`` against the formula counted in plain Python: ``p(b | a) = (c(a, b) + 1) / (c(a) + V)``
    over the held-out pairs; at GPT-2's vocabulary too, where a dense table of pairs would not fit."""
    import math
    from collections import Counter

    from crate_compose.data.text_sets.corpus import bigram_loss

    generator = torch.Generator().manual_seed(0)
    train = torch.randint(0, 5, (400,), generator=generator) * (vocab // 5)
    test = torch.cat([torch.randint(0, 5, (99,), generator=generator) * (vocab // 5), torch.tensor([vocab - 1])])
    pairs, firsts = Counter(zip(train[:-1].tolist(), train[1:].tolist())), Counter(train[:-1].tolist())
    expected = -sum(
        math.log((pairs[(a, b)] + 1) / (firsts[a] + vocab)) for a, b in zip(test[:-1].tolist(), test[1:].tolist())
    ) / (len(test) - 1)
    assert bigram_loss(train, test, vocab) == pytest.approx(expected, rel=1e-12)


def test_a_language_model_reports_the_bigram_baseline_below_the_unigram(capsys, tmp_path):
    code, _, err = _run(
        capsys,
        "train",
        "causal-crate-bytes",
        "--task",
        "lm",
        "--data",
        "text",
        "--steps",
        1,
        "--eval-every",
        0,
        "--no-progress",
        "--out",
        tmp_path / "run",
        *[arg for size in SHORT for arg in ("--set", size)],
    )
    assert code == 0, err
    metrics = json.loads((tmp_path / "run" / "result.json").read_text())["metrics"]
    assert 0 < metrics["test_bigram_loss"] < metrics["test_unigram_loss"], metrics  # source code: pairs tell


def test_lm_on_images_and_images_on_text_are_refused(capsys, tmp_path):
    code, _, err = _run(capsys, "train", "crate-digits", "--task", "lm", "--data", "digits", "--steps", 1)
    assert code == 2 and "ends in classify" in err and "which task lm does not train" in err  # said from the spec
    with pytest.raises(TrainError, match="--task lm goes with --data text"):  # the data's kind, once loaded
        cc.train("crate-digits", Settings(task="lm", data="digits", steps=1), out=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    code, _, err = _run(capsys, "train", "crate-digits", "--task", "lm", "--data", "text", "--steps", 1)
    assert code == 2 and "no language model" in err
    code, _, err = _run(
        capsys,
        "train",
        "causal-crate-bytes",
        "--task",
        "lm",
        "--data",
        "text",
        "--steps",
        1,
        "--set",
        "encoder.layer.compress.args.causal=false",
        "--set",
        "sizes.vocab=100",
    )
    assert code == 2 and "vocabulary of 100" in err


def test_generate_past_the_context_exits_2(capsys):
    code, _, err = _run(capsys, "generate", "causal-crate-bytes", "--prompt", "x" * 100, "--tokens", 50)
    assert code == 2 and "exceed the context of 128 tokens" in err and "Traceback" not in err


def test_text_data_fits_the_spec_context_and_its_vocabulary():
    from crate_compose.data.sets import load_data

    spec = cc.load_spec("gpt2-small", ["sizes.context=64"])
    data = load_data("text", spec=spec)
    x, y = data.train[3]
    assert x.shape == (64,) and torch.equal(x[1:], y[:-1]) and x.dtype == torch.int64
    assert data.spec_overrides(spec) == ["sizes.vocab=256"]
    assert 2.0 < data.unigram_loss < 5.6  # below log(256) = 5.55: bytes of source code are far from uniform
    assert len(data.test) > 100 and len(data.train) > 9 * len(data.test) * 0.8


def test_a_derived_spec_keeps_its_ties(tmp_path):
    """A tie in the encoder (a final LayerNorm's bias shared with the patch projection's) survives derivation."""
    tie = "encoder.post=[{name: norm, primitive: layernorm, tie: {bias: preprocess.patch_embed.project.bias}}]"
    spec = cc.load_spec("crate-digits", ["sizes.depth=1", tie])
    derived = cc.derive(spec)
    assert derived.encoder.post[0].tie == {"bias": "preprocess.patch_embed.project.bias"}
    path = tmp_path / "derived.yaml"
    path.write_text(cc.dump_spec(derived, references=True))
    model = cc.build(path)
    assert model.encoder.norm.bias is model.preprocess.patch_embed.project.bias
    row = next(r for r in cc.summarize(model).steps if r.module == "encoder.norm")
    assert row.params == model.encoder.norm.weight.numel() and row.tied == {
        "bias": "preprocess.patch_embed.project.bias"
    }


# ----------------------------------------------------------------------------------------- generate: hostile requests

TINY = ["--set", "sizes.context=16", "--set", "sizes.d=16", "--set", "sizes.heads=2", "--set", "sizes.depth=1"]


def test_generate_refuses_a_spec_that_is_no_language_model(capsys):
    code, out, err = _run(capsys, "generate", "specs/crate-digits.yaml", "--prompt", "hi")
    assert code == 2 and out == "" and "Traceback" not in err
    assert (
        "error: spec 'crate-digits' is not a language model (input [1, 8, 8], float32); generate takes a spec "
        "whose input is token ids"
    ) in err


def test_a_prompt_that_is_not_utf8_keeps_its_bytes(tmp_path):
    """A real process: argv holds the bytes 0xff 0xfe, which Python decodes with surrogateescape."""
    import subprocess

    from crate_compose.generation.text import generate_text

    result = generate_text("causal-crate-bytes", "\udcff\udcfe", overrides=TINY[1::2], tokens=3)
    assert result.prompt == b"\xff\xfe" and len(result.continuation) == 3 and result.text.startswith("\ufffd\ufffd")
    from commands import CLI

    run = subprocess.run(
        [*CLI, "generate", "causal-crate-bytes", "--prompt", b"\xff\xfe", "--tokens", "3", *TINY],
        capture_output=True,
        timeout=120,
    )
    assert run.returncode == 0 and b"Traceback" not in run.stderr, run.stderr
    assert run.stdout.startswith("\ufffd\ufffd".encode()) and run.stdout.endswith(b"\n")  # stdout is a pipe here
    with pytest.raises(DecodingError, match="lone surrogate '\\\\ud800' at character 1"):
        encode_bytes("a\ud800")


def test_a_tiny_temperature_is_greedy_decoding(capsys):
    model = cc.build("causal-crate-bytes", overrides=SMALL, seed=2)
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    greedy = generate(model, prompt, 12, temperature=0.0)
    for temperature in (1e-300, 5e-324, 1e-30):
        assert torch.equal(generate(model, prompt, 12, temperature=temperature, seed=4), greedy), temperature
    code, tiny, err = _run(
        capsys, "generate", "causal-crate-bytes", "--prompt", "def ", "--temperature", "1e-300", *TINY
    )
    assert code == 0 and "Traceback" not in err
    _, zero, _ = _run(capsys, "generate", "causal-crate-bytes", "--prompt", "def ", "--temperature", "0", *TINY)
    assert tiny == zero


def test_generate_checks_the_vocabulary_before_the_model_runs(tmp_path, capsys, monkeypatch):
    from crate_compose.generation import text as generation

    small = [*TINY, "--set", "sizes.vocab=100"]
    assert _run(capsys, "build", "causal-crate-bytes", *small, "--out", tmp_path / "vocab100")[0] == 0
    monkeypatch.setattr(generation, "generate", lambda *a, **k: pytest.fail("the model ran"))
    code, out, err = _run(
        capsys, "generate", "causal-crate-bytes", *small, "--weights", tmp_path / "vocab100", "--prompt", "aé"
    )  # é is the bytes 0xc3 0xa9
    assert code == 2 and out == "" and "Traceback" not in err
    assert "error: prompt byte 1 is 195 (0xc3); spec 'causal-crate-bytes." in err
    assert "has a vocabulary of 100 tokens (0-99), too small for this byte-level text" in err
    code, _, err = _run(
        capsys, "generate", "causal-crate-bytes", *TINY, "--weights", tmp_path / "vocab100", "--prompt", "a"
    )  # weights of another vocabulary than the spec's
    assert code == 2 and "do not fit the spec" in err and "Traceback" not in err
    untied = ["--set", "head.lm_head.tie={}", "--set", "preprocess.embed.args.vocab=100"]
    code, _, err = _run(capsys, "generate", "causal-crate-bytes", *TINY, *untied, "--prompt", "a")
    assert code == 2 and "samples among 256 tokens but its embedding takes 100" in err
