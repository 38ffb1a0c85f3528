"""The run-time hostile corpus (``tests/runtime/``): damaged checkpoints, resumes that would change a run,
foreign folders, full disks, hostile images, grid files, prompts, plug-ins, torchrun, logs and locks.

Every case of ``tests/runtime/cases.py`` is one parametrized test, named ``rNNN-category-slug``
(``-k r042`` runs one, ``-k checkpoint`` a category), judged by ``tests/runtime/harness.judge``:
exit status, message, no traceback, time and memory, and nothing good lost (see
``tests/runtime/__init__.py``). Two cases are also regression tests named for what they guard:
``test_hybrid_resume_is_refused`` and ``test_stale_ablation_is_refused``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from guards import process_state_kept  # tests/guards.py

RUNTIME = Path(__file__).resolve().parent / "runtime"


def _import_corpus():
    spec = importlib.util.spec_from_file_location(
        "runtime_corpus", RUNTIME / "__init__.py", submodule_search_locations=[str(RUNTIME)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package
    spec.loader.exec_module(package)
    import runtime_corpus.cases as cases
    import runtime_corpus.harness as harness

    return cases, harness


cases, harness = _import_corpus()
REGRESSION_IDS = set(cases.REGRESSIONS.values())
# The torchrun cases also judge that no worker aborts at exit ("terminate called without an active
# exception"): gloo's threads used to release tensors after the interpreter was gone (train's
# distributed.Distributed.stop now collects DDP's cycles and destroys the group while Python is whole).
CORPUS = [pytest.param(case, id=case.name) for case in cases.CASES if case.id not in REGRESSION_IDS]


def test_the_corpus_is_whole():
    """At least 100 cases, each category represented, ids unique and in order, and a category's word in
    no other case's name (so ``-k CATEGORY`` selects exactly it)."""
    ids = [case.id for case in cases.CASES]
    assert len(ids) >= 100 and len(set(ids)) == len(ids) and ids == sorted(ids)
    categories = {case.category for case in cases.CASES}
    assert categories == {
        "checkpoint",
        "resume",
        "folder",
        "fault",
        "data",
        "grid",
        "generate",
        "plugin",
        "torchrun",
        "log",
        "lock",
        "setname",
        "fetch",
        "cache",
        "tokenizer",
        "infill",
        "hub",
        "textdir",
    }
    for category in categories:
        strays = [case.name for case in cases.CASES if category in case.name and case.category != category]
        assert not strays, f"-k {category} would also select {strays}"


@pytest.fixture(scope="session")
def resources(tmp_path_factory):
    return harness.Resources(tmp_path_factory.mktemp("runtime-resources"))


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """Import torch and the primitives before any guard: an alarm inside a first import would leave a
    half-imported module behind."""
    import crate_compose as cc

    cc.compile_spec(cc.load_spec(harness.DIGITS), meta=True)


@pytest.fixture
def clean_state(monkeypatch):
    """Put back what a command may change in this process (tests/guards.py)."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CRATE_COMPOSE_MEMORY_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "120")
    with process_state_kept(), open(os.devnull) as empty:
        monkeypatch.setattr(sys, "stdin", empty)
        yield


def run_case(case, resources, tmp_path, monkeypatch, capfd) -> tuple[list[str], "harness.Result", "harness.Ctx"]:
    """Prepare, run and judge ``case``; returns its shortfalls, what it did and its context."""
    ctx = harness.Ctx(tmp_path / "case", resources, monkeypatch)
    ctx.tmp.mkdir()
    monkeypatch.chdir(ctx.tmp)
    hang = max(30.0, 3 * case.seconds)

    def here(argv: list) -> "harness.Result":
        capfd.readouterr()
        result = harness.run_inprocess(argv, hang)
        result.out, result.err = capfd.readouterr()
        return result

    try:
        case.setup(ctx)
        argv = case.argv(ctx)
        before = harness.snapshot(ctx.tmp)
        if case.mode == "inprocess":
            result = here(argv)
        elif case.mode == "subprocess":
            result = harness.run_subprocess(ctx, argv, hang, pipe=case.pipe)
        else:
            ctx.notes["run_here"] = here
            result = case.runner(ctx, case)
        result.extra.setdefault("argv", argv)
        after = harness.snapshot(ctx.tmp)
        wrong = harness.judge(case, ctx, result, before, after)
    finally:
        ctx.close()
    if os.environ.get("RUNTIME_CORPUS_LOG"):  # one JSON line per case, for a survey of the corpus
        with open(os.environ["RUNTIME_CORPUS_LOG"], "a") as log:
            log.write(
                json.dumps(
                    {
                        "case": case.name,
                        "status": result.status,
                        "wall_s": round(result.wall, 2),
                        "peak_mb": result.peak_mb,
                        "wrong": wrong,
                        "first": harness.first_lines(result.err or result.out, 2),
                    }
                )
                + "\n"
            )
    return wrong, result, ctx


def _report(case, wrong, result) -> str:
    """The failure's report, every character UTF-8 (a case's text of surrogate escapes would otherwise stop pytest-xdist
    from sending it)."""
    argv = "  argv: " + " ".join(map(str, result.extra.get("argv") or [])) if result.extra.get("argv") else ""
    report = (
        f"{case.name} ({case.why}): expected exit {'/'.join(map(str, case.expect))}; {'; '.join(wrong)}\n"
        f"  exit {result.status}, {result.wall:.1f} s"
        + (f", {result.peak_mb:.0f} MB peak" if result.peak_mb is not None else "")
        + f"; first lines: {harness.first_lines(result.err or result.out)}\n{argv}\n"
        f"--- output (last 3000 characters) ---\n{result.output[-3000:]}"
    )
    return report.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.mark.parametrize("case", CORPUS)
def test_case(case, resources, tmp_path, monkeypatch, capfd, clean_state):
    wrong, result, _ = run_case(case, resources, tmp_path, monkeypatch, capfd)
    assert not wrong, _report(case, wrong, result)


@pytest.mark.parametrize("case", [cases.BY_ID[cases.REGRESSIONS["hybrid"]]], ids=lambda c: c.name)
def test_hybrid_resume_is_refused(case, resources, tmp_path, monkeypatch, capfd, clean_state):
    """A run of crate-digits killed at its checkpoint, resumed with ista_soft in place of ista: the shapes
    match, so it used to continue silently as a hybrid of two networks. Refused (exit 2), the message
    names the spec difference, and spec.yaml and the checkpoints are as they were."""
    wrong, result, ctx = run_case(case, resources, tmp_path, monkeypatch, capfd)
    assert result.status == 2, _report(case, wrong, result)
    assert "'primitive: ista' in the run, 'primitive: ista_soft' now" in result.err, _report(case, wrong, result)
    assert not wrong, _report(case, wrong, result)  # every file of the run (spec.yaml, checkpoints/) unchanged


@pytest.mark.parametrize("case", [cases.BY_ID[cases.REGRESSIONS["stale"]]], ids=lambda c: c.name)
def test_stale_ablation_is_refused(case, resources, tmp_path, monkeypatch, capfd, clean_state):
    """``ablate --steps 3`` then ``ablate --steps 2`` into the same --out: the 3-step runs used to be read
    back as the new grid's results. Refused (exit 2), naming the folder; its results unchanged."""
    wrong, result, ctx = run_case(case, resources, tmp_path, monkeypatch, capfd)
    assert result.status == 2, _report(case, wrong, result)
    assert not wrong, _report(case, wrong, result)  # results.md, results.csv and every run unchanged
