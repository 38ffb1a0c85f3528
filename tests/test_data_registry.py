"""Data sets are a registry, as primitives and tasks are (crate_compose/data/set_registry.py): a declaration per set,
a name read once into a choice, what a set provides deciding which tasks train on it, ``list data`` listing
every set, and a set of your own added by a plug-in without editing the package."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from crate_compose import cli, tasks
from crate_compose.data import set_registry as registry
from crate_compose.data import sets
from crate_compose.errors import DataError
from crate_compose.training.preparation import fingerprint

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = [arg for o in ("sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1") for arg in ("--set", o)]

STRIPES = '''
"""``stripes:N``: N training images of horizontal (class 0) or vertical (class 1) stripes, 8x8, grey."""

import torch

from crate_compose.data.record import Data, Tensors
from crate_compose.data.set_registry import LABELED_IMAGES, Parameter, register, whole

READS = []  # every N this module's parameter has read: a name is read once per command


def _count(text):
    READS.append(text)
    return whole(4, 4096)(text)


def _stripes(count, generator):
    labels = torch.arange(count) % 2
    phase = torch.randint(0, 4, (count,), generator=generator)
    rows = ((torch.arange(8)[None, :] + phase[:, None]) // 2 % 2).float()  # a period of 4 pixels
    images = rows[:, :, None].expand(count, 8, 8).clone()
    images[labels == 1] = images[labels == 1].transpose(1, 2)
    images += 0.1 * torch.randn(images.shape, generator=generator)
    return ((images - 0.5) / 0.5)[:, None], labels


@register("stripes:N", summary="horizontal or vertical stripes, 8x8", source="generated here", status="generated",
          provides=LABELED_IMAGES, split="N train, N / 4 test", size="N / N/4",
          parameters=(Parameter("N", "training images", "count", match=".*", read=_count),))
def load_stripes(*, count: int, seed: int = 0) -> Data:
    generator = torch.Generator().manual_seed(seed)
    train, test = _stripes(count, generator), _stripes(max(2, count // 4), generator)
    return Data(name=f"stripes:{count}", train=Tensors(*train), test=Tensors(*test), input_shape=(1, 8, 8),
                classes=2, provides=LABELED_IMAGES, mean=(0.5,), std=(0.5,), class_names=["horizontal", "vertical"],
                sizes={"channels": 1, "image_size": 8, "classes": 2})
'''


@pytest.fixture
def own_sets(monkeypatch):
    """The registry as it is, restored after the test (a set this file registers is its own)."""
    registry.all_sets()  # the built-in sets registered first, into the registry kept
    monkeypatch.setattr(registry, "_SETS", registry._SETS.copy())
    yield
    sys.modules.pop("crate_compose_plugin_stripes", None)


@pytest.fixture
def plugin(tmp_path, own_sets) -> Path:
    path = tmp_path / "stripes.py"
    path.write_text(STRIPES)
    return path


# ---------------------------------------------------------------- a set of your own, through the command line


def test_a_plugin_registers_a_parametrized_set_and_train_runs_on_it(plugin, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [
        "train",
        DIGITS,
        *TINY,
        "--data",
        "stripes:64",
        "--steps",
        "2",
        "--batch-size",
        "16",
        "--no-progress",
        "--logger",
        "none",
        "--out",
        str(out),
        "--plugin",
        str(plugin),
    ]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert "test_accuracy" in capsys.readouterr().out
    module = sys.modules["crate_compose_plugin_stripes"]
    assert module.READS == ["64"]  # the name was read once, before anything was loaded
    recorded = json.loads((out / "run.json").read_text())
    assert "stripes:64" in json.dumps(recorded)
    assert "shape: [1, 8, 8]" in (out / "final" / "spec.yaml").read_text()  # the spec fitted to the set's images
    data = sets.load_data("stripes:64")
    assert data.provides == "labeled-images" and tasks.of(None, data).name == "classify"  # the default task
    assert (len(data.train), len(data.test)) == (64, 16)
    assert fingerprint(data) == fingerprint(sets.load_data(registry.resolve("stripes:64")))
    assert cli.main([*argv, "--resume"]) == 0  # a finished run, resumed with its own steps: nothing changes


def test_a_plugin_sets_bad_parameters_are_refused_in_its_own_terms(plugin, tmp_path, capsys):
    for name, said in [
        ("stripes:3", "data set 'stripes:3': give the training images as stripes:N, N from 4 to 4,096"),
        ("stripes:x", "data set 'stripes:x': give the training images as stripes:N, N from 4 to 4,096"),
        ("stripes:", "give the training images as stripes:N"),
        ("stripe:64", "unknown data set 'stripe:64': expected one of digits, "),
    ]:
        argv = [
            "train",
            DIGITS,
            *TINY,
            "--data",
            name,
            "--steps",
            "1",
            "--no-progress",
            "--logger",
            "none",
            "--out",
            str(tmp_path / "refused"),
            "--plugin",
            str(plugin),
        ]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
    assert "did you mean 'stripes:N'?" in err and "stripes:N" in registry.names()
    assert not (tmp_path / "refused").exists()
    with pytest.raises(DataError, match="does not take image_size; it takes: seed"):
        sets.load_data("stripes:8", image_size=16)


def test_without_the_plugin_the_set_is_unknown(tmp_path, capsys, own_sets):
    argv = ["train", DIGITS, *TINY, "--data", "stripes:64", "--steps", "1", "--out", str(tmp_path / "run")]
    assert cli.main(argv) == 2
    assert "unknown data set 'stripes:64'" in capsys.readouterr().err


# ---------------------------------------------------------------- list data


def test_list_data_lists_every_registered_set(plugin, capsys):
    assert cli.main(["list", "data", "--plugin", str(plugin)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(" ")}
    assert set(rows) == {"NAME", *(one.pattern for one in registry.all_sets())}
    for one in registry.all_sets():
        assert one.provides in rows[one.pattern] and one.availability() in rows[one.pattern]
        assert one.summary in out
    assert "stripes:N" in rows and "generated here" in rows["stripes:N"]
    assert {
        "digits",
        "pasted-digits[:N]",
        "folder:PATH",
        "KIND[-V]:text",
        "KIND[-V]:modules",
        "KIND[-V]:folder:PATH",
    } <= set(rows)


def test_list_data_says_whether_a_fetched_set_is_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CRATE_COMPOSE_DATA", str(tmp_path))
    assert cli.main(["list", "data"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("mnist "))
    assert "not cached (run make data)" in row
    (tmp_path / "mnist.safetensors").write_bytes(b"")
    assert cli.main(["list", "data"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("mnist "))
    assert " cached " in row and "not cached" not in row


def test_list_data_imports_no_torch():
    code = textwrap.dedent("""
        import contextlib, io, sys
        from crate_compose import cli
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli.main(["list", "data"]) == 0
        print([m for m in ("torch", "numpy", "crate_compose.data.sets", "crate_compose.data.record") if m in sys.modules])
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


