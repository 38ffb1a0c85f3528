"""The torch building blocks: the ``nn.Module`` of every built-in primitive, one module per family as
in :mod:`crate_compose.primitives`, which declares them (arguments, footprints, equations) without
importing torch; a primitive's factory imports its module here when it builds. Beside them, what
the steps share: :mod:`.residual` (``skip + branch`` and LayerScale), :mod:`.precision`,
:mod:`.causal` (the caches of token-by-token decoding) and :mod:`.measures` (the objectives the
steps claim to move, as probes read them).

Nothing here imports the spec, the registry or the primitives' declarations: a module takes plain
values, and the primitive's factory converts its validated arguments into them.
"""
