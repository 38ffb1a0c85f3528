"""Task simdino (SimDINO: self-distillation held up by the coding rate) and its head, against an independent
transcription of the authors' code (RobinWu218/SimDINO, simdino/main_dino.py: ``MCRLoss``; vision_transformer.py:
``DINOHead`` without its last layer): the loss's two terms, gamma and both feature choices in float64; two
processes (gloo) against one holding both shares; half-precision autocast at batch 1,024; the guard; the head's
parameter count at ViT-S/16 and ViT-B/16; refusals and the recorded options."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import crate_compose as cc
from crate_compose import registry, tasks
from crate_compose.errors import TrainError
from crate_compose.settings import Settings
from crate_compose.tasks.coding_rate_distillation import coding_rate, simdino_loss
from crate_compose.training.run import train

SIMDINO = tasks.get("simdino")
EXAMPLE = SIMDINO.example


class _ReferenceMCRLoss:
    """The authors' MCRLoss, one process, written out: ``comp`` the mean cosine of each teacher global view with
    each student view, same-view pairs zeroed and left out of the count; ``expa`` gamma times the mean over the
    global views of sum(log(diag(cholesky(I + p/(m N eps) W^T W)))), W the student's global view
    (expa_type 0) or its average with the teacher's (expa_type 1)."""

    def __init__(self, ncrops, expa_type=1, eps=0.5, coeff=1.0):
        self.ncrops, self.expa_type, self.eps, self.coeff = ncrops, expa_type, eps, coeff

    def __call__(self, student_feat, teacher_feat):
        student_feat = student_feat.view(self.ncrops, -1, student_feat.shape[-1])
        teacher_feat = teacher_feat.view(2, -1, teacher_feat.shape[-1])
        comp = self.compression(student_feat, teacher_feat)
        if self.expa_type == 0:
            expa = self.expansion(student_feat[:2])
        else:
            expa = self.expansion((student_feat[:2] + teacher_feat) / 2)
        return -self.coeff * comp - expa, comp, expa

    @staticmethod
    def compression(students, teachers):
        total, terms = 0.0, 0
        for t in range(len(teachers)):
            for v in range(len(students)):
                if v == t:
                    continue
                cosines = (teachers[t] * students[v]).sum(-1) / (teachers[t].norm(dim=-1) * students[v].norm(dim=-1))
                total = total + cosines.mean()
                terms += 1
        return total / terms

    def expansion(self, views, world=1):
        m, p = views[0].shape
        scalar = p / (m * world * self.eps)
        total = 0.0
        for w in views:
            matrix = torch.eye(p, dtype=w.dtype) + scalar * (w.T @ w)
            total = total + torch.log(torch.diagonal(torch.linalg.cholesky(matrix))).sum()
        return total / len(views) * (p + world * m) / (p * world * m)


