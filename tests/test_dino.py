"""The DINO task (self-distillation with no labels) against an independent reading of DINO's code
(facebookresearch/dino, main_dino.py: DINOLoss, the teacher's update, utils.cosine_scheduler), and a short run:
the teacher never gets a gradient, the last layer waits an epoch, the collapse measures are logged, refusals."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import crate_compose as cc
from crate_compose import tasks
from crate_compose.errors import TrainError
from crate_compose.settings import Settings
from crate_compose.tasks.self_distillation import cosine, dino_loss, teacher_momentum, teacher_temperature
from crate_compose.training.run import train

DINO = tasks.get("dino")
EXAMPLE = DINO.example


class _ReferenceDINOLoss:
    """DINO's DINOLoss as main_dino.py writes it (one process): student outputs of every crop, teacher outputs
    of the 2 global crops; centering and sharpening; every pair of different views; the center updated after."""

    def __init__(self, out_dim, ncrops, teacher_temp=0.04, student_temp=0.1, center_momentum=0.9):
        self.student_temp, self.teacher_temp, self.ncrops = student_temp, teacher_temp, ncrops
        self.center_momentum = center_momentum
        self.center = torch.zeros(1, out_dim, dtype=torch.float64)

    def __call__(self, student_output, teacher_output):
        student_out = (student_output / self.student_temp).chunk(self.ncrops)
        teacher_out = F.softmax((teacher_output - self.center) / self.teacher_temp, dim=-1).detach().chunk(2)
        total_loss, n_loss_terms = 0, 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:
                    continue
                loss = torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1)
                total_loss += loss.mean()
                n_loss_terms += 1
        total_loss /= n_loss_terms
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True) / len(teacher_output)
        self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)
        return total_loss


def _cosine_scheduler(base_value, final_value, epochs, niter_per_ep):
    """DINO's utils.cosine_scheduler without warm-up: one value per iteration."""
    iters = np.arange(epochs * niter_per_ep)
    return final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))


@pytest.mark.parametrize("views", [2, 4, 10])
def test_the_loss_and_the_center_are_dinos_over_several_steps(views):
    generator = torch.Generator().manual_seed(views)
    reference, center = _ReferenceDINOLoss(64, views), torch.zeros(1, 64, dtype=torch.float64)
    for _ in range(4):
        student = torch.randn(views * 5, 64, generator=generator, dtype=torch.float64) * 3
        teacher = torch.randn(2 * 5, 64, generator=generator, dtype=torch.float64) * 3
        expected = reference(student, teacher)
        ours = dino_loss(student.double(), teacher, center, views, 0.04)
        center.mul_(0.9).add_(teacher.sum(0, keepdim=True) / len(teacher), alpha=0.1)  # as the session updates it
        assert torch.allclose(ours.double(), expected, rtol=1e-6, atol=1e-7), (float(ours), float(expected))
        assert torch.allclose(center, reference.center, rtol=1e-12, atol=1e-14)


def test_the_teacher_momentum_and_the_weight_decay_are_dinos_cosine_schedules():
    expected = _cosine_scheduler(0.996, 1.0, 3, 7)
    assert [teacher_momentum(i, 21, 0.996) for i in range(21)] == pytest.approx(list(expected), abs=1e-15)
    assert teacher_momentum(0, 21, 0.996) == pytest.approx(0.996) and teacher_momentum(21, 21, 0.996) == 1.0
    decay = _cosine_scheduler(0.04, 0.4, 3, 7)  # the weight decay, 0.04 to 0.4
    assert [cosine(i, 21, 0.04, 0.4) for i in range(21)] == pytest.approx(list(decay), abs=1e-15)


