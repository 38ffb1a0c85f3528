"""A launcher's settings: from the command line, or from a YAML file a lab writes once for its cluster.

::

    # cluster.yaml: crate-compose ablate ... --launcher-config cluster.yaml
    launcher: slurm
    partition: gpu
    nodes: 1
    gpus_per_run: 8
    cpus_per_task: 10        # per GPU: a task per GPU
    time: "2-00:00:00"       # minutes, H:MM:SS or D-HH:MM:SS
    mem: 480G
    slurm: {account: my-lab, qos: high, constraint: h100}   # anything else sbatch takes

The options given on the command line win over the file's. Every key is checked, and a problem is said at
its line. Torch-free, as the rest of the command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import Location, Problem, SpecError, did_you_mean
from ..spec_language.source import read_file
from .jobs import LaunchError

LAUNCHERS = ("in-process", "local", "slurm")
COUNTS = ("jobs", "gpus_per_run", "nodes", "cpus_per_task", "tasks_per_node", "signal_delay")
TEXTS = ("partition", "mem")
LOCAL_KEYS = ("jobs", "gpus_per_run")
SLURM_KEYS = (
    "gpus_per_run",
    "nodes",
    "cpus_per_task",
    "tasks_per_node",
    "partition",
    "time",
    "mem",
    "signal_delay",
    "slurm",
)
KEYS = ("launcher", *COUNTS, *TEXTS, "time", "slurm")


def read_launcher_file(path: str | Path) -> dict[str, Any]:
    """The settings of a launcher file, checked; :class:`~crate_compose.errors.SpecError` lists every problem
    at its line."""
    path = Path(path)
    source = read_file(path)
    if not isinstance(source.data, dict):
        raise SpecError(
            [Problem("a launcher file is a mapping (launcher: slurm, partition: gpu, ...)", (), Location(str(path)))]
        )
    problems = []
    for key, value in source.data.items():
        where = source.locate((key,)) or Location(str(path))
        message = _problem(str(key), value)
        if message:
            problems.append(Problem(message, (key,), where, did_you_mean(str(key), KEYS) if key not in KEYS else ""))
    if problems:
        raise SpecError(problems)
    return dict(source.data)


def _problem(key: str, value: Any) -> str | None:
    if key not in KEYS:
        return f"unknown key '{key}' (a launcher file takes: {', '.join(KEYS)})"
    if key == "launcher" and value not in LAUNCHERS:
        return f"launcher: {value!r} is not one of {', '.join(LAUNCHERS)}"
    if key in COUNTS and (
        not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "gpus_per_run" else 1)
    ):
        return f"{key}: a whole number of at least {0 if key == 'gpus_per_run' else 1}, not {value!r}"
    if key in TEXTS and not isinstance(value, str):
        return f"{key}: text, not {value!r}"
    if key == "time":
        from .slurm import minutes

        try:
            minutes(value)
        except (ValueError, TypeError) as error:
            return f"time: {error}"
    if key == "slurm" and not (
        isinstance(value, dict)
        and all(isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in value.items())
    ):
        return "slurm: a mapping of sbatch options to values ({account: my-lab, qos: high})"
    return None


def make_launcher(values: dict[str, Any], device: str = "cpu"):
    """The launcher ``values`` describe (None: in-process); a setting the launcher does not take is refused."""
    kind = values.get("launcher", "in-process")
    given = [key for key in values if key != "launcher" and values[key] is not None]
    takes = {"in-process": (), "local": LOCAL_KEYS, "slurm": SLURM_KEYS}[kind]
    stray = [key for key in given if key not in takes]
    if stray:
        flags = ", ".join("--" + key.replace("_", "-") for key in stray)
        which = [name for name, keys in (("local", LOCAL_KEYS), ("slurm", SLURM_KEYS)) if stray[0] in keys]
        raise LaunchError(
            f"{flags}: not a setting of the {kind} launcher" + (f"; give --launcher {which[0]}" if which else "")
        )
    if kind == "in-process":
        return None
    if kind == "local":
        from .local import Local

        return Local(jobs=values.get("jobs"), gpus_per_run=values.get("gpus_per_run") or 1, device=device)
    from .slurm import Slurm, minutes

    if device != "cpu" and not values.get("gpus_per_run"):
        raise LaunchError(f"--device {device} on SLURM: give --gpus-per-run N (the GPUs each run asks SLURM for)")
    if device == "cpu" and values.get("gpus_per_run"):
        raise LaunchError(f"--gpus-per-run {values['gpus_per_run']} with --device cpu: give --device cuda")
    settings = {
        k: values[k]
        for k in ("partition", "nodes", "gpus_per_run", "cpus_per_task", "tasks_per_node", "mem", "signal_delay")
        if values.get(k) is not None
    }
    if values.get("time") is not None:
        settings["time"] = minutes(values["time"])
    return Slurm(**settings, extra=dict(values.get("slurm") or {}))
