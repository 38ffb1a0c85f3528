"""The one prepared check of a lent GPU: every figure this project wants from one, in at most 8 minutes.

    make device-check                                      # on the GPU machine: its python3, PYTHONPATH=.
    python benchmarks/device_check.py [--out-dir DIR] [--append] [--budget 480]
    .venv/bin/python benchmarks/device_check.py --dry-run [--out-dir DIR]

GPU time is rare here (about 15 minutes, lent to a session by chance), so whoever is lent one runs this
first. The steps, in this order, each in processes of its own with a time limit (a step that fails or
hangs is reported with its error in its part of the section, and the next step still runs):

a. The machine: the GPU, its memory, the driver, torch, CUDA and Python, the packages the steps need.
b. The GPU test suite: ``python -m pytest --device cuda -q -x -p no:cacheprovider -n 8`` (tests/conftest.py's
   ``--device``), at most 150 s: passed, failed and skipped, the failures' names and the common skip reasons.
c. Training step: ``benchmarks/train_step.py`` (crate-compose's CRATE-B against timm's ViT-B/16; forward
   only left out, ``--forward none``) at batch 64 in float32 and bf16, eager and compiled, and at batch
   256 in bf16, eager and compiled, as four runs of it (the compiled float32 run, last, is left out when time
   runs short); its tables, and CRATE-B's images/s over ViT-B's per setting against the issue's goal (CRATE-B
   >= 2.5x ViT-B/16's images/s in bf16 compiled at batch 64, >= 1.5x in bf16 eager).
d. Profiles: one bf16-autocast training step of each model (train_step.py's ``Trainer``: forward,
   cross-entropy, backward, AdamW) at batch 64, eager, under ``torch.profiler`` (CPU and CUDA activity) for 3
   steps after 3 warm-up steps: the 15 kernels that take the most GPU time (their share of the step's GPU
   time, calls per step), the kernels launched per step, and the time the GPU is busy (the union of the
   kernels' intervals) against the wall time of an unprofiled step (median of 10, synchronized).
e. The optimizer step alone: ``benchmarks/optimizer_step.py --device cuda`` (Lion: lion_pytorch against
   ours), then ``torch.optim.AdamW`` over CRATE-B's parameters (optimizer_step.py's) with ``foreach=True``
   against ``fused=True``: each step synchronized, interleaved rounds, median.
f. The folder run: ``benchmarks/folder_run.py --steps 1200 --batch-size 128 --lr 6e-4 --device cuda
   --workers 8 --precision bf16 --compile`` (crate-tiny on scikit-learn's digits as a 32x32 PNG folder; a run
   like it collapsed at step ~815 on an H200): the training loss every 100 steps, the test accuracies, and
   whether it collapsed: the loss come back to within 0.05 of ln 10 = 2.303 after having been below 1.5, and
   stayed there to the last logged step (:func:`collapse`). It checkpoints every 25 steps, not 100: train
   stops a run 50 steps after its outputs became constant, so 100 would leave no checkpoint after the jump.
   On a collapse the weights of the checkpoints just before and just after it are kept (each split into
   files under 16 MiB: load them all and merge the dictionaries).

Output: one Markdown section headed ``## device_check.py: <GPU>, <date>``, printed to stdout at the end and
written with the rest to ``--out-dir`` (default ``$OUT`` when set, else ``runs/device-check/``), at most 8
files of at most 16 MiB, none in a folder: ``section.md``, ``device-check.json`` (every step's figures, the
train_step.py JSON files, the profiler tables, the tail of pytest's output), ``folder-run.png``,
``metrics.jsonl``, ``profile.txt`` and ``pytest.log`` (left out first when the collapse's weights need
their places). ``--append`` appends the section to benchmarks/RESULTS.md. Progress goes to stderr.

Time: each step has a limit of its own, and the whole check a budget (``--budget``, 480 s): a step gets at
most what is left once the least the later steps need is set aside, and one that cannot get its least
is skipped, saying so. Exit status 0 when every step reported, 1 when one failed (the section says which),
2 without CUDA (unless ``--dry-run``).

``--dry-run``: the same steps on the CPU at toy sizes, one thread per process: 62 float64 tests of
tests/test_speed_paths.py, train_step.py at 32x32 and batch 2 and 4 without compiling, the profiles at
32x32 and batch 2 in float32, 3 rounds of the optimizers, 10 folder-run steps of a 2-layer network in bf16
without compiling; under 2 minutes on 2 cores, to check the script and its section, whose figures measure
no GPU (it says so). ``--append`` is refused with it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from machine import cpu_name, publish, synchronize, timed  # benchmarks/machine.py, beside this script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"
LN10 = math.log(10)  # the loss of a constant output over 10 classes (with label smoothing too)
COLLAPSE_BAND, LOW_LOSS = 0.05, 1.5
RATIO_GOALS = {True: 2.5, False: 1.5}  # CRATE-B / ViT-B/16 images/s in bf16 at batch 64: compiled, eager
MAX_FILES, MAX_BYTES, PART_BYTES = 8, 16 * 2**20, 15 * 2**20
SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
DRY_NOTE = "**Dry run, CPU, toy sizes: no figure in it measures a GPU.**"
PACKAGES = {  # distribution: the steps that need it
    "pydantic": "everything (crate_compose)",
    "pyyaml": "everything (crate_compose)",
    "safetensors": "e, f",
    "tokenizers": "b",
    "tqdm": "f",
    "pytest": "b",
    "pytest-xdist": "b (-n)",
    "hypothesis": "b",
    "timm": "c, d",
    "lion-pytorch": "e (Lion)",
    "scikit-learn": "f (the digits)",
    "matplotlib": "f (the figure)",
    "numpy": "all",
    "triton": "c, f (torch.compile on CUDA)",
}
GPU_ONLY = {"triton"}


@dataclass
class TrainRun:
    """One run of train_step.py: its label, batch, settings and time (wanted, least)."""

    label: str
    batch: int
    args: list[str]
    want: float
    least: float
    optional: bool = False


@dataclass
class Plan:
    """What each step runs, on the GPU or (``dry``) on the CPU at toy sizes."""

    dry: bool
    device: str
    budget: float
    pytest: list[str]
    pytest_want: float
    train_common: list[str]
    train_runs: list[TrainRun]
    goal_batch: int
    profile: dict
    optimizer_args: list[str]
    adamw: dict
    folder_args: list[str]
    folder_want: float
    loss_every: int
    least: dict = field(default_factory=dict)  # step key: the least time it needs
    env: dict = field(default_factory=dict)


def gpu_plan(budget: float) -> Plan:
    sizes = ["--runs", "10", "--warmup", "3"]
    return Plan(
        dry=False,
        device="cuda",
        budget=budget,
        pytest=["--device", "cuda", "-q", "-x", "-p", "no:cacheprovider", "-n", "8"],
        pytest_want=150,
        train_common=["--device", "cuda", "--forward", "none"],
        train_runs=[
            TrainRun(
                "batch 64, eager",
                64,
                ["--batch", "64", "--dtypes", "float32,bfloat16", "--compile", "off", *sizes],
                60,
                30,
            ),
            TrainRun(
                "batch 64, bf16 compiled",
                64,
                ["--batch", "64", "--dtypes", "bfloat16", "--compile", "on", *sizes],
                100,
                45,
            ),
            TrainRun(
                "batch 256, bf16",
                256,
                ["--batch", "256", "--dtypes", "bfloat16", "--compile", "off,on", "--runs", "6", "--warmup", "2"],
                100,
                50,
            ),
            TrainRun(
                "batch 64, float32 compiled",
                64,
                ["--batch", "64", "--dtypes", "float32", "--compile", "on", *sizes],
                75,
                45,
                optional=True,
            ),
        ],
        goal_batch=64,
        profile={"size": 224, "batch": 64, "dtype": "bfloat16", "warmup": 3, "timed": 10, "profiled": 3, "want": 60},
        optimizer_args=["--device", "cuda", "--runs", "31", "--warmup", "3"],
        adamw={"runs": 31, "warmup": 3, "want": 30},
        folder_args=[
            "--steps",
            "1200",
            "--batch-size",
            "128",
            "--lr",
            "6e-4",
            "--device",
            "cuda",
            "--workers",
            "8",
            "--precision",
            "bf16",
            "--compile",
            "--checkpoint-every",
            "25",
        ],
        folder_want=150,
        loss_every=100,
        least={"machine": 10, "tests": 60, "train": 125, "profile": 30, "optimizer": 30, "folder": 90},
    )


def dry_plan(budget: float) -> Plan:
    toy = ["--size", "32", "--runs", "1", "--warmup", "0", "--retakes", "0"]
    return Plan(
        dry=True,
        device="cpu",
        budget=budget,
        pytest=[
            "tests/test_speed_paths.py",
            "-k",
            "float64",
            "--device",
            "cpu",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
        ],
        pytest_want=90,
        train_common=["--device", "cpu", "--forward", "none"],
        train_runs=[  # compiling CRATE-B and ViT-B on 2 cores takes minutes: eager only
            TrainRun(
                "batch 2, eager", 2, ["--batch", "2", "--dtypes", "float32,bfloat16", "--compile", "off", *toy], 90, 20
            ),
            TrainRun("batch 4, bf16", 4, ["--batch", "4", "--dtypes", "bfloat16", "--compile", "off", *toy], 90, 20),
        ],
        goal_batch=2,
        profile={"size": 32, "batch": 2, "dtype": "float32", "warmup": 1, "timed": 2, "profiled": 1, "want": 60},
        optimizer_args=["--device", "cpu", "--runs", "3", "--warmup", "1", "--retakes", "0"],
        adamw={"runs": 3, "warmup": 1, "want": 30},
        folder_args=[
            "--steps",
            "10",
            "--batch-size",
            "32",
            "--lr",
            "6e-4",
            "--device",
            "cpu",
            "--workers",
            "0",
            "--precision",
            "bf16",
            "--checkpoint-every",
            "5",
            "--log-every",
            "1",
            "--patch-size",
            "8",
            "--set",
            "sizes.d=32",
            "--set",
            "sizes.heads=2",
            "--set",
            "sizes.head_dim=16",
            "--set",
            "sizes.depth=2",
        ],
        folder_want=60,
        loss_every=2,
        least={"machine": 10, "tests": 20, "train": 40, "profile": 20, "optimizer": 20, "folder": 30},
        env={"OMP_NUM_THREADS": "1"},
    )  # one thread a process: 2 threads on a shared 2-core machine are 10x slower


# ---- running the steps ---------------------------------------------------------------------------------------


class StepFailed(Exception):
    """A step's command failed: the message, and the end of its output."""

    def __init__(self, message: str, tail: str = "", lines: list[str] | None = None) -> None:
        super().__init__(message)
        self.tail, self.lines = tail, lines  # lines: the figures the step did report