# ---------------------------------------------------------------- a name read once


def test_a_name_is_read_once_into_a_choice_that_load_data_takes():
    choice = registry.resolve("pasted-digits:50")
    assert choice == registry.resolve("pasted-digits:50") and hash(choice) == hash(registry.resolve("pasted-digits:50"))
    assert registry.resolve(choice) is choice and sets.resolve is registry.resolve
    assert choice.data_set is registry.get("pasted-digits[:N]") and choice.arguments == (("train_count", 50),)
    assert choice.name == str(choice) == "pasted-digits:50" and choice.provides == "labeled-images"
    assert choice.takes == sets.takes("pasted-digits:50") == frozenset()
    assert registry.resolve("bytes:text").takes == frozenset({"spec"})
    assert registry.resolve("subspaces").takes == frozenset({"seed", "spec"})
    by_name, by_choice = sets.load_data("pasted-digits:50", test_count=8), sets.load_data(choice, test_count=8)
    assert len(by_choice.train) == 50 and torch.equal(by_name.train.inputs, by_choice.train.inputs)
    assert fingerprint(by_name) == fingerprint(by_choice)


def test_a_folder_of_text_is_read_as_bytes_folder(tmp_path):
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text("some words to read\n" * 50)
    choice = registry.resolve(f"folder:{tmp_path}")
    assert choice.name == f"bytes:folder:{tmp_path}" and choice.data_set is registry.get("KIND[-V]:folder:PATH")
    assert dict(choice.arguments) == {"path": str(tmp_path), "kind": "bytes", "vocab": None}
    assert (
        choice.provides == "tokenized-text" and tasks.of(None, SimpleNamespace(provides=choice.provides)).name == "mlm"
    )


def test_names_are_the_registered_forms_in_order():
    assert (
        sets.names()
        == registry.names()
        == [
            "digits",
            "fashion-mnist",
            "mnist",
            "photos",
            "subspaces",
            "text",
            "pasted-digits",
            "pasted-digits:N",
            "shapes",
            "shapes:N",
            "folder:PATH",
            "bytes:text",
            "wordpiece:text",
            "bpe:text",
            "gpt2:text",
            "KIND-V:text",
            "KIND:modules",
            "KIND:shakespeare",
            "KIND:plays",
            "KIND:folder:PATH",
        ]
    )


# ---------------------------------------------------------------- the refusals as they were


