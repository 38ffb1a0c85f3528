"""The sizes of the published models come from one place: where a family's named model is a zoo preset,
its ``published`` sizes are the preset's as it resolves, so the two tables cannot drift apart.

``BEFORE`` writes every table out as it was when the sizes were written in the families (from the
authors' code and the hubs' releases), the independent check that reading them from the presets changed
nothing; the tables are read lazily, so importing the families (as the command line does before torch)
reads no YAML.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import crate_compose as cc
from crate_compose.interop.authors import CRATE, CRATE_MAE
from crate_compose.interop.catalog import FAMILIES
from crate_compose.interop.families import Published


def _rows(keys: tuple[str, ...], rows: dict[str, tuple]) -> dict[str, dict]:
    return {name: dict(zip(keys, values, strict=True)) for name, values in rows.items()}


CRATE_KEYS = ("patch_size", "d", "depth", "heads", "head_dim")
TOST_KEYS = ("d", "heads", "depth", "patch_size", "class_depth")
VIT_KEYS = ("d", "heads", "depth", "patch_size", "image_size")
GPT2_KEYS = ("d", "heads", "depth", "context", "vocab")

BEFORE = {  # name -> sizes, in the order each family's code registers them
    "crate": _rows(
        CRATE_KEYS,
        {
            "CRATE_tiny": (16, 384, 12, 6, 64),
            "CRATE_small": (16, 576, 12, 12, 48),
            "CRATE_base": (16, 768, 12, 12, 64),
            "CRATE_large": (16, 1024, 24, 16, 64),
        },
    ),
    "crate-mae": _rows(
        CRATE_KEYS,
        {
            "mae_crate_tiny": (16, 384, 12, 6, 64),
            "mae_crate_small": (16, 576, 12, 12, 48),
            "mae_crate_base": (16, 768, 12, 12, 64),
            "mae_crate_large": (16, 1024, 24, 16, 64),
        },
    ),
    "crate-alpha": _rows(
        (*CRATE_KEYS, "ratio"), {"CRATE_base": (16, 768, 12, 12, 64, 4), "CRATE_large": (14, 1024, 24, 16, 64, 4)}
    ),
    "tost": _rows(
        TOST_KEYS,
        {
            "tost_cab_tiny_12_p16": (192, 4, 12, 16, 2),
            "tost_cab_tiny_12_p8": (192, 4, 12, 8, 2),
            "tost_cab_tiny_24_p16": (192, 4, 24, 16, 2),
            "tost_cab_tiny_24_p8": (192, 4, 24, 8, 2),
            "tost_cab_small_12_p16": (384, 8, 12, 16, 2),
            "tost_cab_small_12_p8": (384, 8, 12, 8, 2),
            "tost_cab_small_24_p16": (384, 8, 24, 16, 2),
            "tost_cab_small_24_p8": (384, 8, 24, 8, 2),
            "tost_cab_medium_24_p16": (512, 8, 24, 16, 2),
            "tost_cab_medium_24_p8": (512, 8, 24, 8, 2),
            "tost_cab_large_24_p16": (768, 16, 24, 16, 2),
            "tost_cab_large_24_p8": (768, 16, 24, 8, 2),
        },
    ),
    "tost-lm": {},
    "crate-lm": _rows(
        ("d", "depth", "heads"),
        {
            "crate-1l": (768, 1, 1),
            "crate": (768, 12, 12),
            "crate-medium": (1024, 24, 16),
            "crate-large": (1280, 36, 20),
            "crate-xl": (1600, 48, 25),
        },
    ),
    "timm-vit": _rows(
        VIT_KEYS,
        {
            "vit_tiny_patch16_224": (192, 3, 12, 16, 224),
            "vit_tiny_patch16_384": (192, 3, 12, 16, 384),
            "vit_small_patch8_224": (384, 6, 12, 8, 224),
            "vit_small_patch16_224": (384, 6, 12, 16, 224),
            "vit_small_patch16_384": (384, 6, 12, 16, 384),
            "vit_small_patch32_224": (384, 6, 12, 32, 224),
            "vit_small_patch32_384": (384, 6, 12, 32, 384),
            "vit_base_patch8_224": (768, 12, 12, 8, 224),
            "vit_base_patch16_224": (768, 12, 12, 16, 224),
            "vit_base_patch16_384": (768, 12, 12, 16, 384),
            "vit_base_patch32_224": (768, 12, 12, 32, 224),
            "vit_base_patch32_384": (768, 12, 12, 32, 384),
            "vit_large_patch14_224": (1024, 16, 24, 14, 224),
            "vit_large_patch16_224": (1024, 16, 24, 16, 224),
            "vit_large_patch16_384": (1024, 16, 24, 16, 384),
            "vit_large_patch32_224": (1024, 16, 24, 32, 224),
            "vit_large_patch32_384": (1024, 16, 24, 32, 384),
            "deit_tiny_patch16_224": (192, 3, 12, 16, 224),
            "deit_small_patch16_224": (384, 6, 12, 16, 224),
            "deit_base_patch16_224": (768, 12, 12, 16, 224),
            "deit_base_patch16_384": (768, 12, 12, 16, 384),
        },
    ),
    "gpt2": _rows(
        GPT2_KEYS,
        {
            "gpt2": (768, 12, 12, 1024, 50257),
            "gpt2-medium": (1024, 16, 24, 1024, 50257),
            "gpt2-large": (1280, 20, 36, 1024, 50257),
            "gpt2-xl": (1600, 25, 48, 1024, 50257),
            "distilgpt2": (768, 12, 6, 1024, 50257),
        },
    ),
}

# the published names whose model is a zoo preset
PRESETS = {
    "crate": {
        "CRATE_tiny": "crate-tiny",
        "CRATE_small": "crate-small",
        "CRATE_base": "crate-base",
        "CRATE_large": "crate-large",
    },
    "crate-mae": {"mae_crate_small": "crate-mae-small", "mae_crate_base": "crate-mae-base"},
    "crate-alpha": {"CRATE_base": "crate-alpha-base16"},
    "tost": {"tost_cab_tiny_12_p16": "tost-tiny", "tost_cab_small_12_p16": "tost-small"},
    "crate-lm": {"crate": "crate-lm-base"},
    "timm-vit": {"vit_tiny_patch16_224": "vit-tiny", "vit_small_patch16_224": "vit-small"},
    "gpt2": {"gpt2": "gpt2-small"},
}

FROM_PRESETS = [(family, name, preset) for family, names in PRESETS.items() for name, preset in names.items()]


def _presets_of(family) -> dict[str, str]:
    return family.published.presets if isinstance(family.published, Published) else {}


def test_every_family_names_the_presets_of_its_published_models():
    assert set(BEFORE) == set(FAMILIES)
    assert {name: _presets_of(family) for name, family in FAMILIES.items() if _presets_of(family)} == PRESETS


@pytest.mark.parametrize(("family", "name", "preset"), FROM_PRESETS, ids=[f"{f}:{n}" for f, n, _ in FROM_PRESETS])
def test_a_published_model_that_is_a_preset_has_the_presets_sizes(family, name, preset):
    """Each size the published table gives is the preset's as it resolves (read here by the spec loader,
    apart from the families' own reading), and the preset gives every one of them."""
    published = FAMILIES[family].published[name]
    sizes = cc.load_spec(preset).sizes
    assert set(published) <= set(sizes), f"{preset} gives no {sorted(set(published) - set(sizes))}"
    assert published == {key: sizes[key] for key in published}


