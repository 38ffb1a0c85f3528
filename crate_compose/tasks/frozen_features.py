"""The papers' evaluation of frozen features: a linear probe and k-nearest neighbours.

Paper 001 (App. B) evaluates a pre-trained encoder without training it further: its features are
taken frozen (the class token after the final norm, or the mean of the tokens), a logistic
regression is fitted on the training split for each inverse regularization ``C`` in
``10^0 .. 10^5``, the ``C`` with the best accuracy on a validation split (a stratified fifth of the
training split, seeded) is refitted on the whole training split, and its accuracy on the test
split is reported. Features are standardized with the training split's mean and deviation first
(scikit-learn's ``StandardScaler``), which the logistic regression needs to converge.

Beside it, the k-NN classifier DINO uses: cosine similarity to every training feature, the ``k =
20`` nearest vote with weights ``exp(s / T)``, ``T = 0.07``, and the class of the largest vote wins.

:func:`features` reads the tokens any encoder layer outputs (``layer``, counted from 0; the last
encoder step by default, its final norm when it has one) through a forward hook, so it works on any
built spec without changing its graph.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from torch import fx

from ..building.builder import spec_of
from ..errors import WorkbenchError
from ..modules.mask import unmasked

POOLS = ("cls", "mean")
C_GRID = tuple(10.0**k for k in range(6))  # 10^0 .. 10^5, as paper 001 App. B
VALIDATION = 0.2  # share of the training split held out to choose C
KNN_K, KNN_T = 20, 0.07  # DINO's k-NN: 20 neighbours, temperature 0.07
BATCH = 256


def feature_site(model: fx.GraphModule, layer: int | None = None) -> str:
    """The module whose output tokens are the features: the last encoder step (of encoder layer
    ``layer`` when given)."""
    encoder = [n for n in model.graph.nodes if n.op == "call_module" and n.meta.get("role") == "encoder"]
    if layer is not None:
        layers = sorted({n.meta.get("layer") for n in encoder if n.meta.get("layer") is not None})
        encoder = [n for n in encoder if n.meta.get("layer") == layer]
        if not encoder:
            raise WorkbenchError(
                f"--layer {layer}: the encoder has layers {layers[0]}..{layers[-1]}"
                if layers
                else f"--layer {layer}: the encoder has no layers"
            )
    if not encoder:
        raise WorkbenchError(f"spec '{spec_of(model).name}' has no encoder to take features from")
    return encoder[-1].target


def has_class_token(model: fx.GraphModule) -> bool:
    """A class token at place 0: a ``class_token`` step, or BERT's input (a ``token_embed`` with segments reads
    windows framed ``[CLS] ... [SEP]``, as the masked-LM and labelled text sets give them)."""
    return any(
        step.primitive == "class_token" or (step.primitive == "token_embed" and step.args.get("segments"))
        for _, _, _, step in spec_of(model).stages()
    )


def features(
    model: fx.GraphModule, inputs: torch.Tensor, *, layer: int | None = None, pool: str = "cls", batch: int = BATCH
) -> torch.Tensor:
    """``(N, d)`` frozen features of ``inputs``: the class token (``pool="cls"``) or the mean of the
    tokens (``"mean"``) that the encoder step :func:`feature_site` outputs, in float64. A masked
    autoencoder's mask hides nothing meanwhile: the encoder sees every patch, as in 001's probes."""
    if pool not in POOLS:
        raise WorkbenchError(f"--pool {pool}: expected one of {', '.join(POOLS)}")
    if pool == "cls" and not has_class_token(model):
        raise WorkbenchError(f"spec '{spec_of(model).name}' has no class token: use --pool mean")
    seen: list[torch.Tensor] = []

    def keep(module, args, output):
        tokens = output[0] if isinstance(output, tuple) else output
        seen.append((tokens[:, 0] if pool == "cls" else tokens.mean(1)).detach().double().cpu())

    handle = model.get_submodule(feature_site(model, layer)).register_forward_hook(keep)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with torch.no_grad(), unmasked(model):
            for start in range(0, len(inputs), batch):
                model(inputs[start : start + batch].to(device))
    finally:
        handle.remove()
        model.train(was_training)
    return torch.cat(seen)


@dataclass
class ProbeResult:
    """What :func:`linear_probe` and :func:`knn` found."""

    test_accuracy: float
    c: float
    validation_accuracy: dict[str, float] = field(default_factory=dict)  # per C
    knn_accuracy: float | None = None
    train: int = 0
    test: int = 0
    dim: int = 0
    choice: str = ""  # how C was chosen, in words (a tie on the validation fifth is said)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _classifier(c: float, seed: int):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000, random_state=seed))


def linear_probe(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    *,
    grid: Sequence[float] = C_GRID,
    seed: int = 0,
) -> ProbeResult:
    """Logistic regression on frozen features, ``C`` chosen on a validation split (see the module
    docstring); ties go to the smaller ``C`` (the stronger regularization)."""
    from sklearn.model_selection import train_test_split

    fit_x, val_x, fit_y, val_y = train_test_split(
        train_x, train_y, test_size=VALIDATION, random_state=seed, stratify=train_y
    )
    scores = {}
    for c in grid:
        scores[c] = float(_classifier(c, seed).fit(fit_x, fit_y).score(val_x, val_y))
    best = max(grid, key=lambda c: (scores[c], -c))
    final = _classifier(best, seed).fit(train_x, train_y)
    return ProbeResult(
        float(final.score(test_x, test_y)),
        best,
        {f"{c:g}": s for c, s in scores.items()},
        train=len(train_x),
        test=len(test_x),
        dim=train_x.shape[1],
        choice=_choice(scores, best),
    )


def _choice(scores: dict[float, float], best: float) -> str:
    """How ``best`` was chosen: by its validation accuracy, or, where several C tie (features the network was
    trained on can be separable on its own training data: every C at 1.0), as the smallest of the tied."""
    tied = [c for c, score in scores.items() if score == scores[best]]
    if len(tied) == 1:
        return (
            f"C={best:g}: the best validation accuracy ({scores[best]:.4f}) on a stratified fifth of the training split"
        )
    return (
        f"C={best:g}: {len(tied)} of {len(scores)} values of C tie at validation accuracy {scores[best]:.4f} on a "
        "stratified fifth of the training split (the network's own training data: its features may separate it "
        "whatever C is), so the smallest of them, the strongest regularization, was taken; the validation "
        "does not tell them apart"
    )


def knn(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    *,
    k: int = KNN_K,
    temperature: float = KNN_T,
) -> float:
    """DINO's weighted k-NN accuracy: cosine similarities, the ``k`` nearest vote with ``exp(s/T)``."""
    train = torch.nn.functional.normalize(train_x.double(), dim=1)
    test = torch.nn.functional.normalize(test_x.double(), dim=1)
    classes = int(max(train_y.max(), test_y.max())) + 1
    k = min(k, len(train))
    correct = 0
    for start in range(0, len(test), BATCH):
        similarity, nearest = (test[start : start + BATCH] @ train.T).topk(k, dim=1)
        votes = torch.zeros(len(nearest), classes, dtype=torch.float64)
        votes.scatter_add_(1, train_y[nearest], (similarity / temperature).exp())
        correct += int((votes.argmax(1) == test_y[start : start + BATCH]).sum())
    return correct / len(test)
