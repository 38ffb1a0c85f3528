"""Launchers: where the runs of a grid (or one run) are started, never what they are.

A run sent to a launcher is exactly the run ``crate-compose train`` makes (its ``run.json`` identity, lock,
checkpoints and metrics): the launcher writes what defines it into the run folder (``RUN/launch/job.json``,
:mod:`.jobs`), starts a process that trains it there (:func:`crate_compose.training.run.train_described`), and
reads its state back from the folder (:mod:`.status`). Three launchers:

* in-process (the default): the runs one after another in the calling process, as ``ablate`` always did;
* ``local`` (:mod:`.local`): parallel processes on this machine, one per GPU (or per ``--gpus-per-run``
  GPUs), or ``--jobs N`` on the CPU with the cores split between them;
* ``slurm`` (:mod:`.slurm`): a SLURM job per run through submitit, requeued on a time limit or a
  preemption and continued from its last checkpoint.

The launcher is no part of a run's identity: a grid started in-process can be finished on SLURM.
"""
