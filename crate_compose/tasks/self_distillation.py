"""Self-distillation with no labels (DINO; Caron et al. 2021, Alg. 1; the journal paper's CRATE-DINO setting).

A student and a teacher share one spec, whose head is a ``dino_head`` (K prototypes). The teacher is the
student's weights averaged: the run's ``--ema`` is its starting momentum ``m_0`` (DINO: 0.996), which rises
to 1 on a cosine over the run, ``m_s = 1 - (1 - m_0)(cos(pi s / S) + 1) / 2``; it never gets a gradient.
Every image gives two global views and ``N`` local ones (:mod:`.multicrop`); the teacher sees the global
views, the student all of them, and the loss is the cross-entropy between the teacher's sharpened,
centred distribution and the student's over every pair of different views:

    P_t(v) = softmax((g_t(x_v) - c) / tau_t),  P_s(v) = softmax(g_s(x_v) / tau_s)
    L = mean over pairs (t in globals, v != t) of  - sum_k P_t(t)_k log P_s(v)_k
    c <- 0.9 c + 0.1 mean over the batch's global views of g_t(x)           (after the loss)

with DINO's defaults ``tau_t = 0.04``, ``tau_s = 0.1`` and a centre momentum of 0.9 (``--teacher-temp``;
with ``--warmup-teacher-temp T0 --warmup-teacher-temp-epochs E``, ``tau_t`` rises linearly from ``T0`` over the
first ``E`` epochs, as DINO's schedule per epoch; ``--local-crops N``, DINO's 8 by default). As DINO trains: the
weight decay follows a cosine from the run's ``--weight-decay`` (the recipe: 0.04) to 0.4, and the head's
last layer gets no update in the first epoch. Two failure modes are watched and logged at every step
(DINO Sec. 5.3): the teacher's entropy ``H(P_t)`` (collapse to one prototype: 0) and its KL divergence to
the uniform distribution (collapse to uniform: 0), in nats.

Evaluation: the k-NN accuracy (DINO's weighted 20-NN) of the class token's features on the test split,
against those of the training split, for the student and (``ema_``) the teacher; ``linear-probe`` and
``evaluate`` of a DINO run read the teacher (``final-ema/``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from ..data.set_registry import IMAGES, LABELED_IMAGES
from ..errors import TrainError
from ..options import Option
from .task_registry import ExampleRun, Session, Task, task

if TYPE_CHECKING:
    import torch

STUDENT_TEMP = 0.1
CENTER_MOMENTUM = 0.9
WEIGHT_DECAY_END = 0.4  # DINO's --weight_decay_end
FREEZE_LAST_LAYER_EPOCHS = 1  # DINO's --freeze_last_layer
LOCAL_CROPS = 8  # DINO's --local_crops_number
MIN_TEMP = 1e-3  # the coldest teacher: its logits are within +-g (a weight-normalized layer of unit vectors; g = 1
# unless norm_last_layer is off), so dividing by 1e-3 stays finite in float32 with room to spare; DINO: 0.04-0.07
KNN_TRAIN = 10_000  # training examples whose features the k-NN votes with (evenly spaced, always the same)
LOCAL_CROPS_OPTION = Option(
    int, LOCAL_CROPS, f"local crops per image (default: {LOCAL_CROPS}, DINO's)", low=0, high=64, name="local_crops"
)  # DINO's and SimDINO's


@task
class SelfDistillation(Task):
    name = "dino"
    heads = ("dino_head",)
    summary = "self-distillation with no labels (DINO): a student matches an averaged teacher across crops"
    trains_on = "images (labels unused) and a spec whose head is dino_head and whose positions interpolate"
    data_kinds = (LABELED_IMAGES, IMAGES)
    columns = ("test_knn_accuracy",)
    metric = "test_knn_accuracy"
    maximize = True
    logged = ("teacher_entropy", "teacher_kl_uniform")
    weights = "final-ema"  # the teacher, as DINO's evaluations read it
    head_primitive: ClassVar[str] = "dino_head"  # the head the spec must have
    head_spec: ClassVar[str] = "specs/crate-dino.yaml"  # a spec with it, named in the refusal
    recipe: ClassVar[str] = "crate-dino"  # the recipe that sets what the task needs (--ema), named in the refusal
    options = (  # DINO's --local_crops_number, --teacher_temp, --warmup_teacher_temp, --warmup_teacher_temp_epochs
        LOCAL_CROPS_OPTION,
        Option(
            float,
            0.04,
            "the teacher's temperature, at least 0.001: colder, (logits - center) / T overflows "
            "and the loss is not finite (default: 0.04, DINO's)",
            low=MIN_TEMP,
            name="teacher_temp",
        ),
        Option(
            float,
            0.04,
            "the teacher's temperature at step 0, rising linearly to --teacher-temp, at least 0.001 (default: 0.04)",
            low=MIN_TEMP,
            name="warmup_teacher_temp",
        ),
        Option(int, 0, "over this many epochs (default: 0)", low=0, name="warmup_teacher_temp_epochs"),
    )
    example = ExampleRun(
        "crate-dino-digits",
        "digits",
        ("sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1", "sizes.prototypes=32"),
        settings=(("ema", 0.996),),
    )

    def check(self, spec: Any, data) -> None:
        super().check(spec, data)
        if not any(step.primitive == self.head_primitive for step in spec.head):
            raise TrainError(
                f"spec '{spec.name}' has no {self.head_primitive}: task {self.name} trains a network "
                f"whose head is a {self.head_primitive} (see {self.head_spec})"
            )
        if not any(step.primitive == "positions" and step.args.get("interpolate") for step in spec.preprocess):
            raise TrainError(
                f"spec '{spec.name}' cannot take DINO's local crops: its positions step needs "
                "interpolate: true (--set preprocess[positions].args.interpolate=true)"
            )
        if len(data.input_shape) != 3 or data.input_shape[1] != data.input_shape[2]:
            raise TrainError(
                f"task {self.name} crops square images; data set '{data.name}' holds {list(data.input_shape)}"
            )

    def session(self, model: Any, settings, data) -> Session:
        self.check_teacher(settings)
        return DinoSession(self, model, settings, data)

    def check_teacher(self, settings) -> None:
        """Refuse a run without the teacher's momentum (``--ema``): the teacher is the weights' average."""
        if not settings.ema:
            raise TrainError(
                f"task {self.name} needs the teacher's momentum: --ema 0.996 (DINO's; it rises to 1 over "
                f"the run), or --config {self.recipe}"
            )

    def loss(self, outputs, x, y, *, model, smoothing=0.0):
        raise TrainError(f"task {self.name}'s loss needs a teacher: it is computed by its session over a run")

    def evaluate(self, model, data, settings, *, top_k=None):
        """The k-NN accuracy of the class-token features on the test split (none for unlabeled data)."""
        if not data.classes:
            return {}
        import torch
        from tqdm import tqdm

        from .frozen_features import features, knn
        from .held_out import evaluating, test_batches

        count = min(len(data.train), KNN_TRAIN) + len(data.test)
        with (
            evaluating(model, settings.seed) as device,
            tqdm(
                total=count,
                desc=f"k-NN: the features of {count:,} images",
                unit="image",
                leave=False,
                disable=None if count > 2048 else True,
            ) as bar,
        ):  # minutes on a CPU, after the last step

            def of(x, y):
                bar.update(len(x))
                return features(model, x), y

            train = [of(x, y) for x, y in _batches(data.train, data, settings, device, KNN_TRAIN)]
            test = [of(x, y) for x, y in test_batches(data, settings, device)]
        cat = torch.cat
        return {
            "test_knn_accuracy": knn(
                cat([f for f, _ in train]),
                cat([y for _, y in train]).cpu(),
                cat([f for f, _ in test]),
                cat([y for _, y in test]).cpu(),
            )
        }


def _batches(split, data, settings, device, count: int):
    """At most ``count`` examples of ``split``, evenly spaced over it (a split stored class by class gives
    every class its share), standardized as the training inputs, 256 at a time."""
    import torch

    from ..data.batches import batch_of, renormalize
    from .held_out import spread

    for chunk in torch.tensor(spread(len(split), count)).split(256):
        x, y = batch_of(split, chunk)
        yield renormalize(x, data, settings.normalize).to(device), y.to(device)


def dino_loss(
    student: "torch.Tensor",
    teacher: "torch.Tensor",
    center: "torch.Tensor",
    views: int,
    teacher_temp: float,
    student_temp: float = STUDENT_TEMP,
) -> "torch.Tensor":
    """DINO's loss (see the module docstring): ``student`` ``(views * B, K)`` the student's outputs for every
    view, the two global views first; ``teacher`` ``(2 * B, K)`` the teacher's for the global views."""
    import torch.nn.functional as F

    log_student = F.log_softmax(student.float() / student_temp, dim=-1).chunk(views)
    targets = F.softmax((teacher.float() - center) / teacher_temp, dim=-1).detach().chunk(2)
    terms = [
        -(target * log_student[v]).sum(-1).mean() for t, target in enumerate(targets) for v in range(views) if v != t
    ]
    return sum(terms) / len(terms)


