"""A run's folder and what keeps it whole: its identity (``run.json``, :mod:`.identity`), the lock one writer
holds (:mod:`.locks`), the checkpoints (:mod:`.checkpoint`), the event log (:mod:`.eventlog`), the checks when a
run opens its folder (:mod:`.opening`) and those made before torch loads (:mod:`.preflight`).
"""