@pytest.mark.parametrize(("warmup", "epochs"), [(0.04, 0), (0.04, 1), (0.04, 3), (0.02, 5)])
def test_the_teacher_temperature_is_dinos_schedule(warmup, epochs):
    """main_dino.py: np.concatenate((np.linspace(warmup_teacher_temp, teacher_temp, warmup_epochs),
    np.ones(nepochs - warmup_epochs) * teacher_temp)), read at the step's epoch."""
    per_epoch, total = 4, 8
    expected = np.concatenate((np.linspace(warmup, 0.07, epochs), np.ones(total - epochs) * 0.07))
    settings = Settings(
        task="dino", options={"teacher_temp": 0.07, "warmup_teacher_temp": warmup, "warmup_teacher_temp_epochs": epochs}
    )
    ours = [teacher_temperature(step, per_epoch, settings) for step in range(per_epoch * total)]
    assert ours == pytest.approx(list(np.repeat(expected, per_epoch)), abs=1e-15)


def test_dinos_settings_belong_to_task_dino_and_are_recorded(tmp_path):
    from crate_compose.tasks import settings_problems

    problems = dict(settings_problems(Settings(task="classify", options={"local_crops": 2, "teacher_temp": 0.07})))
    assert set(problems) == {"local_crops", "teacher_temp"} and "task dino" in problems["local_crops"]
    assert dict(settings_problems(Settings(task="dino", options={"teacher_temp": 0.0})))["teacher_temp"]
    settings = _settings(
        steps=2,
        checkpoint_every=0,
        options={"local_crops": 2, "teacher_temp": 0.07, "warmup_teacher_temp": 0.03, "warmup_teacher_temp_epochs": 2},
    )
    train(EXAMPLE.spec, settings, overrides=EXAMPLE.overrides, out=tmp_path / "run", progress=False)
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["identity"]["settings"]
    assert (recorded["local_crops"], recorded["teacher_temp"], recorded["warmup_teacher_temp_epochs"]) == (2, 0.07, 2)


def _center_shares(rank: int, world: int, init: str, teacher: torch.Tensor, out: str) -> None:
    """One process of a two-process group: its half of the teacher's outputs through the session's centre update."""
    import torch.distributed as dist

    from crate_compose.tasks.self_distillation import DinoSession

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    session = DinoSession.__new__(DinoSession)
    session.state = {"center": torch.zeros(1, teacher.shape[1], dtype=teacher.dtype)}
    session._update_center(teacher.chunk(world)[rank], 0.04)
    torch.save(session.state["center"], f"{out}/center-{rank}.pt")
    dist.destroy_process_group()


