"""The machinery of the run-time corpus: a case, its context, the runners and the judge.

See ``tests/runtime/__init__.py`` for what the corpus checks and how to run it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from disks import Disk  # tests/disks.py

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"]
SETS = [arg for override in TINY for arg in ("--set", override)]
LM = "causal-crate-bytes"  # a byte-level preset, made small
LM_TINY = ["sizes.d=32", "sizes.heads=2", "sizes.depth=1", "sizes.context=32"]
LM_SETS = [arg for override in LM_TINY for arg in ("--set", override)]
MLM = "crate-bert-mini"  # a masked language model, made small (context 16)
MLM_TINY = ["sizes.context=16", "sizes.d=16", "sizes.heads=2", "sizes.depth=1"]
MLM_SETS = [arg for override in MLM_TINY for arg in ("--set", override)]

TRACEBACK = "Traceback (most recent call last)"
SCREEN = 40  # lines a refusal may print
MEMORY_MARGIN = 2 * 1024**3  # address space an in-process case may add (tests/guards.py)
SUBPROCESS_MEMORY = 3 * 1024**3  # RLIMIT_AS of a command run as its own process
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
    "COLUMNS": "120",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
for _name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CRATE_COMPOSE_MEMORY_LIMIT"):
    ENV.pop(_name, None)


def train_args(out: Path | str, *extra: str, steps: int = 4, sets: Sequence[str] = ()) -> list[str]:
    """The session's tiny run (crate-digits, d 16, one layer, 4 steps, checkpoints at 2 and 4) into ``out``."""
    overrides = [arg for o in [*TINY, *sets] for arg in ("--set", o)]
    return [
        "train",
        DIGITS,
        *overrides,
        "--data",
        "digits",
        "--steps",
        str(steps),
        "--batch-size",
        "16",
        "--log-every",
        "1",
        "--checkpoint-every",
        "2",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


# ---------------------------------------------------------------- a case


@dataclass
class Result:
    """What a command did: its exit status (an int, or 'timeout'), output, wall time and peak RSS."""

    status: int | str
    out: str = ""
    err: str = ""
    wall: float = 0.0
    peak_mb: float | None = None
    crash: str = ""  # an exception that escaped cli.main, as a process would print it
    extra: dict = field(default_factory=dict)  # what a custom runner measured besides (torchrun's ranks)

    @property
    def output(self) -> str:
        return self.out + self.err + self.crash


@dataclass
class Case:
    """One run-time hostile case.

    ``setup(ctx)`` prepares the case's folder (``ctx.tmp``, also the working directory); ``argv(ctx)``
    gives the command line (``crate-compose`` arguments, or a whole command for ``mode='subprocess'``
    when it starts with an absolute path); ``expect`` the exit statuses a good tool gives;
    ``message`` a regex the output must match (searched in stderr for a failure, in stdout and stderr
    for a success; ``<RUN>``, ``<TMP>``, ``<CK2>``, ``<CK4>`` stand for those paths, escaped);
    ``seconds`` the wall time the command may take; ``memory_mb`` the peak RSS it may reach (own
    processes only; in-process cases are held by an address-space guard). ``may_change`` (globs
    relative to ``ctx.tmp``) is what the command may write, replace or delete: everything else must
    be as it was, byte for byte, and ``keep`` globs must be unchanged even where ``may_change``
    allows. ``check(ctx, result)`` returns further problems."""

    id: str
    category: str
    slug: str
    why: str
    setup: Callable[["Ctx"], None]
    argv: Callable[["Ctx"], list]
    expect: tuple[int, ...]
    message: str | None = None
    seconds: float = 5.0
    memory_mb: float | None = None
    mode: str = "inprocess"  # or "subprocess", or "custom" (``runner``)
    may_change: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    check: Callable[["Ctx", Result], list[str]] | None = None
    runner: Callable[["Ctx", "Case"], Result] | None = None
    pipe: bool = False  # subprocess: stderr a pipe instead of a file

    @property
    def name(self) -> str:
        return f"{self.id}-{self.category}-{self.slug}"


# ---------------------------------------------------------------- the context of one case


class Ctx:
    """A case's folder and what it may need: copies of the session's run and ablation, a small disk."""

    def __init__(self, tmp: Path, resources: "Resources", monkeypatch) -> None:
        self.tmp, self.resources, self.monkeypatch = tmp, resources, monkeypatch
        self.cleanups: list[Callable[[], None]] = []
        self.notes: dict[str, Any] = {}
        self.disk: Disk | None = None

    # the run and its variants
    @property
    def run(self) -> Path:
        return self.tmp / "run"

    def ck(self, step: int, run: Path | None = None) -> Path:
        return (run or self.run) / "checkpoints" / f"step-{step:06d}"

    def finished(self, where: Path | None = None) -> Path:
        """A copy of the session's finished 4-step run (checkpoints at 2 and 4, final/, result.json)."""
        target = where or self.run
        shutil.copytree(self.resources.base_run(), target, symlinks=True)
        return target

    def killed(self, at: int = 2, where: Path | None = None) -> Path:
        """The run as a SIGKILL after its checkpoint at step ``at`` leaves it: no later checkpoint, no
        final/, no result.json (metrics.jsonl keeps the rows written after the checkpoint)."""
        run = self.finished(where)
        for step in (2, 4):
            if step > at:
                shutil.rmtree(self.ck(step, run))
        if at < 2:
            shutil.rmtree(run / "checkpoints")
        shutil.rmtree(run / "final")
        (run / "result.json").unlink()
        return run

    def mlm(self, where: Path | None = None) -> Path:
        """A copy of the session's masked language model run (:meth:`Resources.mlm_run`)."""
        target = where or self.run
        shutil.copytree(self.resources.mlm_run(), target, symlinks=True)
        return target

    def ablation(self, where: Path | None = None) -> Path:
        """A copy of the session's finished ablation (ista and ista_soft, 3 steps, seed 0)."""
        target = where or self.tmp / "abl"
        shutil.copytree(self.resources.ablation(), target, symlinks=True)
        return target

    # editing checkpoints
    def edit_json(self, path: Path, change: Callable[[Any], Any]) -> None:
        content = json.loads(path.read_text())
        change(content)  # in place
        path.write_text(json.dumps(content, indent=2))

    def edit_state(self, step: int, change: Callable[[dict], Any]) -> None:
        self.edit_json(self.ck(step) / "state.json", change)

    def edit_tensors(self, path: Path, change: Callable[[dict], Any]) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(path)
        change(tensors)
        save_file({k: v.contiguous() for k, v in tensors.items()}, path)

    # a small disk
    def small_disk(self, size: str = "256k", name: str = "disk") -> "Disk":
        """A tmpfs of ``size`` at ``ctx.tmp/name`` (unmounted after the case); where mounting is not
        permitted (or with ``RUNTIME_CORPUS_INJECT=1``), a folder whose writes fail as a full or read-only
        disk would make them fail."""
        folder = self.tmp / name
        folder.mkdir()
        mounted = (
            not os.environ.get("RUNTIME_CORPUS_INJECT")
            and shutil.which("mount") is not None
            and subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
            ).returncode
            == 0
        )
        if mounted:
            self.cleanups.append(lambda: subprocess.run(["umount", "-l", str(folder)], capture_output=True))
        self.disk = Disk(folder, self.monkeypatch, real=mounted)
        return self.disk

    # processes this case started
    def spawn(self, argv: list[str], **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(argv, env=ENV, start_new_session=True, **kwargs)

        def stop() -> None:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

        self.cleanups.append(stop)
        return process

    def hold_lock(self, folder: Path) -> int:
        """Hold ``folder``'s lock from another process (crate_compose.training.run_folder.locks); returns its pid."""
        code = (
            "import sys, time\nfrom crate_compose.training.run_folder import locks\nheld = locks.hold(sys.argv[1])\n"
            "held.__enter__()\nprint('held', flush=True)\ntime.sleep(300)\n"
        )
        process = self.spawn(
            [PYTHON, "-c", code, str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self.tmp
        )
        line = process.stdout.readline()
        if line.strip() != b"held":
            raise AssertionError(f"the lock holder did not start: {process.stderr.read()[-2000:]!r}")
        self.notes["holder"] = process.pid
        return process.pid

    def close(self) -> None:
        for cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception:  # a cleanup must not hide the case's own failure
                traceback.print_exc()
        self.cleanups.clear()


# ---------------------------------------------------------------- session resources


class Resources:
    """What several cases start from, made once per session on first use."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._made: dict[str, Path] = {}

    def _once(self, name: str, make: Callable[[Path], None]) -> Path:
        if name not in self._made:
            path = self.folder / name
            make(path)
            self._made[name] = path
        return self._made[name]

    def base_run(self) -> Path:
        def make(path: Path) -> None:
            code, out, err = cli_quiet(train_args(path))
            assert code == 0, f"the session's run did not train:\n{err[-3000:]}"

        return self._once("run", make)

    def mlm_run(self) -> Path:
        """A masked language model (crate-bert-mini at context 16, d 16, one layer; task mlm, 2 steps) trained
        on a small folder of generated text with a WordPiece vocabulary of at most 64 tokens: fill reads it."""

        def make(path: Path) -> None:
            texts = text_folder(self.folder / "mlm-texts")
            code, out, err = cli_quiet(mlm_args(path, f"wordpiece-64:folder:{texts}", steps=2))
            assert code == 0 and (path / "tokenizer.json").is_file(), (
                f"the session's mlm run did not train:\n{err[-3000:]}"
            )

        return self._once("mlm-run", make)

    def ablation(self) -> Path:
        def make(path: Path) -> None:
            code, out, err = cli_quiet(ablate_args(path, "--steps", "3"))
            assert code == 0, f"the session's ablation did not run:\n{err[-3000:]}"

        return self._once("ablation", make)

    def bomb(self) -> Path:
        """A 13000x13000 PNG of about 164 kB (Pillow's decompression-bomb threshold is 89,478,485 pixels)."""

        def make(path: Path) -> None:
            from PIL import Image

            path.mkdir()
            Image.new("L", (13000, 13000)).save(path / "bomb.png", optimize=True)

        return self._once("bomb", make) / "bomb.png"


def mlm_args(out: Path | str, data: str, *extra: str, steps: int = 1) -> list[str]:
    """A tiny masked language model (crate-bert-mini, context 16) trained on ``data`` into ``out``."""
    return [
        "train",
        MLM,
        *MLM_SETS,
        "--task",
        "mlm",
        "--data",
        data,
        "--steps",
        str(steps),
        "--batch-size",
        "8",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def text_folder(root: Path, files: int = 3, lines: int = 120) -> Path:
    """``files`` text files of ``lines`` lines of 12 words drawn from a fixed list of 16 (seeded): a text folder
    a tokenizer trains on in a fraction of a second."""
    import random

    words = "the quick brown fox jumps over lazy dog self return value key items def class import".split()
    draw = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        text = "\n".join(" ".join(draw.choice(words) for _ in range(12)) for _ in range(lines))
        (root / f"{i}.txt").write_text(text + "\n")
    return root


def ablate_args(out: Path | str, *extra: str, values: str = "ista,ista_soft") -> list[str]:
    return [
        "ablate",
        DIGITS,
        *SETS,
        "--swap",
        f"encoder.layer.sparsify.primitive={values}",
        "--data",
        "digits",
        "--batch-size",
        "16",
        "--log-every",
        "1",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def cli_quiet(argv: list[str]) -> tuple[int, str, str]:
    """``cli.main(argv)`` with its output captured (for setups and checks, not for the case itself)."""
    import contextlib
    import io

    from crate_compose import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
    return code, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------- images for folder: data


def image_folder(
    root: Path, classes: int = 2, per_class: int = 6, size: int = 12, mode: str = "RGB", split: bool = False
) -> Path:
    """Class folders of small random PNGs (``root/<class>/<i>.png``; with ``split``, ``root/train`` and
    ``root/test``)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    parts = [("train", per_class), ("test", max(2, per_class // 2))] if split else [(None, per_class)]
    for part, count in parts:
        for c in range(classes):
            folder = root / part / f"c{c}" if part else root / f"c{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                shape = (size, size, 3) if mode == "RGB" else (size, size)
                Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(folder / f"{i}.png")
    return root


# ---------------------------------------------------------------- snapshots


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (a lock file excepted: every writer rewrites its holder): the
    sha256 of a file, ``<dir>`` for a folder, the kind of anything else."""
    seen: dict[str, str] = {}
    if not folder.exists():
        return seen
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if name == ".lock":
                continue
            relative = str(path.relative_to(folder))
            try:
                mode = path.lstat().st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                seen[relative] = "<dir>"
            elif stat.S_ISREG(mode):
                digest = hashlib.sha256()
                with open(path, "rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
                seen[relative] = digest.hexdigest()
            elif stat.S_ISLNK(mode):
                seen[relative] = f"<link {os.readlink(path)}>"
            else:
                seen[relative] = f"<mode {stat.S_IFMT(mode):o}>"
    return seen


def _matches(path: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, g) or fnmatch.fnmatchcase(path, g.rstrip("/*")) for g in globs)


def losses(before: dict[str, str], after: dict[str, str], may_change: Sequence[str], keep: Sequence[str]) -> list[str]:
    """What changed that the case did not allow: ``changed``, ``deleted`` or ``written`` paths."""
    problems = []
    changed = sorted(p for p in before if p in after and after[p] != before[p])
    deleted = sorted(p for p in before if p not in after)
    written = sorted(p for p in after if p not in before)
    for kind, paths in (("changed", changed), ("deleted", deleted), ("wrote", written)):
        bad = [p for p in paths if not _matches(p, may_change) or (kind != "wrote" and _matches(p, keep))]
        if bad:
            problems.append(f"{kind} {', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}")
    return problems


def temporaries(folder: Path) -> list[str]:
    """Temporary siblings a writer left behind (``.NAME.*.partial``, ``.NAME.*.old``)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            if name.startswith(".") and name != ".lock" and (name.endswith(".partial") or name.endswith(".old")):
                found.append(str((Path(dirpath) / name).relative_to(folder)))
    return found


# ---------------------------------------------------------------- runners


def run_inprocess(argv: list, hang_s: float) -> Result:
    """``cli.main(argv)`` in this process under the hang and address-space guard (tests/guards.py).
    Output is captured by the caller (capfd)."""
    import guards  # tests/guards.py

    from crate_compose import cli

    start = time.monotonic()
    crash = ""
    try:
        with guards.guarded(hang_s, MEMORY_MARGIN):
            status: int | str = cli.main(argv)
    except SystemExit as exit:  # argparse
        code = exit.code
        status = 0 if code is None else code if isinstance(code, int) else 1
    except guards.Hang:
        status = "timeout"
    except Exception:  # what a process would print as a traceback
        status, crash = 1, traceback.format_exc()
    return Result(status, wall=time.monotonic() - start, crash=crash)


def run_subprocess(
    ctx: Ctx, argv: list, timeout: float, *, pipe: bool = False, memory: int = SUBPROCESS_MEMORY, name: str = "command"
) -> Result:
    """``argv`` as its own process, through tests/runtime/measure.py (limits, peak RSS). An argv that
    does not start with an absolute path is a crate-compose command line (``python -m crate_compose.cli``)."""
    argv = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in argv]
    if not os.path.isabs(argv[0]):
        argv = [PYTHON, "-m", "crate_compose.cli", *argv]
    out, err = ctx.tmp.parent / f"{ctx.tmp.name}.{name}.out", ctx.tmp.parent / f"{ctx.tmp.name}.{name}.err"
    wrapper = [
        PYTHON,
        str(HERE / "measure.py"),
        "--timeout",
        str(timeout),
        "--memory",
        str(memory),
        "--stdout",
        str(out),
        "--stderr",
        str(err),
        "--cwd",
        str(ctx.tmp),
        *(["--pipe"] if pipe else []),
        "--",
        *argv,
    ]
    done = subprocess.run(wrapper, env=ENV, capture_output=True, timeout=timeout + 60)
    if done.returncode != 0:
        raise AssertionError(f"the wrapper failed: {done.stderr.decode(errors='replace')[-2000:]}")
    measured = json.loads(done.stdout.decode().strip().splitlines()[-1])
    status = "timeout" if measured["timed_out"] else measured["status"]
    return Result(
        status,
        out.read_text(errors="replace"),
        err.read_text(errors="replace"),
        measured["wall_s"],
        measured["peak_mb"],
        extra={"cpu_s": measured["cpu_s"]},
    )


def run_torchrun(ctx: Ctx, argv: list[str], timeout: float = 60.0, processes: int = 2) -> Result:
    """``torchrun --standalone --nproc_per_node=N -m crate_compose.cli ARGV`` with every worker's stdout and
    stderr in its own file (``--redirects 3``). ``extra`` holds per rank its output and exit code (from
    the launcher's summary; 0 when the launcher reports no failure)."""
    logs = ctx.tmp.parent / f"{ctx.tmp.name}.torchrun-logs"
    command = [
        TORCHRUN,
        "--standalone",
        f"--nproc_per_node={processes}",
        "--log-dir",
        str(logs),
        "--redirects",
        "3",
        "-m",
        "crate_compose.cli",
        *argv,
    ]
    result = run_subprocess(ctx, command, timeout, name="torchrun")
    ranks: dict[int, dict] = {}
    for rank in range(processes):
        files = {
            kind: next(iter(sorted(logs.glob(f"*/attempt_*/{rank}/{kind}.log"))), None) for kind in ("stdout", "stderr")
        }
        ranks[rank] = {kind: (path.read_text(errors="replace") if path else "") for kind, path in files.items()}
        ranks[rank]["exit"] = 0
    for block in re.split(r"\n\[\d+\]:\n", result.err):
        rank = re.search(r"rank\s*:\s*(\d+)", block)
        code = re.search(r"exitcode\s*:\s*(-?\d+)", block)
        if rank and code and int(rank.group(1)) in ranks:
            ranks[int(rank.group(1))]["exit"] = int(code.group(1))
    result.extra["ranks"] = ranks
    result.extra["launcher"] = result.err
    # the case is judged on what crate-compose printed (the workers), not on torchrun's own report
    result.out = "".join(ranks[r]["stdout"] for r in ranks)
    result.err = "".join(ranks[r]["stderr"] for r in ranks)
    return result


# ---------------------------------------------------------------- the judge


def fill(pattern: str, ctx: Ctx) -> str:
    places = {"<RUN>": ctx.run, "<TMP>": ctx.tmp, "<CK2>": ctx.ck(2), "<CK4>": ctx.ck(4)}
    for token, path in places.items():
        pattern = pattern.replace(token, re.escape(str(path)))
    return pattern.replace("<PID>", str(ctx.notes.get("holder", "<no holder>")))


def judge(case: Case, ctx: Ctx, result: Result, before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Every shortfall of ``result`` against ``case``."""
    wrong = []
    status = result.status
    if status == "timeout":
        wrong.append(f"no answer within the hang limit ({result.wall:.1f} s)")
    elif status not in case.expect:
        wrong.append(f"exit {status}, expected {'/'.join(map(str, case.expect))}")
    if TRACEBACK in result.output or result.crash:
        last = (result.crash or result.output).strip().splitlines()
        wrong.append(f"a traceback: {last[-1][:300] if last else ''}")
    text = result.err if status not in (0, "timeout") else result.out + result.err
    if case.message and not re.search(fill(case.message, ctx), text, re.S):
        wrong.append(f"message does not match /{case.message}/")
    if status not in (0, "timeout"):
        lines = result.output.count("\n")
        if lines > SCREEN:
            wrong.append(f"{lines} lines of output (more than {SCREEN})")
        if not re.search(r"(^|: )error: ", result.err, re.M):
            wrong.append("no 'error: ' line on stderr")
    if result.wall > case.seconds:
        wrong.append(f"took {result.wall:.1f} s (limit {case.seconds:g} s)")
    if case.memory_mb is not None and result.peak_mb is not None and result.peak_mb > case.memory_mb:
        wrong.append(f"peak RSS {result.peak_mb:.0f} MB (limit {case.memory_mb:g} MB)")
    wrong += [f"lost or wrote something: {problem}" for problem in losses(before, after, case.may_change, case.keep)]
    left = temporaries(ctx.tmp)
    if left:
        wrong.append(f"temporary files left: {left[:4]}")
    if case.check is not None:
        wrong += case.check(ctx, result)
    return wrong


def first_lines(text: str, count: int = 3) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(line[:300] for line in lines[:count]) or "(no output)"
