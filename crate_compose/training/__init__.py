"""A training run, from its first step to its last checkpoint.

* :mod:`.run`: :func:`~.run.train`, the loop for a laptop and for torchrun;
* :mod:`.run_folder.identity`: what defines a run (``run.json``), checked on resume;
* :mod:`.run_folder.checkpoint`: a build folder plus the optimizer, the schedule position and the RNG;
* :mod:`.optimizers`: AdamW and Lion, the schedule, the weight average, the precision of a step;
* :mod:`.recipes`: the papers' training settings in a file (``--config``);
* :mod:`.finetune`: a run that starts from another build's weights (``--init``, ``--freeze``);
* :mod:`.distributed`: many processes under torchrun;
* :mod:`.run_folder.locks`, :mod:`.run_folder.preflight`: one writer per folder; the refusals a command makes before torch loads;
* :mod:`.run_folder.eventlog`, :mod:`.progress`: TensorBoard scalars; a bar on a terminal, lines in a log.
"""