def _features(views, batch, p, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    student = F.normalize(torch.randn(views * batch, p, generator=generator, dtype=dtype), dim=-1)
    teacher = F.normalize(torch.randn(2 * batch, p, generator=generator, dtype=dtype), dim=-1)
    return student, teacher


@pytest.mark.parametrize("views", [2, 4, 12])
@pytest.mark.parametrize(("rate_features", "expa_type"), [("average", 1), ("student", 0)])
@pytest.mark.parametrize(("eps", "coeff"), [(0.5, 1.0), (0.05, 1.0), (0.05, 0.3)])
def test_the_loss_is_the_authors_mcrloss_in_float64(views, rate_features, expa_type, eps, coeff):
    student, teacher = _features(views, 16, 32, seed=views)
    student.requires_grad_(True)
    expected = _ReferenceMCRLoss(views, expa_type, eps, coeff)(student, teacher)
    ours = simdino_loss(student, teacher, views, eps=eps, coeff=coeff, rate_features=rate_features)
    for got, want in zip(ours, expected):
        assert abs(float(got.detach()) - float(want.detach())) <= 1e-10, (float(got), float(want))
    (grad,) = torch.autograd.grad(ours[0], student)
    (want,) = torch.autograd.grad(expected[0], student)
    assert (grad - want).abs().max() <= 1e-10


def test_gamma_and_the_rates_scale_are_the_authors_formula():
    """A hand-made case: Z = sqrt(m/p) * the first p rows of the identity stacked (m = 2p), whose Z^T Z is
    (m/p) I... so R_eps = p/2 log(1 + m/(m eps) ...) in closed form."""
    p, m, eps = 4, 8, 0.5
    z = torch.cat([torch.eye(p), torch.eye(p)]).double()  # Z^T Z = 2 I
    rate = coding_rate(z.unsqueeze(0), eps)
    closed = 0.5 * p * torch.log(torch.tensor(1 + p / (m * eps) * 2.0, dtype=torch.float64))
    assert float(rate) == pytest.approx(float(closed) * (p + m) / (p * m), abs=1e-12)


def _two_processes(rank, world, init, student, teacher, views, reduce, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    mine_s = torch.cat([view.chunk(world)[rank] for view in student.chunk(views)]).clone().requires_grad_(True)
    mine_t = torch.cat([view.chunk(world)[rank] for view in teacher.chunk(2)])
    loss, comp, expa = simdino_loss(mine_s, mine_t, views, eps=0.05, reduce=reduce)
    loss.backward()
    torch.save({"loss": loss.detach(), "comp": comp, "expa": expa, "grad": mine_s.grad}, f"{out}/rank-{rank}.pt")
    dist.destroy_process_group()


def test_two_processes_with_the_covariance_summed_rate_as_one_process_over_the_whole_batch(tmp_path):
    """reduce_cov: two processes of m images each give the coding rate (and its gradient, once DDP averages the
    two) of one process holding all 2m; without it each process rates its own share."""
    views, batch = 4, 12
    student, teacher = _features(views, batch, 16, seed=3)
    whole = student.clone().requires_grad_(True)
    loss, comp, expa = simdino_loss(whole, teacher, views, eps=0.05)
    loss.backward()
    for reduce in (True, False):
        folder = tmp_path / str(reduce)
        folder.mkdir()
        torch.multiprocessing.spawn(
            _two_processes,
            args=(2, f"file://{folder / 'rendezvous'}", student, teacher, views, reduce, str(folder)),
            nprocs=2,
            join=True,
        )
        ranks = [torch.load(folder / f"rank-{rank}.pt") for rank in range(2)]
        rates = [float(one["expa"]) for one in ranks]
        if not reduce:
            assert all(abs(rate - float(expa)) > 1e-3 for rate in rates)
            continue
        assert rates == pytest.approx([float(expa)] * 2, abs=1e-12)
        assert sum(float(one["comp"]) for one in ranks) / 2 == pytest.approx(float(comp), abs=1e-12)
        averaged = [one["grad"] / 2 for one in ranks]  # DDP's mean over the processes
        for rank, grad in enumerate(averaged):
            share = torch.cat([view.chunk(2)[rank] for view in whole.grad.chunk(views)])
            assert (grad - share).abs().max() <= 1e-12, rank


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_under_half_precision_autocast_at_batch_1024_the_loss_and_gradients_are_finite(dtype):
    """A head's features made in half precision (batch 1,024, p = 256, eps 0.05): the loss is computed in
    float64 all the same, so it is finite and equals the loss of the same features in float64."""
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256))
    views, batch = 4, 1024
    x = torch.randn(views * batch, 64)
    teacher_x = x[: 2 * batch] + 0.1 * torch.randn(2 * batch, 64)
    with torch.autocast("cpu", dtype=dtype):
        student = F.normalize(head(x).float(), dim=-1).to(dtype)
        with torch.no_grad():
            teacher = F.normalize(head(teacher_x).float(), dim=-1).to(dtype)
        assert student.dtype == dtype
        loss, _, expa = simdino_loss(student, teacher, views, eps=0.05)
    loss.backward()
    assert torch.isfinite(loss) and float(expa) > 0
    assert all(torch.isfinite(p.grad).all() for p in head.parameters())
    exact = simdino_loss(student.detach().double(), teacher.double(), views, eps=0.05)[0]
    assert float(loss.detach()) == pytest.approx(float(exact), abs=1e-9)


def test_features_that_are_not_finite_stop_the_run_naming_the_step():
    student, teacher = _features(3, 8, 16, seed=0)
    student[5, 2] = float("nan")
    with pytest.raises(
        TrainError,
        match=r"^at step 7: the coding rate's matrix .* of global view 1 is not "
        r"positive-definite \(its features are not finite\).*--eps \(now 0.05\)",
    ):
        simdino_loss(student, teacher, 3, eps=0.05, step=7)


class _ReferenceSimDinoHead(nn.Module):
    """The authors' DINOHead (use_bn False, nlayers 3, its last layer commented out): Linear, GELU, Linear,
    GELU, Linear to z_dim, then F.normalize."""

    def __init__(self, in_dim, hidden_dim=2048, bottleneck_dim=256):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(in_dim, hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, bottleneck_dim),
        )

    def forward(self, x):
        return F.normalize(self.mlp(x), dim=-1, p=2)


@pytest.mark.parametrize(("width", "count"), [(384, 5_509_376), (768, 6_295_808)], ids=["ViT-S/16", "ViT-B/16"])
def test_the_heads_parameters_are_the_authors_at_vit_s_and_vit_b(width, count):
    from crate_compose.modules.head import SimDinoHead

    with torch.device("meta"):
        reference = _ReferenceSimDinoHead(width)
        ours = SimDinoHead(width, 256, norm=False)
    assert sum(p.numel() for p in reference.parameters()) == count
    assert {n: p.shape for n, p in ours.named_parameters()} == {n: p.shape for n, p in reference.named_parameters()}
    primitive = registry.get("simdino_head")
    for norm, extra in ((False, 0), (True, 2 * width)):
        footprint = primitive.footprint(primitive.args.model_validate({"norm": norm}), (197, width), registry.Context())
        assert sum(torch.Size(shape).numel() for shape in footprint.parameters.values()) == count + extra
        assert footprint.output == (256,) and not footprint.frozen


