"""Self-distillation held up by the coding rate (SimDINO; Wu, Zhang, Pai, Wang, Singh, Yang, Gao, Ma,
"Simplifying DINO via Coding Rate Regularization", ICML 2025; the authors' ``main_dino.py``, ``MCRLoss``).

DINO's student and averaged teacher, views and schedules (:mod:`.self_distillation`), without its
centering, sharpening, temperatures and prototypes: the head is a ``simdino_head`` (an MLP to ``p`` unit
features), and the loss pulls every student view towards the teacher's global views while it expands the
coding rate of the global views' features, which is what keeps them from collapsing:

    L = - coeff * comp - expa
    comp = sum over (t in the 2 globals, v != t) of mean_b cos(z_t^teacher(b), z_v^student(b)) / (2 V - 2)
    expa = gamma * mean over the 2 global views of R_eps(Z_v),   R_eps(Z) = 1/2 logdet(I_p + p / (m N eps) Z^T Z)
    gamma = (p + N m) / (p N m)

``V`` views (2 global and ``--local-crops``), ``m`` images per process, ``N`` processes; ``Z_v`` ``(m, p)``
is, by ``--rate-features``, ``(student + teacher) / 2`` of global view ``v`` (``average``: the authors'
``expa_type 1``, their default) or the student's alone (``student``: ``expa_type 0``). ``--eps`` is
``eps`` (the authors' code: 0.5 by default; their ImageNet runs: 0.05, as recipe ``simdino``), ``--coeff``
the weight of the alignment (1).

Numerics, which is where the authors' users met trouble (NaN at large batches and in fp16, a Cholesky
factor of a matrix that rounding left indefinite): the loss is computed in float64 whatever the autocast
(its matrices are ``p x p``: microseconds beside the network), and ``logdet`` is ``2 sum log diag`` of a
Cholesky factor; a matrix that is not positive-definite (features that are not finite) stops the run
with a message naming the step. Under torchrun the ``p x p`` covariances ``Z_v^T Z_v`` are summed over
the processes (``--reduce-cov``, on by default: the authors' ``reduce_cov 1``; off, each process rates its
own share, as their default), with a backward that sums the gradients too, so ``N`` processes of ``m``
images train as one process of ``N m``. With ``--accumulate`` the rate is each micro-batch's.

Logged at every step: ``view_cosine`` (``comp``: 1 when every view maps to one point) and ``coding_rate``
(``expa``: near 0 when the features have collapsed). Evaluation, weights and probes as DINO's: the
teacher's k-NN accuracy (``final-ema/``).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from ..errors import TrainError
from ..options import Option
from .self_distillation import LOCAL_CROPS_OPTION, Distillation, SelfDistillation
from .task_registry import ExampleRun, Session, task

if TYPE_CHECKING:
    import torch

RATE_FEATURES = ("average", "student")  # the authors' expa_type 1 and 0


@task
class CodingRateDistillation(SelfDistillation):
    name = "simdino"
    heads = ("simdino_head",)
    summary = "SimDINO: a student's views aligned with an averaged teacher's, their features' coding rate expanded"
    trains_on = "images (labels unused) and a spec whose head is simdino_head and whose positions interpolate"
    logged = ("view_cosine", "coding_rate")
    head_primitive = "simdino_head"
    head_spec = "specs/crate-simdino.yaml"
    recipe = "simdino"
    options = (  # the authors' --local_crops_number, --eps, --coeff, --expa_type, --reduce_cov
        LOCAL_CROPS_OPTION,
        Option(
            float,
            0.5,
            "eps of the coding rate R_eps(Z) = 1/2 logdet(I + p/(m N eps) Z^T Z) (default: 0.5, the "
            "authors' code's; their ImageNet runs and recipe simdino: 0.05)",
            low=0,
            low_open=True,
            name="eps",
        ),
        Option(
            float,
            1.0,
            "the weight of the views' alignment against the coding rate (default: 1, the authors')",
            low=0,
            name="coeff",
        ),
        Option(
            str,
            "average",
            "whose features the coding rate is of: average, (student + teacher) / 2 of each "
            "global view (the authors' expa_type 1, default), or student, the student's alone (expa_type 0)",
            choices=RATE_FEATURES,
            name="rate_features",
        ),
        Option(
            bool,
            True,
            "under torchrun, sum the features' covariance over the processes, so N processes of m "
            "images equal one of N m (default: on; the authors' reduce_cov 1)",
            name="reduce_cov",
        ),
    )
    example = ExampleRun(
        "crate-simdino-digits",
        "digits",
        ("sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1", "sizes.features=16"),
        settings=(("ema", 0.996),),
    )

    def session(self, model: Any, settings, data) -> Session:
        self.check_teacher(settings)
        return SimDinoSession(self, model, settings, data)


class SimDinoSession(Distillation):
    """A SimDINO run: :class:`~.self_distillation.Distillation` and the loss of the module docstring."""

    logged = CodingRateDistillation.logged

    def loss(self, net, model, x, y, step, ema=None):
        student, teacher = self.forwards(net, model, x, step, ema)

        def option(name: str) -> Any:
            return self.task.option(self.settings, name)

        loss, comp, expa = simdino_loss(
            student,
            teacher,
            self.crop.views,
            eps=option("eps"),
            coeff=option("coeff"),
            rate_features=option("rate_features"),
            reduce=option("reduce_cov"),
            step=step,
        )
        self.measured = {"view_cosine": float(comp), "coding_rate": float(expa)}
        return loss.float(), student  # float32 as every task's loss (its gradient flows back through the cast)


def simdino_loss(
    student: "torch.Tensor",
    teacher: "torch.Tensor",
    views: int,
    *,
    eps: float,
    coeff: float = 1.0,
    rate_features: str = "average",
    reduce: bool = True,
    step: int | None = None,
) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """SimDINO's loss (the module docstring), ``comp`` and ``expa`` (the latter two detached): ``student``
    ``(views * B, p)`` the student's unit features of every view, the two global views first; ``teacher``
    ``(2 * B, p)`` the teacher's of the global views. Computed in float64 (float32 where the device has none)."""
    import torch
    import torch.nn.functional as F

    if rate_features not in RATE_FEATURES:
        raise ValueError(f"rate_features {rate_features!r} is not one of {', '.join(RATE_FEATURES)}")
    dtype = torch.float32 if student.device.type == "mps" else torch.float64
    with torch.autocast(student.device.type, enabled=False):
        s = student.to(dtype).view(views, -1, student.shape[-1])
        t = teacher.to(dtype).view(2, -1, teacher.shape[-1])
        similarity = F.cosine_similarity(t.unsqueeze(1), s.unsqueeze(0), dim=-1).mean(-1)  # (2, views)
        different = ~torch.eye(2, views, dtype=torch.bool, device=s.device)  # a view is not paired with itself
        comp = similarity[different].sum() / (2 * views - min(2, views))
        rated = (s[:2] + t) / 2 if rate_features == "average" else s[:2]
        expa = coding_rate(rated, eps, reduce=reduce, step=step)
        return -coeff * comp - expa, comp.detach(), expa.detach()