class Skipped(Exception):
    """Too little of the budget is left for a step (or a part of one)."""


@dataclass
class Done:
    returncode: int
    out: str
    err: str
    seconds: float
    timed_out: bool
    limit: float

    def tail(self, lines: int = 15) -> str:
        return "\n".join((self.out + "\n" + self.err).strip().splitlines()[-lines:])


class Clock:
    """The check's budget: what is left, and progress lines on stderr with the time elapsed."""

    def __init__(self, budget: float) -> None:
        self.began, self.budget = time.monotonic(), budget

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def left(self) -> float:
        return self.budget - self.elapsed()

    def say(self, text: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {text}", file=sys.stderr, flush=True)

    def allow(self, want: float, least: float, reserve: float) -> float:
        """The seconds a command may take: ``want`` or less, leaving ``reserve`` for what follows; Skipped when
        that is under ``least``."""
        allowed = min(want, self.left() - reserve)
        if allowed < least:
            raise Skipped(
                f"{max(0.0, self.left()):.0f} s of the {self.budget:.0f} s budget were left, and what follows "
                f"needs {reserve:.0f} s at least; this needs at least {least:.0f} s"
            )
        return allowed


class Check:
    """The state the steps share: the plan, the clock, the work folder, the files for the out dir."""

    def __init__(self, plan: Plan, clock: Clock, work: Path) -> None:
        self.plan, self.clock, self.work = plan, clock, work
        self.files: dict[str, tuple[int, bytes]] = {}  # name: (priority, content); lower priorities are kept first
        self.data: dict = {}
        self.reserve = 0.0  # the least the steps after the current one need
        self.date = f"{datetime.datetime.now():%Y-%m-%d %H:%M}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "CRATE_COMPOSE_TEST_DEVICE"}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        env["PYTHONUNBUFFERED"] = "1"
        self.env = {**env, **plan.env}

    def run(self, cmd: list, want: float, least: float, name: str, reserve: float = 0.0) -> Done:
        """Run ``cmd`` from the repository's root in a process group of its own, its output into the work
        folder; killed (the whole group) at its limit."""
        limit = self.clock.allow(want, least, self.reserve + reserve)
        cmd = [str(c) for c in cmd]
        shown = " ".join(c.replace(str(ROOT) + "/", "") for c in cmd[1:])
        self.clock.say(f"  {shown} (limit {limit:.0f} s)")
        out_path, err_path = self.work / f"{name}.out", self.work / f"{name}.err"
        began = time.monotonic()
        with open(out_path, "w") as out, open(err_path, "w") as err:
            process = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
            )
            try:
                process.wait(timeout=limit)
                timed_out = False
            except subprocess.TimeoutExpired:
                stop(process)
                timed_out = True
        done = Done(
            process.returncode,
            out_path.read_text(errors="replace"),
            err_path.read_text(errors="replace"),
            time.monotonic() - began,
            timed_out,
            limit,
        )
        self.clock.say(
            f"  ... {'stopped at its limit' if timed_out else f'exit {done.returncode}'} after {done.seconds:.0f} s"
        )
        return done

    def part(self, name: str, want: float, least: float) -> dict:
        """One of this script's in-process measurements (:data:`PARTS`), in a process of its own."""
        result = self.work / f"part-{name}.json"
        cmd = [sys.executable, __file__, "--part", name, "--result", result, *(["--dry-run"] if self.plan.dry else [])]
        done = self.run(cmd, want, least, f"part-{name}")
        if done.timed_out or done.returncode or not result.exists():
            raise StepFailed(failure(done), done.tail())
        return json.loads(result.read_text())

    def keep(self, name: str, content: bytes | str, priority: int) -> None:
        assert SAFE_NAME.match(name), name
        self.files[name] = (priority, content.encode() if isinstance(content, str) else content)


