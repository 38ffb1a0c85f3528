"""Built-in primitives; importing this package registers them (see :mod:`crate_compose.registry`).

One module per family of steps: ``embed`` (pre-processing), ``compress`` (gradient steps on the
coding rate), ``sparsify`` (proximal steps on a LASSO), ``diffuse`` (their inverses, for derived
decoders), ``mask`` (masked autoencoding), ``norm``, ``head``, ``language`` (token embedding and
language-model head), and ``standard`` (ViT and GPT-2 parts, for baselines).
"""

from . import (
    aot,
    coding_rate,
    compress,
    denoise,
    diffuse,
    embed,
    head,
    language,
    mask,
    norm,
    sparsify,
    standard,
    tost,
    tssa,
)
