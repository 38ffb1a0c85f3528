"""Training recipes: the papers' training settings in a file (``crate-compose train SPEC --config RECIPE``).

A recipe is YAML with any run setting (the names of :class:`crate_compose.settings.Settings`, the
options of ``train`` without their dashes), a ``description``, its ``source``, and ``set``: overrides
of the spec the recipe needs::

    description: CRATE pre-training on ImageNet-1K (paper 003, App. B.1)
    optimizer: lion
    lr: 2.4e-4
    weight_decay: 0.5
    label_smoothing: 0.1

It is read like a spec (:func:`crate_compose.spec_language.source.read_file`: a regular file, bounded, plain
YAML values only) and checked as a whole: every unknown key and every value a run cannot use is
reported together as ``file:line:column: key: message`` (the rules of
:func:`crate_compose.tasks.settings_problems`, which the command line and the Python API share).
Options given on the command line win over the recipe. The recipe's text is saved in the run folder
(``recipe.yaml``), and what it sets is part of the run's recorded identity like any setting, so a run
resumed with a recipe that says otherwise is refused.

The recipes shipped (``crate-compose train SPEC --config crate-pretrain``) are in ``recipes/``.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import tasks
from ..errors import Location, Problem, SpecError, did_you_mean
from ..settings import OPTIONS, settings_of
from ..spec_language.source import Source, read_file
from ..spec_language.zoo import shipped_folder

OWN_KEYS = ("description", "source", "set")


def setting_keys() -> tuple[str, ...]:
    """The names a recipe or grid file may set: every declared setting and every registered task's option."""
    return (*(name for name in OPTIONS), *tasks.task_options())


class RecipeError(SpecError):
    """Problems in a recipe file, each located (the CLI exits with status 2)."""

    def __str__(self) -> str:
        count = len(self.problems)
        return "\n".join(
            [f"{count} problem{'s' if count != 1 else ''} in the recipe:", *(f"  {p}" for p in self.problems)]
        )


@dataclass
class Recipe:
    """A recipe file, checked: its settings, the spec overrides it needs, its text (saved with the run)."""

    path: Path
    text: str
    settings: dict[str, Any] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    description: str = ""


def recipes_dir() -> Path:
    return shipped_folder("recipes")


def shipped() -> dict[str, Path]:
    """The recipes that come with the package, by name."""
    return {path.stem: path for path in sorted(recipes_dir().glob("*.yaml"))}


def locate(ref: str | Path) -> Path:
    """The recipe file for ``ref``: an existing file, else the name of a shipped recipe."""
    path = Path(ref)
    if path.is_file() or path.suffix in (".yaml", ".yml") or "/" in str(ref):
        return path
    found = shipped()
    if str(ref) in found:
        return found[str(ref)]
    hint = did_you_mean(str(ref), found) or f"shipped recipes: {', '.join(found)}"
    raise RecipeError([Problem(f"no recipe file or shipped recipe named {str(ref)!r}", (), Location(str(ref)), hint)])


def read_recipe(ref: str | Path) -> Recipe:
    """Read and check a recipe (see the module docstring); :class:`RecipeError` lists every problem."""
    path = locate(ref)
    try:
        source = read_file(path)
    except SpecError as error:
        raise RecipeError(error.problems) from None
    content = source.data if isinstance(source.data, dict) else {}
    if not isinstance(source.data, dict):
        raise RecipeError(
            [Problem("a recipe is a mapping of settings (optimizer: lion, lr: 2.4e-4, ...)", (), Location(str(path)))]
        )
    keys = (*OWN_KEYS, *setting_keys())
    problems = [
        Problem(
            f"unknown key '{key}'",
            (key,),
            _locate(source, path, key),
            did_you_mean(str(key), keys) or f"expected some of: {', '.join(keys)}",
        )
        for key in content
        if key not in keys
    ]
    given = {k: content[k] for k in setting_keys() if k in content}
    problems += [
        Problem(message, (name,), _locate(source, path, name))
        for name, message in tasks.settings_problems(settings_of(given))
        if name in given
    ]
    overrides = content.get("set", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        problems.append(
            Problem(
                "set: a list of spec overrides PATH=VALUE (e.g. [sizes.image_size=224])",
                ("set",),
                _locate(source, path, "set"),
            )
        )
    for key in ("description", "source"):
        if key in content and not isinstance(content[key], str):
            problems.append(Problem(f"{key}: text", (key,), _locate(source, path, key)))
    if problems:
        raise RecipeError(sorted(problems, key=lambda p: (p.location.line, p.location.column)))
    return Recipe(path, path.read_text(encoding="utf-8"), given, list(overrides), content.get("description", ""))


def _locate(source: Source, path: Path, *key: str | int) -> Location:
    return source.locate(key) or Location(str(path))
