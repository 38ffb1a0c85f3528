"""The spec language: a YAML spec read safely (:mod:`.yamlread`), resolved (:mod:`.loader`: extends,
``--set`` overrides, ``${size}`` references), validated into a :class:`~.spec.Spec`, dumped back,
and described as a JSON schema (:mod:`.schema`); presets by name (:mod:`.zoo`). No torch."""
