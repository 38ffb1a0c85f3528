"""From a spec to a ``torch.fx.GraphModule``: the plan (:mod:`.plan`), the march over it with two
evaluators (:mod:`.march`: the footprints, :mod:`.footprints`, torch-free; the modules,
:mod:`.placement`), the builder (:mod:`.builder`), derived decoders (:mod:`.derivation`), weight
ties, the memory budget, summaries, build folders (:mod:`.artifacts`) and the whole-spec answers
``validate``, ``derive`` and ``inspect`` (:mod:`.inspection`)."""
