"""Ablation studies: a grid of swaps (:mod:`.grids`) trained for several seeds and compared (:mod:`.study`)."""
