"""The spec language: a YAML spec read safely (:mod:`.yamlread`, :mod:`.source`), resolved (:mod:`.loader`:
:mod:`.extends`, ``--set`` :mod:`.overrides`, variant :mod:`.naming`, ``${size}`` :mod:`.substitution`),
validated into a :class:`~.spec.Spec` (:mod:`.validation`), dumped back (:mod:`.dumping`), and
described as a JSON schema (:mod:`.schema`); presets by name (:mod:`.zoo`). No torch."""
