"""``crate-compose segment``: DINO's 60%-mass rule, the Jaccard index, the average precision, each on cases whose
answer is known by hand, and the command end to end with its refusals."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from sklearn.metrics import average_precision_score, roc_auc_score

import crate_compose as cc
from crate_compose.assessment.mask_scores import (
    average_precision,
    jaccard,
    mass_mask,
    roc_auc,
    score,
    summarize,
    to_pixels,
)
from crate_compose.cli import main
from crate_compose.data.image_sets import pasted

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = [
    "--set",
    "sizes.d=16",
    "--set",
    "sizes.heads=2",
    "--set",
    "sizes.head_dim=8",
    "--set",
    "sizes.depth=1",
    "--set",
    "sizes.patch_size=8",
]  # 16 patches of 8x8 on 32x32 images, a class token, 2 heads


@pytest.fixture
def few(monkeypatch):
    """pasted-digits with few images, so the command loads it fast (the images are those of the full set)."""
    monkeypatch.setattr(
        pasted,
        "load_pasted_digits",  # the loader the set's declaration names, imported when loaded
        functools.partial(pasted.load_pasted_digits, train_count=16, test_count=8),
    )


# --------------------------------------------------------------------------------------- DINO's 60% rule


def test_the_rule_keeps_the_smallest_set_reaching_60_percent_of_the_mass():
    assert mass_mask([0.5, 0.3, 0.1, 0.1]).tolist() == [True, True, False, False]  # 0.5 < 0.6, 0.8 >= 0.6
    assert mass_mask([5.0, 3.0, 1.0, 1.0]).tolist() == [True, True, False, False]  # normalized first
    assert mass_mask([0.1, 0.1, 0.3, 0.5]).tolist() == [False, False, True, True]  # wherever the mass lies
    assert mass_mask([0.7, 0.1, 0.1, 0.1]).tolist() == [True, False, False, False]
    assert mass_mask([0.3, 0.3, 0.2, 0.2]).tolist() == [True, True, False, False]  # 0.3 + 0.3 reaches 0.6 exactly
    assert mass_mask([0.5, 0.3, 0.1, 0.1], threshold=0.9).tolist() == [True, True, True, False]
    # ties: the lower patch index first, every time
    assert mass_mask([0.25, 0.25, 0.25, 0.25]).tolist() == [True, True, True, False]
    assert mass_mask([0.2, 0.3, 0.3, 0.2]).tolist() == [False, True, True, False]
    assert mass_mask([0.2, 0.2, 0.4, 0.2]).tolist() == [True, False, True, False]  # 0.4, then the first 0.2
    assert mass_mask([0.0, 0.0]).tolist() == [True, True]  # no mass: nothing to choose between
    rows = np.array([[[0.5, 0.3, 0.1, 0.1], [0.1, 0.1, 0.3, 0.5]]])  # any leading axes: (images, heads, patches)
    assert mass_mask(rows).tolist() == [[[True, True, False, False], [False, False, True, True]]]


def test_the_rule_is_dino_visualize_attention():
    """DINO's own lines (visualize_attention.py) on maps without ties give the same patches."""
    generator = torch.Generator().manual_seed(0)
    attentions = torch.softmax(torch.randn(6, 49, generator=generator, dtype=torch.float64) * 2, -1)
    val, idx = torch.sort(attentions)
    val /= torch.sum(val, dim=1, keepdim=True)
    cumval = torch.cumsum(val, dim=1)
    th_attn = cumval > (1 - 0.6)
    idx2 = torch.argsort(idx)
    for head in range(len(attentions)):
        th_attn[head] = th_attn[head][idx2[head]]
    assert np.array_equal(mass_mask(attentions.numpy()), th_attn.numpy())


# --------------------------------------------------------------------------------------- Jaccard and pixels