def test_under_ddp_the_center_is_the_mean_over_every_processs_share(tmp_path):
    """DINO's all_reduce of the batch centre: two processes holding 3 and 3 teacher rows move the centre as one
    process holding all 6 (the step's views are each process's own, as in DINO: the centre is what they share)."""
    teacher = torch.randn(6, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.multiprocessing.spawn(
        _center_shares, args=(2, f"file://{tmp_path / 'rendezvous'}", teacher, str(tmp_path)), nprocs=2, join=True
    )
    expected = 0.1 * teacher.mean(0, keepdim=True)
    for rank in range(2):
        assert torch.allclose(torch.load(tmp_path / f"center-{rank}.pt"), expected, rtol=1e-12, atol=1e-15)


def test_a_bf16_dino_run_killed_after_a_checkpoint_resumes_exactly(tmp_path, device):
    """The teacher (the weights' average), the centre and the views after a resume, in bf16 autocast on ``device``."""
    import shutil

    settings = _settings(steps=4, checkpoint_every=2, precision="bf16")
    whole = train(
        EXAMPLE.spec, settings, overrides=EXAMPLE.overrides, out=tmp_path / "whole", progress=False, device=str(device)
    )
    broken = tmp_path / "broken"
    train(EXAMPLE.spec, settings, overrides=EXAMPLE.overrides, out=broken, progress=False, device=str(device))
    for folder in ("checkpoints/step-000004", "final", "final-ema"):
        shutil.rmtree(broken / folder)
    (broken / "result.json").unlink()
    resumed = train(
        EXAMPLE.spec, settings, overrides=EXAMPLE.overrides, out=broken, resume=True, progress=False, device=str(device)
    )
    for folder in ("final", "final-ema"):
        a, b = (load_file(run / folder / "model.safetensors") for run in (tmp_path / "whole", broken))
        assert all(torch.equal(a[k], b[k]) for k in a), folder
    centers = [
        load_file(run / "checkpoints/step-000004/task.safetensors")["center"] for run in (tmp_path / "whole", broken)
    ]
    assert torch.equal(*centers) and whole.train_loss == resumed.train_loss


def _settings(**changes) -> Settings:
    base = Settings(
        task="dino",
        data="digits",
        steps=3,
        batch_size=8,
        eval_every=0,
        checkpoint_every=3,
        log_every=1,
        logger="none",
        warmup=1,
        ema=0.996,
        lr=1e-3,
        weight_decay=0.04,
        grad_clip=3.0,
    )
    return replace(base, **changes)


@pytest.fixture(scope="module")
def dino_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dino") / "run"
    result = train(EXAMPLE.spec, _settings(), overrides=EXAMPLE.overrides, out=out, progress=False)
    return out, result


def test_a_dino_run_logs_the_collapse_measures_and_keeps_the_center(dino_run):
    out, result = dino_run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in rows if row["kind"] == "train"]
    assert len(train_rows) == 3
    prototypes = 32  # EXAMPLE's sizes.prototypes
    for row in train_rows:  # the teacher's entropy lies between one prototype (0) and uniform (log K)
        assert 0.0 <= row["teacher_entropy"] <= math.log(prototypes) + 1e-9
        assert row["teacher_kl_uniform"] == pytest.approx(math.log(prototypes) - row["teacher_entropy"])
    center = load_file(out / "checkpoints" / "step-000003" / "task.safetensors")["center"]
    assert center.shape == (1, prototypes) and torch.isfinite(center).all() and center.abs().sum() > 0
    assert 0.0 <= result.metrics["test_knn_accuracy"] <= 1.0 and 0.0 <= result.metrics["ema_test_knn_accuracy"] <= 1.0


def test_the_teacher_is_the_average_and_the_last_layer_waits_an_epoch(dino_run, tmp_path):
    out, _ = dino_run
    start = train(
        EXAMPLE.spec,
        _settings(steps=1, checkpoint_every=1),
        overrides=EXAMPLE.overrides,
        out=tmp_path / "zero",
        progress=False,
    )
    assert start.steps == 1
    student, teacher = (
        load_file(out / "final" / "model.safetensors"),
        load_file(out / "final-ema" / "model.safetensors"),
    )
    initial = load_file(tmp_path / "zero" / "final-ema" / "model.safetensors")
    last = [name for name in student if ".last_layer." in name or name.endswith("last_layer.weight_v")]
    assert last, sorted(student)
    for name in last:  # the first epoch (179 steps of 8 digits) has not ended: no update
        assert torch.equal(student[name], initial[name]), name
    moved = [name for name in student if name not in last and not torch.equal(student[name], teacher[name])]
    assert moved  # the teacher lags the student
    for name in moved:  # and stays within the momentum's reach of the initial weights: it is an average
        assert (teacher[name] - initial[name]).abs().max() <= (student[name] - initial[name]).abs().max() + 1e-6


def test_linear_probe_and_evaluate_of_a_dino_run_read_the_teacher(dino_run):
    from crate_compose.assessment.run_probes import run_weights

    out, _ = dino_run
    assert run_weights(out).weights == out / "final-ema"