def test_the_head_computes_the_authors():
    from crate_compose.modules.head import SimDinoHead

    torch.manual_seed(0)
    ours = SimDinoHead(24, 8, hidden=16, norm=False).double()
    reference = _ReferenceSimDinoHead(24, 16, 8).double()
    reference.load_state_dict(ours.state_dict())
    tokens = torch.randn(5, 7, 24, dtype=torch.float64)
    with torch.no_grad():
        assert (ours(tokens) - reference(tokens[:, 0])).abs().max() <= 1e-12


def test_the_vit_simdino_preset_counts_the_authors_vit_s16_with_its_head():
    """vit-simdino-small = ViT-S/16 (timm's, no classifier: its final norm included) + the authors' head; the
    head's LayerNorm plays the backbone's final norm, which this project's ViT keeps in its head."""
    from crate_compose.data.batches import transforms_v2

    transforms_v2()
    timm = pytest.importorskip("timm")  # a test extra (pip install -e .[dev])
    with torch.device("meta"):
        backbone = sum(p.numel() for p in timm.create_model("vit_small_patch16_224", num_classes=0).parameters())
    assert cc.inspect("vit-simdino-small").params_total == backbone + 5_509_376
    with torch.device("meta"):
        head = sum(p.numel() for p in _ReferenceSimDinoHead(576).parameters())  # at CRATE-S/16's width
    classifier = 576 * 1000 + 1000  # crate-small's Linear to ImageNet's classes (both keep the head's LayerNorm)
    assert cc.inspect("crate-simdino-small").params_total == cc.inspect("crate-small").params_total - classifier + head


def _settings(**changes) -> Settings:
    base = Settings(
        task="simdino",
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
        options={"local_crops": 2},
    )
    return replace(base, **changes)


def test_a_simdino_run_logs_its_terms_records_its_options_and_reads_the_teacher(tmp_path):
    from crate_compose.assessment.run_probes import run_weights

    out = tmp_path / "run"
    settings = _settings(options={"local_crops": 2, "eps": 0.2, "coeff": 0.5, "rate_features": "student"})
    result = train(EXAMPLE.spec, settings, overrides=EXAMPLE.overrides, out=out, progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in rows if row["kind"] == "train"]
    assert len(train_rows) == 3
    for row in train_rows:  # unit features: cosines in [-1, 1]; a rate above 0 (no collapse at the start)
        assert -1.0 <= row["view_cosine"] <= 1.0 and row["coding_rate"] > 0
        assert row["loss"] == pytest.approx(-0.5 * row["view_cosine"] - row["coding_rate"], abs=1e-5)
    recorded = json.loads((out / "run.json").read_text())["identity"]["settings"]
    assert (recorded["eps"], recorded["coeff"], recorded["rate_features"]) == (0.2, 0.5, "student")
    assert "reduce_cov" not in recorded  # at its default: left out, as every task option at its default
    assert run_weights(out).weights == out / "final-ema"
    assert 0.0 <= result.metrics["ema_test_knn_accuracy"] <= 1.0


def test_what_simdino_cannot_train_is_refused_and_its_options_are_its_own(tmp_path):
    from crate_compose.tasks import settings_problems

    with pytest.raises(
        TrainError,
        match="ends in dino_head .*which task simdino does not train .*specs/crate-simdino.yaml"
        ".*--task dino trains this spec",
    ):
        train("crate-dino-digits", _settings(), overrides=["sizes.depth=1"], out=tmp_path / "a", progress=False)
    with pytest.raises(TrainError, match="--ema 0.996 .*--config simdino"):
        train(EXAMPLE.spec, _settings(ema=None), overrides=EXAMPLE.overrides, out=tmp_path / "b", progress=False)
    assert not any((tmp_path / name).exists() for name in "ab")
    problems = dict(settings_problems(Settings(task="dino", options={"eps": 0.1})))
    assert "task simdino" in problems["eps"]
    problems = dict(
        settings_problems(
            Settings(task="simdino", options={"eps": 0.0, "rate_features": "teacher", "teacher_temp": 0.04})
        )
    )
    assert set(problems) == {"eps", "rate_features", "teacher_temp"}


def test_the_recipe_is_the_authors_settings_for_one_process():
    from crate_compose.training.recipes import read_recipe

    recipe = read_recipe("simdino")
    assert recipe.settings["task"] == "simdino" and recipe.settings["lr"] == pytest.approx(0.0005 * 64 / 256)
    assert (recipe.settings["eps"], recipe.settings["local_crops"], recipe.settings["grad_clip"]) == (0.05, 10, 3.0)