@pytest.mark.parametrize(
    "name, said",
    [
        (
            "digit",
            "unknown data set 'digit': expected one of digits, fashion-mnist, mnist, photos, subspaces, text, "
            "pasted-digits, pasted-digits:N, shapes, shapes:N, folder:PATH, bytes:text, wordpiece:text, bpe:text, "
            "gpt2:text, KIND-V:text, KIND:modules, KIND:shakespeare, KIND:plays, KIND:folder:PATH; did you mean 'digits'?",
        ),
        ("wordpeice:text", "did you mean 'wordpiece:text'?"),
        ("", "unknown data set '': expected one of digits"),
        (
            "bytes-300:text",
            "data set 'bytes-300:text': bytes takes no vocabulary size (its ids are the 256 bytes and 5 "
            "specials); write bytes:text",
        ),
        ("bytes-300:texts", "bytes takes no vocabulary size"),
        ("wordpiece-10:text", "wordpiece: the vocabulary must be a whole number from 64 to 262,144; got 10"),
        ("bpe-200:modules", "from 261"),
        (
            "wordpiece:texts",
            "data set 'wordpiece:texts': a wordpiece set is wordpiece[-V]:text, wordpiece[-V]:modules, "
            "wordpiece[-V]:shakespeare, wordpiece[-V]:plays or wordpiece[-V]:folder:PATH",
        ),
        (
            "bytes:folder",
            "a bytes set is bytes:text, bytes:modules, bytes:shakespeare, bytes:plays or bytes:folder:PATH",
        ),
        ("gpt2:folder", "a gpt2 set is gpt2:text, gpt2:modules, gpt2:shakespeare, gpt2:plays or gpt2:folder:PATH"),
        (
            "gpt2-100:shakespeare",
            "data set 'gpt2-100:shakespeare': gpt2 takes no vocabulary size (its ids are GPT-2's "
            "50,257 and 5 specials); write gpt2:shakespeare",
        ),
        ("wordpiece:folder:", "data set 'wordpiece:folder:': give the folder as wordpiece:folder:PATH"),
        ("folder:", "folder: give the folder as folder:PATH"),
        (
            "pasted-digits:0",
            "data set 'pasted-digits:0': give the training images as pasted-digits:N, N from 1 to 1,000,000",
        ),
        ("pasted-digits:", "give the training images as pasted-digits:N"),
        ("pasted-digits:1e3", "give the training images as pasted-digits:N"),
        ("pasted-digits:2000000", "give the training images as pasted-digits:N"),
        ("shapes:0", "data set 'shapes:0': give the training images as shapes:N, N from 1 to 1,000,000"),
    ],
)
def test_the_refusals_of_a_bad_name(name, said):
    with pytest.raises(DataError) as refused:
        registry.resolve(name)
    assert said in str(refused.value)
    with pytest.raises(DataError, match=re.escape(said)):  # load_data reads the name alike
        sets.load_data(name)


# ---------------------------------------------------------------- what a set provides, and the tasks


def test_the_default_task_is_the_first_that_trains_on_what_a_set_provides():
    default = {
        kind: getattr(tasks.of(None, SimpleNamespace(provides=kind)), "name", None) for kind in registry.PROVIDED
    }
    assert default == {
        "labeled-images": "classify",
        "images": "mae",
        "next-byte-text": "lm",
        "tokenized-text": "mlm",
        "labeled-tokens": "classify",
        "token-groups": None,
    }
    for one in tasks.all_tasks():
        assert set(one.data_kinds) <= set(registry.PROVIDED) and not set(one.data_kinds) & set(tasks.names())
    for one in registry.all_sets():
        assert one.provides in registry.PROVIDED and one.provides not in tasks.names()


def test_a_loader_must_give_what_its_set_provides(own_sets):
    registry.register(
        "plain-digits",
        summary="digits declared as unlabeled",
        source="scikit-learn",
        provides="images",
        loader=".image_sets.shipped:load_digits",
    )
    with pytest.raises(
        DataError, match="its loader gave 'labeled-images' data, but the set is declared to provide 'images'"
    ):
        sets.load_data("plain-digits")


def test_a_declaration_is_checked_when_registered(own_sets):
    with pytest.raises(ValueError, match="placeholders"):
        registry.register("shapes:N", summary="s", source="s", provides="images", loader="x:y")
    with pytest.raises(ValueError, match="not a kind"):
        registry.register("shapes", summary="s", source="s", provides="Images!", loader="x:y")
    with pytest.raises(ValueError, match="closes no"):
        registry.register("shapes]", summary="s", source="s", provides="images", loader="x:y")
    with pytest.raises(ValueError, match="'digits' is already registered"):
        registry.register("digits", summary="s", source="s", provides="images", loader="x:y")
    assert (
        registry.register(
            "digits", summary="again", source="s", provides="labeled-images", loader=".image_sets.shipped:load_digits"
        ).summary
        == "again"
    )  # from the same loader: replaced
    with pytest.raises(DataError, match="no data set is registered as 'shapes'"):
        registry.get("shapes")