def test_what_dino_cannot_train_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(TrainError, match="--ema 0.996"):
        train(EXAMPLE.spec, _settings(ema=None), overrides=EXAMPLE.overrides, out=tmp_path / "a", progress=False)
    with pytest.raises(
        TrainError,
        match="ends in classify .*which task dino does not train \\(it trains a dino_head "
        "head, as specs/crate-dino.yaml has\\); --task classify trains this spec",
    ):
        train("crate-digits", _settings(), overrides=list(EXAMPLE.overrides[:-1]), out=tmp_path / "b", progress=False)
    with pytest.raises(TrainError, match="interpolate: true"):
        train(
            EXAMPLE.spec,
            _settings(),
            overrides=[*EXAMPLE.overrides, "preprocess[positions].args.interpolate=false"],
            out=tmp_path / "c",
            progress=False,
        )
    assert not any((tmp_path / name).exists() for name in "bc")


def test_the_vit_dino_preset_counts_dinos_vit_s16_with_its_head():
    """vit-dino-small = DINO's ViT-S/16 backbone (timm's, no classifier: its final norm included) + DINO's head
    (22,352,128); the head's LayerNorm plays the backbone's final norm, which this project's ViT keeps in its head."""
    import crate_compose as cc
    from crate_compose.data.batches import transforms_v2

    transforms_v2()  # torchvision imported the way the package imports it (its C++ operators may not load)
    timm = pytest.importorskip("timm")  # a test extra (pip install -e .[dev])
    with torch.device("meta"):
        backbone = sum(p.numel() for p in timm.create_model("vit_small_patch16_224", num_classes=0).parameters())
    from crate_compose.modules.head import DinoHead

    with torch.device("meta"):
        head = DinoHead(384, 65536, norm=False)
    assert cc.inspect("vit-dino-small").params_total == backbone + sum(p.numel() for p in head.parameters())