@pytest.mark.parametrize("family", sorted(BEFORE))
def test_the_published_tables_are_what_they_were_written_as(family):
    """Equal, in the same order (the order names are tried and listed in), with the same types."""
    table = FAMILIES[family].published
    assert list(table) == list(BEFORE[family])
    assert dict(table) == BEFORE[family]
    assert {name: {k: type(v) for k, v in sizes.items()} for name, sizes in table.items()} == {
        name: {k: int for k in sizes} for name, sizes in BEFORE[family].items()
    }


def test_model_and_matching_read_the_tables_as_before():
    assert CRATE.model("CRATE_base", "the checkpoint's 'arch'") == {
        "patch_size": 16,
        "d": 768,
        "depth": 12,
        "heads": 12,
        "head_dim": 64,
    }
    given = CRATE.model("CRATE_base", "here")
    given["d"] = 1
    assert CRATE.published["CRATE_base"]["d"] == 768  # a copy: the caller's changes stay the caller's
    with pytest.raises(
        ValueError, match="'CRATE_huge', which .* does not define .*CRATE_tiny, CRATE_small, CRATE_base, CRATE_large"
    ):
        CRATE.model("CRATE_huge", "here")
    assert CRATE.matching({"d": 768, "depth": 12}) == ["CRATE_base"]
    assert CRATE_MAE.matching({"d": 1024, "classes": 10}) == ["mae_crate_large"]  # a size no entry gives is no bar
    assert FAMILIES["tost-lm"].matching({"d": 768}) == []  # no published table


def test_importing_the_families_reads_no_preset_and_reading_them_loads_no_torch():
    code = """
import json, sys
from crate_compose.interop.catalog import FAMILIES
before = sorted(m for m in ("yaml", "torch", "crate_compose.spec_language.loader") if m in sys.modules)
tables = {name: dict(family.published) for name, family in FAMILIES.items()}
after = sorted(m for m in ("yaml", "torch") if m in sys.modules)
print(json.dumps({"before": before, "after": after, "crate_base": tables["crate"]["CRATE_base"]}))
"""
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"before": [], "after": ["yaml"], "crate_base": BEFORE["crate"]["CRATE_base"]}
