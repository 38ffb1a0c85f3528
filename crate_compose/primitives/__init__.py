"""Built-in primitives, one module per family, each registering its steps where they are declared; the
registry imports the modules it lists (:data:`crate_compose.registry.BUILTIN`) when it is first read.

One module per family of steps: ``embed`` (pre-processing), ``compress`` (gradient steps on the
coding rate), ``sparsify`` (proximal steps on a LASSO), ``diffuse`` (their inverses, for derived
decoders), ``mask`` (masked autoencoding), ``norm``, ``head``, ``language`` (token embedding and
language-model head), and ``standard`` (ViT and GPT-2 parts, for baselines).
"""