def test_multicrop_views_are_per_image_seeded_and_in_range():
    from crate_compose.tasks.multicrop import MultiCrop, blur, local_size, views

    assert local_size(32, 4) == 12 and local_size(224, 16) == 96 and local_size(8, 2) == 4  # DINO's 96/224
    images = torch.rand(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    crop = MultiCrop(32, 12, 8)
    torch.manual_seed(5)
    first = views(images, crop)
    torch.manual_seed(5)
    again = views(images, crop)
    assert len(first) == 10 and all(torch.equal(a, b) for a, b in zip(first, again))  # a step's seed: the same views
    assert [tuple(v.shape) for v in first[1:3]] == [(16, 3, 32, 32), (16, 3, 12, 12)]
    assert all(float(v.min()) >= 0.0 and float(v.max()) <= 1.0 for v in first)
    same = images[:1].expand(16, -1, -1, -1)  # one image sixteen times: every copy gets a view of its own
    torch.manual_seed(6)
    local = views(same, crop)[2]
    assert len({tuple(v.flatten()[:8].tolist()) for v in local}) == 16
    flat = torch.full((4, 1, 16, 16), 0.3)
    assert torch.allclose(blur(flat, 1.0), flat, atol=1e-6)  # a normalized kernel keeps a constant image


def test_the_hue_shift_is_torchvisions_adjust_hue_per_image():
    """DINO's ColorJitter(hue=0.1): the batched shift equals torchvision's adjust_hue image by image (greys, a
    saturated pixel, shifts across +-0.1 of a turn)."""
    from crate_compose.data.batches import transforms_v2
    from crate_compose.tasks.multicrop import hue_shift

    transforms_v2()  # torchvision imported the way the package imports it
    import torchvision.transforms.v2.functional as TF

    images = torch.rand(16, 3, 9, 11, generator=torch.Generator().manual_seed(0))
    images[0], images[1, :, 0, 0] = 0.5, 1.0
    shift = torch.linspace(-0.1, 0.1, 16).view(-1, 1, 1, 1)
    expected = torch.stack([TF.adjust_hue(images[i], float(shift[i])) for i in range(16)])
    assert (hue_shift(images, shift) - expected).abs().max() < 1e-5


def test_the_progress_shows_the_collapse_measures_and_the_student_and_the_teacher(tmp_path, capsys):
    """A DINO run's progress lines show the teacher's entropy and KL to uniform beside each step's loss (the
    values metrics.jsonl logs at that step); the evaluation line and the summary say the k-NN accuracy of the
    student and of the teacher; metrics.jsonl and result.json keep their keys."""
    from crate_compose import cli

    out = tmp_path / "run"
    sets = [arg for override in EXAMPLE.overrides for arg in ("--set", override)]
    args = [
        "train",
        EXAMPLE.spec,
        *sets,
        "--task",
        "dino",
        "--data",
        "digits",
        "--steps",
        "4",
        "--batch-size",
        "8",
        "--ema",
        "0.996",
        "--local-crops",
        "2",
        "--log-every",
        "1",
        "--logger",
        "none",
        "--out",
        str(out),
    ]
    assert cli.main(args) == 0
    printed, err = capsys.readouterr()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = {row["step"]: row for row in rows if row["kind"] == "train"}
    lines = [line for line in err.splitlines() if line.startswith("step ") and "/4 (" in line]
    assert lines, err
    for line in lines:
        row = train_rows[int(line.split()[1].split("/")[0])]
        assert (
            f", loss {row['loss']:.4f}, teacher_entropy {row['teacher_entropy']:.3f}, "
            f"teacher_kl_uniform {row['teacher_kl_uniform']:.3f}, "
        ) in line, (line, row)
    evaluation = next(row for row in rows if row["kind"] == "eval")
    said = (
        f"student test_knn_accuracy {evaluation['test_knn_accuracy']:.4f}, "
        f"teacher {evaluation['ema_test_knn_accuracy']:.4f}"
    )
    assert f"step 4: {said}" in err.splitlines(), err
    summary = next(line for line in printed.splitlines() if line.startswith("trained "))
    assert summary.endswith(f": last batch's train loss {train_rows[4]['loss']:.4f}, {said}"), summary
    assert set(json.loads((out / "result.json").read_text())["metrics"]) == {
        "test_knn_accuracy",
        "ema_test_knn_accuracy",
    }


def test_a_diverged_dino_run_names_its_own_settings(tmp_path, monkeypatch):
    """A loss that is not finite stops the run, and the message names the task's own options with the run's
    values beside --lr and --warmup (the teacher's temperatures can make the loss diverge)."""
    from crate_compose.tasks.self_distillation import DinoSession

    real = DinoSession.loss

    def diverging(self, net, model, x, y, step, ema=None):
        loss, output = real(self, net, model, x, y, step, ema)
        return (loss * float("nan") if step == 2 else loss), output

    monkeypatch.setattr(DinoSession, "loss", diverging)
    settings = _settings(options={"local_crops": 2, "teacher_temp": 0.05})
    with pytest.raises(TrainError) as caught:
        train(EXAMPLE.spec, settings, overrides=EXAMPLE.overrides, out=tmp_path / "run", progress=False)
    message = str(caught.value)
    assert message.startswith("the loss is nan at step 2: the run diverged"), message
    assert (
        "lower --lr or raise --warmup, or check task dino's --local-crops 2, --teacher-temp 0.05, "
        "--warmup-teacher-temp 0.04, --warmup-teacher-temp-epochs 0, and start a new run with another --out"
    ) in message


def test_train_closes_with_the_untrained_networks_knn_and_chance(tmp_path, capsys):
    """A self-supervised run's k-NN means little alone: train's closing lines give the same network untrained (the
    run's spec, data and seed) and chance beside it."""
    from crate_compose import cli

    out = tmp_path / "run"
    sets = [a for o in EXAMPLE.overrides for a in ("--set", o)]
    assert (
        cli.main(
            [
                "train",
                EXAMPLE.spec,
                *sets,
                "--task",
                "dino",
                "--data",
                "digits",
                "--steps",
                "3",
                "--batch-size",
                "8",
                "--ema",
                "0.996",
                "--logger",
                "none",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    untrained = cc.evaluate(out, untrained=True)
    assert last == (
        f"beside it: the same network untrained, test_knn_accuracy {untrained['test_knn_accuracy']:.4f}, chance 0.1000"
    )