def teacher_momentum(step: int, steps: int, base: float) -> float:
    """DINO's cosine schedule of the teacher's momentum: ``base`` at step 0, 1 at the last step."""
    return 1 - (1 - base) * (math.cos(math.pi * step / steps) + 1) / 2


def teacher_temperature(step: int, per_epoch: int, settings) -> float:
    """The teacher's temperature at ``step`` (from 0): DINO's schedule, one value per epoch, rising linearly from
    ``warmup_teacher_temp`` (epoch 0) to ``teacher_temp`` (epoch ``warmup_teacher_temp_epochs``), then constant."""

    def option(name: str) -> Any:
        return SelfDistillation.option(settings, name)

    epochs, epoch = option("warmup_teacher_temp_epochs"), step // max(1, per_epoch)
    final, start = option("teacher_temp"), option("warmup_teacher_temp")
    if epoch >= epochs:
        return final
    if epochs == 1:
        return start
    return start + (final - start) * epoch / (epochs - 1)


def cosine(step: int, steps: int, start: float, end: float) -> float:
    """A value from ``start`` (step 0) to ``end`` (step ``steps``) on a half cosine (DINO's cosine_scheduler)."""
    return end + (start - end) * (1 + math.cos(math.pi * step / steps)) / 2


class Distillation(Session):
    """What DINO and SimDINO keep over a run: the views of every image, the teacher's forward (the weights'
    average swapped in), DINO's schedules of the weight decay and the teacher's momentum, and a last layer
    (DINO's head's; SimDINO's has none) held still for the first epoch."""

    def __init__(self, task: Task, model: Any, settings, data) -> None:
        from ..data.batches import normalization
        from .masked_autoencoding import patch_size_of
        from .multicrop import MultiCrop, local_size

        super().__init__(task, model, settings, data)
        mean, std = normalization(data, settings.normalize)  # how the batches are standardized: undone for the views
        self.mean, self.std = (s.view(1, -1, 1, 1).to(next(model.parameters()).device) for s in (mean, std))
        self.head = next(step for step in _spec(model).head if step.primitive == task.head_primitive)
        size = int(_spec(model).input.shape[-1])
        self.crop = MultiCrop(size, local_size(size, patch_size_of(model)), self.task.option(settings, "local_crops"))
        self.last_layer = [
            name for name, _ in model.named_parameters() if name.startswith(f"head.{self.head.name}.last_layer")
        ]
        self.measured: dict[str, float] = {}

    def forwards(self, net, model, x, step, ema) -> tuple["torch.Tensor", "torch.Tensor"]:
        """The student's outputs for every view of the batch ``x`` ``(views * B, out)``, the two global views
        first, and the teacher's for the global views ``(2 * B, out)``, in float32."""
        import torch

        from .multicrop import views

        mean, std = self.mean.to(x.dtype), self.std.to(x.dtype)
        with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
            torch.manual_seed(self.seed("views", step, x))
            crops = [(view - mean) / std for view in views((x * std + mean).clamp(0, 1), self.crop)]
        with torch.no_grad(), ema.swapped_in(model):  # first: swapping weights after the student's forward
            teacher = model(torch.cat(crops[:2]))["output"].float()  # would change what its backward needs
        student = torch.cat([net(torch.cat(crops[:2]))["output"], *[net(c)["output"] for c in _locals(crops)]])
        return student, teacher

    def before_update(self, model, optimizer, step: int) -> None:
        decay = cosine(step - 1, self.settings.steps, self.settings.weight_decay, WEIGHT_DECAY_END)
        for group in optimizer.param_groups:
            if group.get("weight_decay", 0.0) > 0.0:  # the groups that decay (not the norms and biases)
                group["weight_decay"] = decay
        if step <= FREEZE_LAST_LAYER_EPOCHS * self.per_epoch:
            for name, parameter in model.named_parameters():
                if name in self.last_layer:
                    parameter.grad = None

    def after_update(self, model, optimizer, step: int) -> None:
        """The decaying groups back at the run's --weight-decay: the schedule is a function of the step, and a
        checkpoint's optimizer holds the run's settings (checked on resume)."""
        for group in optimizer.param_groups:
            if group.get("weight_decay", 0.0) > 0.0:
                group["weight_decay"] = self.settings.weight_decay

    def ema_decay(self, step: int) -> float:
        return teacher_momentum(step - 1, self.settings.steps, self.settings.ema)

    def logs(self) -> dict[str, float]:
        return dict(self.measured)


