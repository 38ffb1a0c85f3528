"""The package's version, on the ground floor: a run's and an ablation's identity record it, and the command
line's ``--version`` prints it, without importing the package's top (which imports every layer)."""

__version__ = "0.1.0"
