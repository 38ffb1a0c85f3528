"""What a run learns: each task (classification, masked autoencoding, language modelling) is one declaration
that owns its batch's loss, its test metrics and baselines, the metric that ranks an ablation's variants and the
inputs the probes read (:mod:`.task_registry`). ``crate-compose list tasks`` lists them; ``--task NAME`` picks one.

* :mod:`.task_registry`: the :class:`~.task_registry.Task` declaration and the registry (no torch);
* :mod:`.classification`, :mod:`.masked_autoencoding`, :mod:`.language_modelling`, :mod:`.self_distillation`
  (DINO), :mod:`.masked_language_modelling`, :mod:`.coding_rate_distillation` (SimDINO): the built-in tasks;
* :mod:`.held_out`: what they share on the test split;
* :mod:`.frozen_features`: a network's frozen features, the linear probe and k-nearest neighbours (DINO's
  evaluation, and ``linear-probe``'s).
"""

from .task_registry import (
    Session,
    Task,
    all_tasks,
    columns,
    get,
    logged,
    names,
    of,
    probe_inputs,
    settings_problems,
    task,
    task_options,
)

__all__ = [
    "Session",
    "Task",
    "all_tasks",
    "columns",
    "get",
    "logged",
    "names",
    "of",
    "probe_inputs",
    "settings_problems",
    "task",
    "task_options",
]