class DinoSession(Distillation):
    """A DINO run: :class:`Distillation`, and the center of the teacher's outputs."""

    logged = SelfDistillation.logged

    def __init__(self, task: Task, model: Any, settings, data) -> None:
        import torch

        super().__init__(task, model, settings, data)
        device = next(model.parameters()).device
        self.state = {"center": torch.zeros(1, int(self.head.args["out_dim"]), device=device)}

    def loss(self, net, model, x, y, step, ema=None):
        student, teacher = self.forwards(net, model, x, step, ema)
        temperature = teacher_temperature(step - 1, self.per_epoch, self.settings)
        loss = dino_loss(student, teacher, self.state["center"], self.crop.views, temperature)
        self._update_center(teacher, temperature)
        return loss, student

    def _update_center(self, teacher: "torch.Tensor", temperature: float) -> None:
        import torch.distributed as dist

        batch = teacher.sum(0, keepdim=True)
        count = teacher.new_tensor(float(len(teacher)))
        if dist.is_available() and dist.is_initialized():  # every process's share of the batch
            dist.all_reduce(batch), dist.all_reduce(count)
        self.measured = _collapse(teacher, self.state["center"], temperature)
        self.state["center"].mul_(CENTER_MOMENTUM).add_(batch / count, alpha=1 - CENTER_MOMENTUM)


def _collapse(teacher: "torch.Tensor", center: "torch.Tensor", temperature: float) -> dict[str, float]:
    """The teacher's entropy H(P_t) and KL(P_t || uniform) = log K - H(P_t), in nats, averaged over the batch."""
    import torch.nn.functional as F

    log_p = F.log_softmax((teacher - center) / temperature, dim=-1)
    entropy = float(-(log_p.exp() * log_p).sum(-1).mean())
    return {"teacher_entropy": entropy, "teacher_kl_uniform": math.log(teacher.shape[-1]) - entropy}


def _locals(crops: list) -> list:
    """The local views, in batches of one size (all of them together: one forward)."""
    import torch

    return [torch.cat(crops[2:])] if len(crops) > 2 else []


def _spec(model: Any):
    from ..building.builder import spec_of

    return spec_of(model)
