"""The pages that list the package's parts list every part, and only parts that exist (issue 36: docs that
cannot drift): every preset in the README and in docs/python.md's ``presets()``, every primitive in the
README and docs/primitives.md, every task in the README and docs/cli.md, every command a section of
docs/cli.md and every one of its options named there. A new preset, primitive, task, command or flag is
a failing test until it is documented."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import crate_compose as cc
from crate_compose import registry, tasks
from crate_compose.cli import parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CLI = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
PYTHON = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
PRIMITIVES = (ROOT / "docs" / "primitives.md").read_text(encoding="utf-8")
OTHER_TOOLS = {"--nproc_per_node", "--nnodes", "--node_rank", "--rdzv_backend", "--rdzv_endpoint"}  # torchrun's


def readme_presets() -> set[str]:
    """The preset names the README's table names in backticks, ``crate-tiny/small`` read as both names,
    ``*-bytes`` as every preset it matches."""
    named = set()
    for item in re.findall(r"`([\w./*-]+)`", README):
        stem, *others = item.removesuffix(".yaml").removeprefix("specs/").split("/")
        named.add(stem)
        named.update(stem.rsplit("-", 1)[0] + "-" + other for other in others)
    globs = [re.compile(name.replace("*", r"[\w-]+") + "$") for name in named if "*" in name]
    return named | {p for p in cc.presets() if any(g.match(p) for g in globs)}


@pytest.mark.parametrize("preset", list(cc.presets()))
def test_every_preset_is_in_the_readme(preset):
    assert preset in readme_presets(), f"the README's table names no preset {preset!r}"


def test_python_md_lists_exactly_the_presets():
    block = PYTHON.split("print(list(cc.presets()))", 1)[1].split("```", 1)[0]
    assert re.findall(r"'([^']+)'", block) == list(cc.presets())


@pytest.mark.parametrize("name", registry.all_primitives())
def test_every_primitive_is_in_the_readme_and_has_its_section(name):
    assert f"`{name}`" in README, f"the README's primitives row lacks `{name}`"
    assert re.search(rf"^#+ `?{re.escape(name)}`?$", PRIMITIVES, re.M), f"docs/primitives.md has no section for {name}"


@pytest.mark.parametrize("task", tasks.names())
def test_every_task_is_in_the_readme_and_the_cli_page(task):
    in_code = re.compile(rf"`[^`\n]*(?<![\w-]){re.escape(task)}(?![\w-])[^`\n]*`")  # `mlm`, `--task mlm`
    assert in_code.search(README), f"the README never names task {task}"
    assert in_code.search(CLI), f"docs/cli.md never names task {task}"


def _commands() -> dict[str, argparse.ArgumentParser]:
    top = parser()
    return next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices


def _options(command: argparse.ArgumentParser) -> set[str]:
    """Its long options; of a ``--x`` / ``--no-x`` pair, the one the page names (either will do)."""
    found = set()
    for action in command._actions:
        names = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
        if isinstance(action, argparse.BooleanOptionalAction):
            names = [next((o for o in names if _named(o)), names[0])]
        found.update(names)
    return found


def _named(option: str) -> bool:
    return re.search(re.escape(option) + r"(?![\w-])", CLI) is not None


@pytest.mark.parametrize("name", sorted(_commands()))
def test_every_command_has_a_section_naming_each_of_its_options(name):
    assert re.search(rf"^## {re.escape(name)}$", CLI, re.M), f"docs/cli.md has no section '## {name}'"
    missing = sorted(o for o in _options(_commands()[name]) if not _named(o))
    assert not missing, f"docs/cli.md does not name {name}'s {', '.join(missing)}"


def test_every_option_the_cli_page_names_exists():
    known = {o for command in _commands().values() for a in command._actions for o in a.option_strings}
    named = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", CLI)) - OTHER_TOOLS
    assert sorted(named - known) == []
    headings = set(re.findall(r"^## (\S+)$", CLI, re.M))
    assert headings <= set(_commands()), sorted(headings - set(_commands()))


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "RESULTS.md"]
PATH = re.compile(r"(?<![\w/.-])((?:crate_compose|tests|benchmarks|specs|zoo|recipes|docs)/[\w./*-]*[\w*])")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_file_a_page_names_exists(page):
    """A path in the project's own folders that a page names (a module, a test, a benchmark, a spec, a
    figure) is there: a moved or deleted file fails here, not in a reader's hands."""
    missing = []
    for path in sorted(set(PATH.findall(page.read_text(encoding="utf-8")))):
        if "*" in path:
            found = list(ROOT.glob(path))
        else:
            found = [p for p in (ROOT / path, page.parent / path) if p.exists()]
        if not found:
            missing.append(path)
    assert not missing, f"{page.name} names files that are not there: {', '.join(missing)}"


