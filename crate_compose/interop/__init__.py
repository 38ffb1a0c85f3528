"""Other code's checkpoints: reading the papers' authors' released weights into built networks
(``crate-compose import``) and writing built networks back in their layout (``crate-compose export``).

:mod:`.reading` reads a file safely (safetensors, or ``torch.load(weights_only=True)``) and unwraps it;
:mod:`.families` says where each family of the authors' code keeps each step's tensors;
:mod:`.mapping` pairs a built network's tensors with those names; :mod:`.exchange` imports and exports.
"""
