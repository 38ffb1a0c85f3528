"""Trained networks assessed: the papers' evaluations and the white-box probes.

* :mod:`.scoring`: ``crate-compose evaluate`` and ``linear-probe`` of a build, a run or an authors' checkpoint;
* :mod:`.layer_probes`: each step's own objective measured layer by layer on one network;
* :mod:`.run_probes`: ``crate-compose probe`` of a run folder (final weights, every checkpoint), and where
  a run's weights, spec and data are found;
* :mod:`.timelines`: probes over training time and over seeds, as figures.
"""