def test_jaccard_by_hand_and_the_patches_upsampled_to_pixels():
    rows = np.zeros((4, 4), bool)
    rows[:2] = True  # the top two rows: 8 pixels
    columns = np.zeros((4, 4), bool)
    columns[:, :2] = True  # the left two columns: 8 pixels
    assert jaccard(rows, columns) == pytest.approx(4 / 12)  # 4 in both, 12 in either
    assert jaccard(rows, rows) == 1.0 and jaccard(rows, ~rows) == 0.0
    assert jaccard(np.zeros((2, 2)), np.zeros((2, 2))) == 1.0
    patches = np.array([[True, False], [False, True]])
    pixels = to_pixels(patches, 2)  # patch size 2: each patch its 2x2 pixels
    assert pixels.tolist() == [
        [True, True, False, False],
        [True, True, False, False],
        [False, False, True, True],
        [False, False, True, True],
    ]
    top = np.zeros((4, 4), bool)
    top[0] = True  # the top row: 4 pixels, 2 of them in the top-left patch
    assert jaccard(pixels, top) == pytest.approx(2 / 10)  # 2 in both; 8 + 4 - 2 in either
    values = to_pixels(np.arange(4.0).reshape(1, 2, 2), 2)  # any leading axes
    assert values.shape == (1, 4, 4) and values[0, 3, 0] == 2.0


def test_a_map_is_scored_by_its_kept_patches_and_its_pixels():
    masks = np.zeros((1, 4, 4), bool)
    masks[0, :2, :2] = True  # the mask is the top-left patch of a 2x2 grid of 2x2 patches
    maps = np.array(
        [
            [
                [[0.7, 0.1], [0.1, 0.1]],  # head 1: 0.7 >= 0.6 keeps the top-left patch alone
                [[0.1, 0.1], [0.1, 0.7]],
            ]
        ]
    )  # head 2: the bottom-right one
    scores = score(maps, masks, patch_size=2)
    # the mean map [.4 .1; .1 .4] keeps two patches, 8 pixels, 4 of them the mask's
    assert scores.values["jaccard"][0].tolist() == [1.0, 0.0, 0.5]
    assert scores.values["average_precision"][0, 0] == 1.0
    assert scores.values["kept"][0].tolist() == [0.25, 0.25, 0.5]
    assert scores.kept[0, 2].tolist() == [[True, False], [False, True]]
    summary = summarize(scores)
    assert summary["best_head"]["by_jaccard"]["head"] == 1 and summary["mean_map"]["jaccard"] == 0.5
    assert summary["per_image"]["jaccard"] == [[1.0, 0.0, 0.5]]
    wider = np.zeros((1, 5, 5), bool)  # a side that is no multiple of the patch: the mask is cut to the grid
    wider[0, :2, :2] = wider[0, 4, 4] = True
    assert score(maps, wider, patch_size=2).values["jaccard"][0, 0] == 1.0


# --------------------------------------------------------------------------------------- the threshold-free score


def test_average_precision_is_one_for_the_mask_itself_and_least_for_its_reverse():
    mask = np.zeros((8, 8), bool)
    mask[2:5, 3:7] = True
    share = mask.mean()
    assert average_precision(mask.astype(float), mask) == 1.0 and roc_auc(mask.astype(float), mask) == 1.0
    assert average_precision(1.0 - mask, mask) == pytest.approx(share)  # every positive last: the least
    assert roc_auc(1.0 - mask, mask) == 0.0
    assert average_precision(np.ones((8, 8)), mask) == pytest.approx(share)  # a map that knows nothing
    assert roc_auc(np.ones((8, 8)), mask) == 0.5
    generator = np.random.default_rng(0)
    for _ in range(20):  # scikit-learn's definitions, ties and weights included
        scores = generator.integers(0, 6, 40).astype(float)
        truth = generator.random(40) < 0.3
        truth[:2] = [True, False]
        weights = generator.integers(1, 5, 40).astype(float)
        assert average_precision(scores, truth) == pytest.approx(average_precision_score(truth, scores), abs=1e-12)
        assert roc_auc(scores, truth, weights) == pytest.approx(
            roc_auc_score(truth, scores, sample_weight=weights), abs=1e-12
        )
    maps = generator.random((3, 2, 4, 4))  # a patch's pixels are tied: the same numbers as every pixel ranked
    masks = generator.random((3, 8, 8)) < 0.3
    scores_ = score(maps, masks, patch_size=2)
    for i in range(3):
        for k in range(2):
            pixels = to_pixels(maps[i, k], 2)
            assert scores_.values["average_precision"][i, k] == pytest.approx(
                average_precision_score(masks[i].ravel(), pixels.ravel()), abs=1e-12
            )
            assert scores_.values["auroc"][i, k] == pytest.approx(
                roc_auc_score(masks[i].ravel(), pixels.ravel()), abs=1e-12
            )


# --------------------------------------------------------------------------------------- the command


