"""Who this process is among a run's processes: torchrun's variables, else SLURM's, else one process.

``torchrun`` sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (and the rendezvous, ``MASTER_ADDR`` and
``MASTER_PORT``). A task that ``srun`` started has SLURM's instead: ``SLURM_PROCID`` (the rank),
``SLURM_STEP_NUM_TASKS`` (the world: set in a job step that srun made, never in the batch script
itself, so ``crate-compose train`` run directly in an sbatch script of ``--ntasks=4`` is one process,
as it is), ``SLURM_LOCALID`` (the rank on its node) and ``SLURM_STEP_NODELIST`` (whose first host is the
rendezvous). :func:`rendezvous` writes the variables torch's ``env://`` rendezvous reads from SLURM's,
so ``srun crate-compose train ...`` trains with DistributedDataParallel as torchrun does; the port is
a function of the job and step ids, so every task of one step agrees on it without talking.

Torch-free: the command line asks :func:`rank` before torch loads.
"""

from __future__ import annotations

import os
import re

PORTS = (20000, 30000)  # the range SLURM rendezvous ports are taken from (above the ephemeral ports' usual start)


def _under_srun() -> bool:
    return "RANK" not in os.environ and int(os.environ.get("SLURM_STEP_NUM_TASKS", "1") or 1) > 1


def rank() -> int:
    """This process's rank (0 alone)."""
    if _under_srun():
        return int(os.environ.get("SLURM_PROCID", "0"))
    return int(os.environ.get("RANK", "0") or 0)


def world_size() -> int:
    """How many processes the run has (1 alone)."""
    if _under_srun():
        return int(os.environ["SLURM_STEP_NUM_TASKS"])
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def local_rank() -> int:
    """This process's rank on its machine: the CUDA device it takes (``cuda:LOCAL_RANK``)."""
    if _under_srun():
        return int(os.environ.get("SLURM_LOCALID", "0"))
    return int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")) or 0)


def rendezvous() -> None:
    """Under srun with several tasks: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` (the step's
    first host) and ``MASTER_PORT`` (from the job and step ids) for torch's ``env://``; nothing otherwise."""
    if not _under_srun():
        return
    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") or "localhost"
    job = int(os.environ.get("SLURM_JOB_ID", "0") or 0)
    step = int(os.environ.get("SLURM_STEP_ID", "0") or 0)
    os.environ.setdefault("MASTER_ADDR", first_host(nodes))
    os.environ.setdefault("MASTER_PORT", str(PORTS[0] + (job * 7 + step) % (PORTS[1] - PORTS[0])))
    os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"] = str(world_size()), str(local_rank())
    os.environ["RANK"] = os.environ.get("SLURM_PROCID", "0")  # last: from here on torchrun's variables answer


def first_host(nodes: str) -> str:
    """The first host of a SLURM node list (``gpu[03-05,7],cpu1`` -> ``gpu03``), as ``scontrol show hostnames``
    lists it first."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodes.strip())
    if not match:
        return "localhost"
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def slurm_job() -> dict:
    """The SLURM job this process belongs to: its id as squeue shows it (``123`` or an array's ``120_3``) and
    how often it was requeued (``SLURM_RESTART_COUNT``); nothing outside SLURM."""
    if "SLURM_JOB_ID" not in os.environ:
        return {}
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]
    return {"job": job, "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)}


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs: it exists (another user's counts) and is no zombie (ended,
    its parent not having waited for it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    try:
        return open(f"/proc/{pid}/stat").read().split(") ")[-1][:1] != "Z"
    except OSError:
        return True
