"""Text from a causal network: cached decoding (:mod:`.decoding`) and ``crate-compose generate`` (:mod:`.text`).

``crate_compose.generation`` was the module now at :mod:`.text`; its names still resolve here, deprecated, for one
release.
"""

from ..deprecation import moved_names

__getattr__ = moved_names(__name__, "text")