def _numbers(value):
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in ("head", "protocol"):
                yield from _numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _numbers(item)
    elif isinstance(value, float):
        yield value


def test_segment_writes_its_numbers_and_pictures_trained_beside_untrained(tmp_path, capsys, few):
    out = tmp_path / "seg"
    assert (
        main(
            ["segment", DIGITS, *TINY, "--data", "pasted-digits", "--samples", "6", "--images", "2", "--out", str(out)]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {".lock", "segmentation.json", "segmentation-untrained.png"}
    result = json.loads((out / "segmentation.json").read_text())
    protocol = result["protocol"]
    assert (
        protocol["threshold"],
        protocol["samples"],
        protocol["step"],
        protocol["layer"],
        protocol["last_layer"],
        protocol["heads"],
        protocol["grid"],
        protocol["patch_size"],
    ) == (0.6, 6, "encoder.layer_0.compress", 0, True, 2, [4, 4], 8)
    untrained = result["runs"]["untrained"]
    assert [h["head"] for h in untrained["heads"]] == [1, 2]
    assert np.array(untrained["per_image"]["jaccard"]).shape == (6, 3)  # the heads, then the mean map
    numbers = list(_numbers(result))
    assert len(numbers) > 50 and all(0.0 <= n <= 1.0 for n in numbers)
    with Image.open(out / "segmentation-untrained.png") as picture:
        assert picture.format == "PNG"
    assert "head 1" in printed and "best head" in printed and "mean map (of the heads)" in printed
    assert f"wrote {out / 'segmentation.json'}" in printed
    # trained weights beside the untrained network of the same seed
    build = tmp_path / "net"
    spec = cc.load_spec(DIGITS, [*TINY[1::2], "input.shape=[3, 32, 32]", "sizes.channels=3", "sizes.image_size=32"])
    cc.save(cc.compile_spec(spec, seed=5), build)
    before = sorted(p.name for p in build.iterdir())
    assert (
        main(
            ["segment", DIGITS, *TINY, "--weights", str(build), "--samples", "4", "--images", "1", "--threshold", "0.8"]
        )
        == 0
    )
    folder = tmp_path / "segmentation" / "net"  # beside the weights, never in them
    assert sorted(p.name for p in build.iterdir()) == before
    result = json.loads((folder / "segmentation.json").read_text())
    assert set(result["runs"]) == {"trained", "untrained"} and result["protocol"]["threshold"] == 0.8
    assert result["runs"]["trained"]["per_image"] != result["runs"]["untrained"]["per_image"]
    assert (folder / "segmentation-trained.png").is_file()
    assert "Jaccard trained" in capsys.readouterr().out


def _without_class_token(tmp_path: Path) -> Path:
    written = yaml.safe_load(Path(DIGITS).read_text())
    written["preprocess"] = [step for step in written["preprocess"] if step["primitive"] != "class_token"]
    written["head"][0]["args"]["pool"] = "mean"
    path = tmp_path / "no-cls.yaml"
    path.write_text(yaml.safe_dump(written))
    return path


@pytest.mark.parametrize(
    "case, message",
    [
        ("digits", "data set 'digits' has no ground-truth masks"),
        ("tost", "has no step with attention (it has encoder.layer_0.compress (tssa)"),
        ("no-class-token", "has no class token"),
        ("token-input", "not images cut into patches"),
        ("build", "never written into a build"),
    ],
)
def test_segment_refuses_what_it_cannot_measure_and_writes_nothing(tmp_path, capsys, few, case, message):
    out = tmp_path / "seg"
    spec, extra = DIGITS, [*TINY, "--data", "pasted-digits"]
    if case == "digits":
        extra = [*TINY, "--data", "digits"]
    elif case == "tost":
        spec, extra = (
            "tost-digits",
            ["--set", "sizes.depth=1", "--set", "sizes.d=16", "--set", "sizes.heads=2", "--set", "sizes.patch_size=8"],
        )
    elif case == "no-class-token":
        spec = str(_without_class_token(tmp_path))
    elif case == "token-input":
        spec, extra = "gpt2-bytes", []
    elif case == "build":
        cc.save(cc.compile_spec(cc.load_spec(DIGITS, ["sizes.depth=1"]), seed=0), tmp_path / "net")
        out = tmp_path / "net" / "segmentation"
    assert main(["segment", spec, *extra, "--samples", "2", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
    assert not out.exists()