def stop(process: subprocess.Popen) -> None:
    """End a command and every process it started (its process group): SIGTERM, 5 s to finish, then SIGKILL to
    whatever of the group is left."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


def failure(done: Done) -> str:
    if done.timed_out:
        return f"stopped at its limit of {done.limit:.0f} s"
    return f"exit status {done.returncode} after {done.seconds:.0f} s"


def code_block(text: str) -> list[str]:
    return ["", "```text", *text.replace("```", "'''").splitlines(), "```"]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}" if seconds < 0.1 else f"{seconds * 1e3:,.1f}"


# ---- a. the machine ------------------------------------------------------------------------------------------


def part_machine(plan: Plan) -> dict:
    import importlib.metadata

    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cpus": os.cpu_count(),
        "cpu": cpu_name(),
    }
    if plan.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=props.name,
            memory_gib=props.total_memory / 2**30,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            devices=torch.cuda.device_count(),
            driver=nvidia_smi("driver_version"),
        )
    else:
        info["device"] = info["cpu"]
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    info["packages"] = packages
    try:
        import crate_compose

        info["crate_compose"] = str(Path(crate_compose.__file__).resolve().parent)
    except Exception as error:  # noqa: BLE001  (reported: every later step needs it)
        info["crate_compose_error"] = f"{type(error).__name__}: {error}"
    return info


def nvidia_smi(query: str) -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_step(check: Check) -> list[str]:
    info = check.part("machine", 60, check.plan.least["machine"])
    check.data["machine"] = info
    if check.plan.device == "cuda":
        others = "" if info["devices"] == 1 else f", 1 of {info['devices']} GPUs"
        device = (
            f"{info['device']} ({info['memory_gib']:.1f} GiB, compute capability {info['capability']}, "
            f"{info['multiprocessors']} multiprocessors{others}), driver {info.get('driver') or 'unknown'}"
        )
    else:
        device = f"no GPU: the CPU, {info['device']}"
    lines = [
        f"{device}; torch {info['torch']}, CUDA {info['cuda']}, cuDNN {info['cudnn']}; Python {info['python']}; "
        f"{info['cpus']} CPU cores ({info['cpu']}); {check.date}.",
        "",
    ]
    present = [f"{name} {version}" for name, version in info["packages"].items() if version]
    missing = [
        f"{name} ({PACKAGES[name]})"
        for name, version in info["packages"].items()
        if not version and not (check.plan.dry and name in GPU_ONLY)
    ]
    lines.append("Packages: " + ", ".join(present) + "." + (f" **Missing**: {', '.join(missing)}." if missing else ""))
    if "crate_compose_error" in info:
        lines += ["", f"**crate_compose does not import**: {info['crate_compose_error']} (the later steps need it)."]
    else:
        lines += ["", f"crate_compose imported from `{Path(info['crate_compose']).parent}`."]
    return lines


# ---- b. the test suite ---------------------------------------------------------------------------------------

PROGRESS = re.compile(r"^([.sFExX]+)\s*(\[\s*\d+%\])?$")
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)\b")
FAILED = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")
SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$")


def pytest_counts(text: str) -> dict:
    """Counts, failures and skip reasons from pytest's ``-q -ra`` output; from the progress characters when the
    final summary line is missing (a run stopped at its limit)."""
    lines = text.splitlines()
    final = next(
        (line for line in reversed(lines) if re.search(r"\bin [\d.]+s\b", line) and SUMMARY.search(line)), None
    )
    counts: dict[str, int] = {}
    if final:
        for number, kind in SUMMARY.findall(final):
            counts["errors" if kind.startswith("error") else kind] = int(number)
    else:
        marks = "".join(m.group(1) for m in map(PROGRESS.match, lines) if m)
        counts = {
            "passed": marks.count("."),
            "failed": marks.count("F"),
            "skipped": marks.count("s"),
            "errors": marks.count("E"),
        }
    failures = [
        {"test": m.group(2).removeprefix("tests/"), "message": (m.group(3) or "")[:160]}
        for m in map(FAILED.match, lines)
        if m
    ]
    reasons: dict[str, int] = {}
    for m in filter(None, map(SKIPPED.match, lines)):
        reasons[m.group(2)] = reasons.get(m.group(2), 0) + int(m.group(1))
    return {
        "counts": counts,
        "complete": final is not None,
        "failures": failures,
        "skip_reasons": sorted(reasons.items(), key=lambda item: -item[1]),
    }


def tests_step(check: Check) -> list[str]:
    plan = check.plan
    done = check.run([sys.executable, "-m", "pytest", *plan.pytest], plan.pytest_want, plan.least["tests"], "pytest")
    output = done.out + "\n" + done.err
    found = pytest_counts(output)
    check.data["tests"] = {
        **found,
        "seconds": done.seconds,
        "returncode": done.returncode,
        "timed_out": done.timed_out,
        "tail": "\n".join(output.splitlines()[-300:]),
    }
    check.keep("pytest.log", "\n".join(output.splitlines()[-2000:]) + "\n", 3)
    if not found["complete"] and not sum(found["counts"].values()):
        raise StepFailed(f"pytest reported no test ({failure(done)})", done.tail())
    counts = ", ".join(f"{n:,} {kind}" for kind, n in found["counts"].items())
    status = (
        f"stopped at its limit of {done.limit:.0f} s: the counts are those of the progress line so far"
        if done.timed_out
        else f"{done.seconds:.0f} s"
    )
    lines = [
        f"`python -m pytest {' '.join(plan.pytest)}` ({status}): **{counts}**"
        + (
            " (`-x`: it stops at the first failure)."
            if found["counts"].get("failed") or found["counts"].get("errors")
            else "."
        )
    ]
    if found["failures"]:
        lines += ["", "Failures:", ""] + [
            f"- `{f['test']}`" + (f": {f['message']}" if f["message"] else "") for f in found["failures"][:20]
        ]
    if found["skip_reasons"]:
        lines += ["", "Skipped, the most common reasons:", ""] + [
            f"- {n}: {reason[:160]}" for reason, n in found["skip_reasons"][:5]
        ]
    return lines


# ---- c. the training step ------------------------------------------------------------------------------------


def step_table(stdout: str) -> list[str]:
    """train_step.py's table of training steps (header, rule and rows) from its Markdown."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| dtype | compile | model | first step s"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def ratio_rows(runs: list[tuple[TrainRun, dict]], goal_batch: int) -> list[dict]:
    """CRATE-B's images/s over ViT-B/16's for each (batch, dtype, compile) that train_step.py measured, with the
    issue's goal where one applies (bf16 at the goal's batch)."""
    rows = []
    for run, measured in runs:
        for r in measured["results"]:
            crate, vit = (r["models"][name]["step"]["images_per_s"] for name in ("crate-base", "vit_base_patch16_224"))
            goal = RATIO_GOALS[r["compile"]] if run.batch == goal_batch and r["dtype"] == "bfloat16" else None
            rows.append(
                {
                    "batch": run.batch,
                    "dtype": r["dtype"],
                    "compile": r["compile"],
                    "crate_images_per_s": crate,
                    "vit_images_per_s": vit,
                    "ratio": crate / vit,
                    "goal": goal,
                }
            )
    return sorted(rows, key=lambda row: (row["batch"] != goal_batch, row["batch"], row["dtype"], row["compile"]))