@pytest.mark.parametrize("name", cc.__all__)
def test_every_public_name_is_on_the_python_page(name):
    """docs/python.md says it documents every name in ``crate_compose.__all__``: each is named there in backticks
    (``name``, or a call ``name(...)``)."""
    assert re.search(rf"(`|### |cc\.|-> |^){re.escape(name)}\b", PYTHON, re.M), (
        f"docs/python.md does not name cc.{name}"
    )


@pytest.mark.parametrize("name", ["train", "ablate", "probe", "evaluate", "linear_probe", "segment", "fill", "fetch"])
def test_every_workbench_command_is_a_function_of_the_package(name):
    """The command line is a thin layer over the package: each workbench command is a public function."""
    assert name in cc.__all__ and callable(getattr(cc, name))


WORKBENCH = (ROOT / "docs" / "workbench.md").read_text(encoding="utf-8")


def test_the_data_sets_page_is_made_from_the_declarations():
    """docs/data-sets.md is what ``crate-compose list data --markdown`` prints: each set's description lives where
    the set is registered, and the page cannot drift from it (regenerate it with that command)."""
    from crate_compose.data import set_registry

    page = (ROOT / "docs" / "data-sets.md").read_text(encoding="utf-8")
    assert page == set_registry.markdown(), (
        "docs/data-sets.md: run crate-compose list data --markdown > docs/data-sets.md"
    )
    listed = re.findall(r"^\| `([^`]+)` \|", page, re.M)
    assert listed == [one.pattern for one in set_registry.all_sets()]
    assert all(one.about and one.inputs and one.targets and one.description for one in set_registry.all_sets())
    assert "`crate-compose list data`" in README and "list data" in CLI and "(data-sets.md)" in WORKBENCH


def test_the_readme_is_read_in_minutes():
    """What it is, the two commands, a spec, what is in the box, where to read on: at most 250 lines, none a
    paragraph on one line; the guarantees and the measured results live in docs/."""
    lines = README.splitlines()
    assert len(lines) <= 250, len(lines)
    assert max(len(line) for line in lines) <= 130, max(lines, key=len)


DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
RGB32 = ["sizes.image_size=32", "sizes.channels=3"]  # pasted-digits and shapes: 32x32 RGB
LM_4X128 = ["sizes.context=128", "sizes.d=128", "sizes.heads=4", "sizes.depth=4", "sizes.vocab=256"]
DOCUMENTED_COUNTS = [  # (page, spec, overrides, the parameter count the page states for it)
    ("workbench.md", DIGITS, [], 52_682),
    ("workbench.md", DIGITS, ["encoder.layer.compress.primitive=tssa"], 52_954),  # the MSSA/TSSA ablation
    ("workbench.md", "crate-mini", ["sizes.depth=4", *RGB32], 215_434),  # shapes
    ("workbench.md", "vit-mini", ["sizes.depth=4", *RGB32], 809_354),
    ("language.md", "causal-crate-bytes", ["encoder.layer.compress.primitive=tssa"], 251_152),  # the ablation
    ("language.md", "causal-crate-bytes", ["encoder.layer.compress.primitive=mhsa"], 381_184),
    ("language.md", "crate-bert-mini", ["sizes.vocab=4096"], 1_944_832),  # wordpiece-4096:text
    ("language.md", "bert-mini", ["sizes.vocab=4096"], 4_311_808),
    ("shakespeare.md", "crate-lm-base", LM_4X128, 445_184),  # benchmarks/shakespeare.py's SIZES, bytes
    ("shakespeare.md", "crate-bert-mini", ["sizes.vocab=8192"], 2_997_504),  # wordpiece:shakespeare
    ("shakespeare.md", "bert-mini", ["sizes.vocab=8192"], 5_364_480),
    ("dino-segmentation.md", "crate-mini", RGB32, 613_770),  # pasted-digits:40000
    ("dino-segmentation.md", "vit-mini", RGB32, 2_395_530),
    ("dino-segmentation.md", "crate-dino-mini", RGB32, 1_138_944),
    ("dino-segmentation.md", "vit-dino-mini", RGB32, 2_920_704),
]


@pytest.mark.parametrize(
    ("page", "spec", "overrides", "count"),
    DOCUMENTED_COUNTS,
    ids=[f"{page}-{count}" for page, _, _, count in DOCUMENTED_COUNTS],
)
def test_every_documented_parameter_count_is_the_built_one(page, spec, overrides, count):
    """A parameter count a page states of a network (a preset at the sizes the page trains it) is what
    ``inspect`` counts, and the page still states it: a changed preset fails here, not in a reader's table."""
    assert f"{count:,}" in (ROOT / "docs" / page).read_text(encoding="utf-8"), f"docs/{page} no longer says {count:,}"
    assert cc.inspect(spec, overrides).params_total == count