def coding_rate(
    features: "torch.Tensor", eps: float, *, reduce: bool = True, step: int | None = None
) -> "torch.Tensor":
    """``gamma * mean_v R_eps(Z_v)`` of ``features`` ``(views, m, p)`` (the module docstring): each process's
    ``m`` rows, their covariance summed over the processes under torchrun when ``reduce``. A matrix that is not
    positive-definite (features that are not finite) is a :class:`~crate_compose.errors.TrainError`."""
    import torch
    import torch.distributed as dist

    count, p = features.shape[-2:]
    covariance = features.transpose(-1, -2) @ features  # (views, p, p)
    processes = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if processes > 1 and reduce:
        covariance = _summed_over_processes().apply(covariance)
    scale = p / (count * processes * eps)
    identity = torch.eye(p, dtype=features.dtype, device=features.device)
    factor, info = torch.linalg.cholesky_ex(identity + scale * covariance)
    if bool((info != 0).any()):
        view = int((info != 0).nonzero()[0, 0]) + 1
        where = f"at step {step}: " if step is not None else ""
        finite = "its features are not finite" if not torch.isfinite(features).all() else "rounding"
        raise TrainError(
            f"{where}the coding rate's matrix I + p/(m N eps) Z^T Z of global view {view} is not "
            f"positive-definite ({finite}): the run diverged; lower --lr, raise --eps (now {eps:g}) or "
            "--warmup, and start a new run with another --out"
        )
    rate = factor.diagonal(dim1=-2, dim2=-1).log().sum(-1)  # 1/2 logdet(I + scale Z^T Z), one per view
    gamma = (p + processes * count) / (p * processes * count)
    return rate.mean() * gamma


@cache
def _summed_over_processes() -> Any:
    """``all_reduce`` (sum) as an autograd function whose backward sums the gradients over the processes too:
    every process's loss is the same function of the sum, so the gradient of its own share is the sum of theirs,
    and DDP's mean of the weights' gradients is then the gradient of one process holding every share."""
    import torch
    import torch.distributed as dist

    class SumOverProcesses(torch.autograd.Function):
        @staticmethod
        def forward(ctx, tensor):
            total = tensor.clone()
            dist.all_reduce(total)
            return total

        @staticmethod
        def backward(ctx, grad):
            total = grad.clone()
            dist.all_reduce(total)
            return total

    return SumOverProcesses