def train_step(check: Check) -> list[str]:
    plan = check.plan
    runs, notes, tables, failed = [], [], {}, []
    check.data["train_step"] = {}
    for index, run in enumerate(plan.train_runs):
        later = sum(r.least for r in plan.train_runs[index + 1 :] if not r.optional)
        json_path = check.work / f"train-step-{index}.json"
        cmd = [sys.executable, HERE / "train_step.py", *plan.train_common, *run.args, "--json", json_path]
        try:
            done = check.run(cmd, run.want, run.least, f"train-step-{index}", reserve=later)
        except Skipped as skipped:
            notes.append(f"- {run.label}: **skipped**: {skipped}.")
            continue
        if done.timed_out or done.returncode or not json_path.exists():
            failed.append(run.label)
            notes.append(f"- {run.label}: **failed** ({failure(done)}):")
            notes += ["", *("    " + line for line in done.tail(10).splitlines()), ""]
            continue
        measured = json.loads(json_path.read_text())
        check.data["train_step"][run.label] = measured
        runs.append((run, measured))
        table = step_table(done.out)
        tables.setdefault(run.batch, table[:2])
        tables[run.batch] += table[2:]
        notes.append(f"- {run.label}: `train_step.py {' '.join(plan.train_common + run.args)}` ({done.seconds:.0f} s)")
    if not runs:
        raise StepFailed("no run of train_step.py gave figures", "\n".join(notes))
    rows = ratio_rows(runs, plan.goal_batch)
    check.data["train_ratios"] = rows
    lines = [
        f"Goal: CRATE-B >= {RATIO_GOALS[True]:g}x ViT-B/16's images/s in bf16 compiled at batch {plan.goal_batch}, "
        f">= {RATIO_GOALS[False]:g}x in bf16 eager. A training step: forward, cross-entropy, backward, AdamW "
        "(train_step.py; the forward-only timings left out).",
        "",
        "| batch | dtype | compile | CRATE-B images/s | ViT-B/16 images/s | CRATE-B / ViT-B | goal |",
        "| ---: | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        if row["goal"] is None:
            goal = ""
        elif plan.dry:  # CPU toy sizes say nothing of a GPU goal
            goal = f">= {row['goal']:g} (a GPU's goal: not judged in a dry run)"
        else:
            goal = f">= {row['goal']:g}: **{'met' if row['ratio'] >= row['goal'] else 'not met'}**"
        lines.append(
            f"| {row['batch']} | {row['dtype']} | {'on' if row['compile'] else 'off'} | {row['crate_images_per_s']:,.1f} | "
            f"{row['vit_images_per_s']:,.1f} | {row['ratio']:.2f} | {goal} |"
        )
    measured_goals = {(row["compile"]) for row in rows if row["goal"] is not None}
    for compiled in (True, False):
        if compiled not in measured_goals:
            lines += [
                "",
                f"The {'compiled' if compiled else 'eager'} bf16 goal at batch {plan.goal_batch} was not measured.",
            ]
    lines += ["", "The runs:", "", *notes]
    for batch, table in tables.items():
        lines += ["", f"train_step.py's tables, batch {batch}:", "", *table]
    if failed:
        raise StepFailed(
            f"train_step.py failed in {len(failed)} of its {len(plan.train_runs)} runs ({', '.join(failed)}); "
            "the figures of the others below",
            lines=lines,
        )
    return lines


# ---- d. profiles ---------------------------------------------------------------------------------------------


ANNOTATIONS = ("Optimizer.", "ProfilerStep", "autograd::", "aten::", "torch::", "## ")  # ranges, not kernels


def device_work(prof, device) -> list[tuple[str, float, float]]:
    """(name, start us, us) of each piece of work the device did in a profile: on CUDA its kernels, copies and
    sets (user annotations left out), each its interval; on the CPU each ``aten::`` operator's own time (less
    the operators it calls), which stands for a kernel."""
    from torch.autograd import DeviceType

    work = []
    for event in prof.events():
        if (
            getattr(event, "is_user_annotation", False)
            or "annotation" in str(getattr(event, "activity_type", "")).lower()
        ):
            continue
        start = float(event.time_range.start)
        if device.type == "cuda" and event.device_type == DeviceType.CUDA and not event.name.startswith(ANNOTATIONS):
            work.append((event.name, start, float(event.time_range.end) - start))
        elif device.type != "cuda" and event.device_type == DeviceType.CPU and event.name.startswith("aten::"):
            work.append((event.name, start, float(event.self_cpu_time_total)))
    return work


def busy_us(work: list[tuple[str, float, float]], union: bool) -> float:
    """The time the device worked: the length of the union of the intervals (``union``: kernels, which may
    overlap), else the sum (the CPU's operators' own times, which do not)."""
    if not union:
        return sum(us for _, _, us in work)
    total, end = 0.0, -math.inf
    for _, start, us in sorted(work, key=lambda w: w[1]):
        if start + us > end:
            total += start + us - max(start, end)
            end = start + us
    return total


def kernel_summary(work: list[tuple[str, float, float]], steps: int, step_s: float, union: bool, top: int = 15) -> dict:
    by_name: dict[str, list[float]] = {}
    for name, _, us in work:
        by_name.setdefault(name, []).append(us)
    total = sum(us for _, _, us in work) or 1.0
    kernels = [
        {
            "name": name,
            "share": sum(t) / total,
            "ms_per_step": sum(t) / steps / 1e3,
            "calls_per_step": len(t) / steps,
            "mean_us": sum(t) / len(t),
        }
        for name, t in by_name.items()
    ]
    kernels.sort(key=lambda k: -k["share"])
    return {
        "kernels_per_step": len(work) / steps,
        "busy_ms_per_step": busy_us(work, union) / steps / 1e3,
        "kernel_ms_per_step": total / steps / 1e3,
        "step_ms": step_s * 1e3,
        "distinct": len(by_name),
        "top": kernels[:top],
    }


def part_profile(plan: Plan) -> dict:
    import torch
    import train_step as ts
    from torch.profiler import ProfilerActivity, profile

    timm = ts.need_timm()
    device = torch.device(plan.device)
    if device.type == "cuda":  # as train_step.py: float32 stays float32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    p = plan.profile
    args = argparse.Namespace(size=p["size"], batch=p["batch"], compile_mode=None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    found = {}
    for name in ts.MODELS:
        trainer = ts.Trainer(name, args, device, ts.DTYPES[p["dtype"]], False, timm)
        for _ in range(1 + p["warmup"]):
            trainer.step()
        step_s = statistics.median(timed(trainer.step, device, 1.0, 0)[0] for _ in range(p["timed"]))
        synchronize(device)
        with profile(activities=activities) as prof:
            for _ in range(p["profiled"]):
                trainer.step()
            synchronize(device)
        summary = kernel_summary(device_work(prof, device), p["profiled"], step_s, union=device.type == "cuda")
        try:
            table = prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=90)
        except (AttributeError, KeyError, ValueError):
            table = prof.key_averages().table(sort_by=sort.replace("device", "cuda"), row_limit=40)
        found[ts.SHORT[name]] = {**summary, "table": table}
        del trainer, prof
        ts.release()
    return found


def short(name: str, width: int = 90) -> str:
    name = name.removeprefix("void ").replace("|", "/").replace("`", "'")
    return name if len(name) <= width else name[: width - 1] + "…"


def profile_step(check: Check) -> list[str]:
    plan, p = check.plan, check.plan.profile
    found = check.part("profile", p["want"], plan.least["profile"])
    check.data["profile"] = found
    unit = "GPU" if plan.device == "cuda" else "CPU"
    lines = [
        f"One {p['dtype']}{' autocast' if p['dtype'] == 'bfloat16' else ''} training step, eager, batch {p['batch']} at "
        f"{p['size']}x{p['size']} (train_step.py's `Trainer`: forward, cross-entropy, backward, AdamW); {p['profiled']} "
        f"step{'s' * (p['profiled'] != 1)} profiled after {1 + p['warmup']}; the step's wall time is the median of {p['timed']} unprofiled, "
        f"synchronized steps; busy: the union of the kernels' intervals."
        + (
            ""
            if plan.device == "cuda"
            else " On the CPU each `aten::` operator's own time (less the operators it "
            "calls) stands for a kernel, and busy is their sum."
        ),
        "",
        f"| model | step ms (wall) | {unit} busy ms per step | busy / wall | kernels per step | distinct kernels | top 15 share |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model, s in found.items():
        lines.append(
            f"| {model} | {s['step_ms']:,.2f} | {s['busy_ms_per_step']:,.2f} | {s['busy_ms_per_step'] / s['step_ms']:.0%} | "
            f"{s['kernels_per_step']:,.0f} | {s['distinct']:,} | {sum(k['share'] for k in s['top']):.0%} |"
        )
    for model, s in found.items():
        lines += [
            "",
            f"{model}: the 15 kernels with the most {unit} time",
            "",
            f"| kernel | share of {unit} time | ms per step | calls per step | mean us |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        lines += [
            f"| `{short(k['name'])}` | {k['share']:.1%} | {k['ms_per_step']:,.3f} | {k['calls_per_step']:,.0f} | "
            f"{k['mean_us']:,.1f} |"
            for k in s["top"]
        ]
    check.keep("profile.txt", "\n\n".join(f"{model}\n\n{s['table']}" for model, s in found.items()), 3)
    return lines


# ---- e. the optimizer step -----------------------------------------------------------------------------------


def part_adamw(plan: Plan) -> dict:
    import optimizer_step as bench
    import torch

    device = torch.device(plan.device)
    sizes = bench.shapes()
    kinds = {"foreach": {"foreach": True}, "fused": {"fused": True}}
    optimizers = {
        kind: torch.optim.AdamW(bench.groups(bench.parameters(sizes, device)), lr=bench.LR, **options)
        for kind, options in kinds.items()
    }
    for optimizer in optimizers.values():
        for _ in range(1 + plan.adamw["warmup"]):
            optimizer.step()
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(plan.adamw["runs"]):
        for kind, optimizer in optimizers.items():
            times[kind].append(timed(optimizer.step, device, 1.0, 0)[0])
    params = {kind: [p for group in o.param_groups for p in group["params"]] for kind, o in optimizers.items()}
    difference = max((a - b).abs().max().item() for a, b in zip(params["foreach"], params["fused"]))
    return {
        "parameters": sum(s.numel() for s in sizes),
        "tensors": len(sizes),
        "steps": 1 + plan.adamw["warmup"] + plan.adamw["runs"],
        "times_s": times,
        "median_s": {k: statistics.median(t) for k, t in times.items()},
        "min_s": {k: min(t) for k, t in times.items()},
        "max_abs_difference": difference,
    }


def adamw_lines(check: Check) -> list[str]:
    plan = check.plan
    found = check.part("adamw", plan.adamw["want"], 10)
    check.data["adamw"] = found
    median, least = found["median_s"], found["min_s"]
    lines = [
        f"AdamW over CRATE-B's {found['parameters']:,} parameters ({found['tensors']} tensors, optimizer_step.py's "
        f"groups and random gradients), `optimizer.step()` alone, {plan.adamw['runs']} interleaved rounds after "
        f"{1 + plan.adamw['warmup']} steps of each:",
        "",
        "| torch.optim.AdamW | step ms (median) | min ms | foreach / this |",
        "| --- | ---: | ---: | ---: |",
    ]
    for kind in ("foreach", "fused"):
        lines.append(
            f"| {kind}=True | {ms(median[kind])} | {ms(least[kind])} | {median['foreach'] / median[kind]:.2f} |"
        )
    return lines + [
        "",
        f"Largest difference between their parameters after {found['steps']} steps: {found['max_abs_difference']:.2e}.",
    ]


def optimizer_step(check: Check) -> list[str]:
    plan = check.plan
    lines, errors = [], []
    try:
        done = check.run(
            [sys.executable, HERE / "optimizer_step.py", *plan.optimizer_args], 30, 10, "optimizer-step", reserve=10
        )
        if done.timed_out or done.returncode:
            raise StepFailed(failure(done), done.tail(8))
        body = [line for line in done.out.strip().splitlines() if not line.startswith("## ")]
        lines += [f"Lion: `optimizer_step.py {' '.join(plan.optimizer_args)}`:", *body]
        check.data["optimizer_step"] = done.out
    except Skipped as skipped:
        lines += [f"Lion (`optimizer_step.py`): **skipped**: {skipped}."]
    except StepFailed as failed:
        errors.append(f"optimizer_step.py: {failed}")
        lines += [
            f"Lion (`optimizer_step.py {' '.join(plan.optimizer_args)}`): **error**: {failed}",
            *code_block(failed.tail),
        ]
    try:
        lines += ["", *adamw_lines(check)]
    except StepFailed as failed:
        errors.append(f"AdamW: {failed}")
        lines += ["", f"AdamW, foreach against fused: **error**: {failed}", *code_block(failed.tail)]
    if errors:
        raise StepFailed("; ".join(errors) + " (the rest of the step's figures below)", lines=lines)
    return lines


# ---- f. the folder run ---------------------------------------------------------------------------------------


def collapse(rows: list[dict], band: float = COLLAPSE_BAND, low: float = LOW_LOSS, least: int = 2) -> dict | None:
    """The collapse of a run, from its metrics rows: the first logged training loss from which every later one
    stays within ``band`` of ln 10 (a constant output over 10 classes), at ``least`` logged steps at the end
    of the run, after the loss had been below ``low``; None when the run did not collapse."""
    train = sorted((r["step"], float(r["loss"])) for r in rows if r.get("kind") == "train" and "loss" in r)
    below = False
    for i, (step, loss) in enumerate(train):
        if below and len(train) - i >= least and all(abs(later - LN10) <= band for _, later in train[i:]):
            return {
                "step": step,
                "loss": loss,
                "before_step": train[i - 1][0],
                "before_loss": train[i - 1][1],
                "logged_after": len(train) - i,
                "last_step": train[-1][0],
            }
        below = below or loss < low
    return None


def read_rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a killed run
    return rows


def split_weights(path: Path, stem: str) -> dict[str, bytes]:
    """A safetensors file as files of at most :data:`PART_BYTES` each (by tensor): ``STEM-1of2.safetensors``, ..."""
    from safetensors.torch import load_file, save

    parts: list[dict] = [{}]
    size = 0
    for name, tensor in load_file(str(path)).items():
        nbytes = tensor.numel() * tensor.element_size()
        if parts[-1] and size + nbytes > PART_BYTES:
            parts.append({})
            size = 0
        parts[-1][name] = tensor
        size += nbytes
    return {
        f"{stem}-{i}of{len(parts)}.safetensors": save(part, metadata={"part": f"{i} of {len(parts)}", "of": str(path)})
        for i, part in enumerate(parts, 1)
    }


def folder_step(check: Check) -> list[str]:
    plan = check.plan
    run, figure_path = check.work / "folder-run", check.work / "folder-run.png"
    cmd = [
        sys.executable,
        HERE / "folder_run.py",
        *plan.folder_args,
        "--data",
        check.work / "digits",
        "--out",
        run,
        "--figure",
        figure_path,
    ]
    done = check.run(cmd, plan.folder_want, plan.least["folder"], "folder-run")
    metrics = run / "metrics.jsonl"
    if not metrics.exists():
        raise StepFailed(f"no metrics.jsonl ({failure(done)})", done.tail())
    rows = read_rows(metrics)
    check.keep("metrics.jsonl", metrics.read_bytes(), 1)
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    if not figure_path.exists() and train:  # folder_run.py draws it only after a run that ended well
        try:
            from folder_run import figure

            figure(run, figure_path)
        except Exception as error:  # noqa: BLE001  (the figure is a convenience: say so, go on)
            check.clock.say(f"  no figure: {error}")
    if figure_path.exists():
        check.keep("folder-run.png", figure_path.read_bytes(), 1)
    ended = "ended well" if done.returncode == 0 and not done.timed_out else f"**{failure(done)}**"
    lines = [
        f"`folder_run.py {' '.join(plan.folder_args)}`: {ended}, {done.seconds:.0f} s, "
        f"{train[-1]['step'] if train else 0:,} steps logged."
    ]
    if done.returncode and not done.timed_out:
        message = next((line for line in reversed(done.err.splitlines()) if line.startswith("error")), done.tail(3))
        lines += ["", f"It said: {message}"]
    lines += ["", "| step | training loss | lr |", "| ---: | ---: | ---: |"]
    shown = [r for r in train if r["step"] % plan.loss_every == 0]
    if train and (not shown or shown[-1] is not train[-1]):
        shown.append(train[-1])
    lines += [f"| {r['step']:,} | {r['loss']:.4f} | {r['lr']:.2e} |" for r in shown]
    if evals:
        lines += ["", "Test accuracy: " + ", ".join(f"{r['test_accuracy']:.3f} at {r['step']:,}" for r in evals) + "."]
    found = collapse(rows)
    check.data["folder_run"] = {
        "returncode": done.returncode,
        "timed_out": done.timed_out,
        "seconds": done.seconds,
        "collapse": found,
        "last_step": train[-1]["step"] if train else None,
    }
    if found is None:
        lines += [
            "",
            f"**No collapse**: the training loss did not come back to within {COLLAPSE_BAND} of ln 10 = {LN10:.3f} "
            f"to stay after it had been below {LOW_LOSS}.",
        ]
        return lines
    lines += [
        "",
        f"**Collapsed**: the training loss was {found['before_loss']:.4f} at step {found['before_step']:,}, "
        f"{found['loss']:.4f} at step {found['step']:,}, and stayed within {COLLAPSE_BAND} of ln 10 = {LN10:.3f} to "
        f"step {found['last_step']:,}.",
    ]
    steps = sorted(int(p.name.removeprefix("step-")) for p in (run / "checkpoints").glob("step-*") if p.is_dir())
    before = max((s for s in steps if s <= found["before_step"]), default=None)
    after = min((s for s in steps if s >= found["step"]), default=None)
    kept = []
    for label, step in (("before", before), ("after", after)):
        if step is None:
            kept.append(f"no checkpoint {label} the jump")
            continue
        parts = split_weights(run / "checkpoints" / f"step-{step:06d}" / "model.safetensors", f"weights-step{step:06d}")
        for name, content in parts.items():
            check.keep(name, content, 2)
        kept.append(f"step {step:,} {label} the jump: `{'`, `'.join(parts)}`")
    lines += [
        "",
        "Kept: the weights (`model.safetensors`) of the checkpoints at "
        + "; ".join(kept)
        + " (each split by tensor into files under 16 MiB: load them all and merge the dictionaries), and `metrics.jsonl`.",
    ]
    return lines


# ---- the section and the out dir -----------------------------------------------------------------------------

STEPS = (  # key, heading, function
    ("machine", "a. The machine", machine_step),
    ("tests", "b. The GPU test suite", tests_step),
    ("train", "c. Training step: CRATE-B against ViT-B/16", train_step),
    ("profile", "d. Profiles of one training step", profile_step),
    ("optimizer", "e. The optimizer step alone", optimizer_step),
    ("folder", "f. The bf16 + compile folder run, and its collapse", folder_step),
)
PARTS = {"machine": part_machine, "profile": part_profile, "adamw": part_adamw}


def chosen_files(files: dict[str, tuple[int, bytes]]) -> tuple[list[str], list[str]]:
    """The files that go to the out dir (section.md among them): the first :data:`MAX_FILES` by priority, each
    under :data:`MAX_BYTES`; and a note for each left out."""
    kept, notes = [], []
    for name, (_, content) in sorted(files.items(), key=lambda item: item[1][0]):
        if len(content) > MAX_BYTES:
            notes.append(f"{name} left out: {len(content) / 2**20:.1f} MiB, over {MAX_BYTES // 2**20} MiB")
        elif len(kept) >= MAX_FILES - 1:  # section.md takes one place
            notes.append(f"{name} left out: {MAX_FILES} files at most")
        else:
            kept.append(name)
    return ["section.md", *kept], notes


def commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "commit unknown"
    if head.returncode:
        return "commit unknown (no git here)"
    return f"commit {head.stdout.strip()}" + (" with uncommitted changes" if dirty.stdout.strip() else "")


def device_name(check: Check) -> str:
    if "machine" in check.data:
        return check.data["machine"]["device"] + (" (CPU, dry run)" if check.plan.dry else "")
    return (nvidia_smi("name") or "unknown GPU") if not check.plan.dry else f"{cpu_name()} (CPU, dry run)"


def section(check: Check, bodies: list[tuple[str, list[str]]], files: list[str], notes: list[str]) -> str:
    plan = check.plan
    command = "python benchmarks/device_check.py" + (" --dry-run" if plan.dry else "")
    lines = [f"## device_check.py: {device_name(check)}, {check.date}", ""]
    if plan.dry:
        lines += [DRY_NOTE, ""]
    statuses = check.data["steps"]
    failed = [key for key, s in statuses.items() if s["status"] != "ok"]
    lines += [
        f"`{command}` (`make device-check`), {commit()}: {check.clock.elapsed():.0f} s of its {plan.budget:.0f} s budget; "
        + (f"steps not reported in full: {', '.join(failed)}" if failed else "every step reported")
        + f". Files beside this section: {', '.join(f'`{f}`' for f in files if f != 'section.md')}."
        + (" " + "; ".join(notes) + "." if notes else "")
    ]
    for heading, body in bodies:
        lines += ["", f"### {heading}", "", *body]
    return "\n".join(lines) + "\n"


def run_check(plan: Plan, out_dir: Path, work: Path) -> tuple[str, bool]:
    clock = Clock(plan.budget)
    check = Check(plan, clock, work)
    check.data.update(date=check.date, dry_run=plan.dry, budget_s=plan.budget, steps={})
    bodies = []
    for index, (key, heading, function) in enumerate(STEPS):
        check.reserve = sum(plan.least[k] for k, _, _ in STEPS[index + 1 :])
        clock.say(heading)
        began = time.monotonic()
        try:
            body, status = function(check), "ok"
        except Skipped as skipped:
            body, status = [f"**Skipped**: {skipped}."], "skipped"
        except StepFailed as failed:
            body, status = (
                [
                    f"**Error**: {failed}",
                    *(code_block(failed.tail) if failed.tail else []),
                    *(["", *failed.lines] if failed.lines else []),
                ],
                "error",
            )
        except Exception as error:  # noqa: BLE001  (one step's failure is reported; the next step runs)
            body, status = [f"**Error**: {type(error).__name__}: {error}"], "error"
        seconds = time.monotonic() - began
        check.data["steps"][key] = {"heading": heading, "status": status, "seconds": seconds}
        clock.say(f"{heading}: {status}, {seconds:.0f} s")
        bodies.append((heading, [f"_{seconds:.0f} s._", "", *body]))
    check.data["wall_s"] = clock.elapsed()
    check.keep("device-check.json", json.dumps(check.data, indent=1, default=str), 0)
    files, notes = chosen_files(check.files)
    text = section(check, bodies, files, notes)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "section.md").write_text(text)
    for name in files[1:]:
        (out_dir / name).write_bytes(check.files[name][1])
    clock.say(f"wrote {len(files)} files to {out_dir}")
    return text, all(s["status"] == "ok" for s in check.data["steps"].values())


def cuda_missing() -> str | None:
    """Why this machine cannot run the check on a GPU, or None."""
    try:
        import torch
    except ImportError as error:
        return f"this Python ({sys.executable}) has no torch: {error}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device here"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at toy sizes (no GPU needed)")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where the section and its files go (default: $OUT when set, else runs/device-check)",
    )
    parser.add_argument("--append", action="store_true", help="also append the section to benchmarks/RESULTS.md")
    parser.add_argument(
        "--budget", type=float, default=None, help="seconds for the whole check (default 480; dry run 300)"
    )
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="where the runs write (default: a temporary folder, removed)"
    )
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)  # one measurement, in a child process
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    budget = args.budget or (300.0 if args.dry_run else 480.0)
    plan = dry_plan(budget) if args.dry_run else gpu_plan(budget)
    if args.part:
        args.result.write_text(json.dumps(PARTS[args.part](plan), default=str))
        return 0
    if args.append and args.dry_run:
        parser.error("--append with --dry-run would put toy CPU figures in benchmarks/RESULTS.md")
    if not args.dry_run and (why := cuda_missing()):
        print(
            f"benchmarks/device_check.py needs a CUDA GPU: {why}.\n"
            "To check the script and its section on the CPU, at toy sizes: python benchmarks/device_check.py --dry-run",
            file=sys.stderr,
        )
        return 2
    out_dir = args.out_dir or Path(os.environ.get("OUT") or ROOT / "runs" / "device-check")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="device-check-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        text, ok = run_check(plan, out_dir, work)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    publish(text, str(RESULTS) if args.append else None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
