"""Pictures of a built network: the architecture diagram (:mod:`.diagrams`, graphviz)."""
