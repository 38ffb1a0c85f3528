"""``crate-compose show``: what a network does at one layer, pictured.

* :mod:`.views`: attention, memberships, patch features and reconstructions gathered at one encoder layer;
* :mod:`.drawings`: those views drawn as PNG figures;
* :mod:`.show`: the command: weights and data found, views gathered and drawn, files written all or none.
"""
