"""Many processes under torchrun or srun: who this process is, its share of every batch, refusals shared.

Under ``torchrun --nproc_per_node=N``, or as one of the N tasks of ``srun`` (:mod:`.world`), each process
reads its rank and the world size from the environment (one process otherwise: rank 0 of 1). Each takes ``1/N`` of every global batch
(:meth:`Distributed.shard`), DistributedDataParallel averages the gradients, and rank 0 alone
writes files. A check that can refuse a run is made by rank 0 and its outcome broadcast
(:meth:`Distributed.agree`), so every process exits with the same status and only rank 0 prints.
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from ..errors import SpecError, TrainError, WorkbenchError
from . import world


class Distributed:
    """Rank and world size under torchrun or srun (one process otherwise); ``local``: the rank on this machine."""

    def __init__(self) -> None:
        self.world, self.rank, self.local = world.world_size(), world.rank(), world.local_rank()
        self.active = self.world > 1

    def start(self, device: torch.device) -> None:
        if self.active and not torch.distributed.is_initialized():
            world.rendezvous()  # srun's tasks: torch's env:// variables from SLURM's
            torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")

    def stop(self) -> None:
        """Destroy the process group while the interpreter is whole. DDP's reducer holds the group
        through reference cycles, so they are collected first: a group left to the interpreter's
        exit has gloo's worker threads release tensors after Python is gone, which aborts the process
        ('terminate called without an active exception')."""
        if self.active and torch.distributed.is_initialized():
            gc.collect()
            torch.distributed.destroy_process_group()
            gc.collect()

    def check_batch(self, batch_size: int) -> None:
        """Every process takes an equal share of every global batch (checked before anything starts)."""
        if batch_size % self.world:
            error = TrainError(
                f"--batch-size {batch_size} is not divisible by the {self.world} processes of "
                f"torchrun; give a multiple of {self.world}"
            )
            error.shared = True
            raise error

    def shard(self, indices: torch.Tensor) -> torch.Tensor:
        per = len(indices) // self.world
        return indices[self.rank * per : (self.rank + 1) * per]

    def mean(self, value: torch.Tensor) -> float:
        """``value`` averaged over every process (itself in one process)."""
        if self.active:
            value = value.clone()
            torch.distributed.all_reduce(value)
            value /= self.world
        return value.item()

    def agree(self, action):
        """Run ``action`` on rank 0 and give every process its result, or raise its error everywhere
        (the other ranks raise a :class:`SharedError` with the same message and exit status)."""
        outcome: list[Any] = [None]
        error: BaseException | None = None
        if self.rank == 0:
            try:
                outcome = [("ok", action())]
            except (WorkbenchError, SpecError, OSError) as caught:
                error = caught
                outcome = [("error", f"{caught}", exit_status(caught))]
        if self.active:
            torch.distributed.broadcast_object_list(outcome, src=0)
        if error is not None:
            raise error
        if outcome[0][0] == "error":
            raise SharedError(outcome[0][1], outcome[0][2])
        return outcome[0][1]


class SharedError(WorkbenchError):
    """Rank 0's refusal as another process of the same torchrun sees it (printed by rank 0 only)."""

    shared = True

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


def exit_status(error: BaseException) -> int:
    if isinstance(error, OSError):
        return 1
    return getattr(error, "exit_status", 2)
