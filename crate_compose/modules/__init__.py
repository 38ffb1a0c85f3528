"""The ``nn.Module`` of every built-in primitive, one module per family as in
:mod:`crate_compose.primitives`, which declares them (arguments, footprints, equations) without
importing torch; a primitive's factory imports its module here when it builds.
"""
