"""Our multi-tensor Lion (training/optimizers.py) against ``lion_pytorch.Lion``, the implementation the
CRATE authors' training script imports (installed with the test extra as the reference): the same
update to the bit in float32 on the CPU, its state dicts and the run checkpoints written with it
resume in ours exactly, and ``train --optimizer lion`` runs ours."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
from lion_pytorch import Lion as Reference
from runfiles import train_losses
from safetensors.torch import load_file

from crate_compose.settings import Settings
from crate_compose.training import optimizers
from crate_compose.training.optimizers import Lion, optimizer_for
from crate_compose.training.run import train

pytestmark = pytest.mark.usefixtures("one_thread")

DIGITS = "specs/crate-digits.yaml"
SMALL = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=2"]


class Shapes(torch.nn.Module):
    """Parameters of several shapes: matrices, a convolution, vectors, a scalar, one never used."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(7, 5)
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.embed = torch.nn.Embedding(11, 6)
        self.norm = torch.nn.LayerNorm(5)
        self.scale = torch.nn.Parameter(torch.tensor(0.5))
        self.unused = torch.nn.Parameter(torch.randn(3, 3))  # never has a gradient

    def groups(self, lr: float) -> list[dict]:
        """Two groups as optimizer_for makes them, with their own betas and lr here."""
        decay = [p for p in self.parameters() if p.ndim >= 2]
        other = [p for p in self.parameters() if p.ndim < 2]
        return [
            {"params": decay, "weight_decay": 0.3},
            {"params": other, "weight_decay": 0.0, "betas": (0.8, 0.95), "lr": lr / 3},
        ]


def _pair(**options) -> tuple[Shapes, Shapes, torch.optim.Optimizer, torch.optim.Optimizer]:
    torch.manual_seed(0)
    ours_model = Shapes()
    reference_model = copy.deepcopy(ours_model)
    ours = Lion(ours_model.groups(1e-2), lr=1e-2, betas=(0.9, 0.99), **options)
    reference = Reference(reference_model.groups(1e-2), lr=1e-2, betas=(0.9, 0.99))
    return ours_model, reference_model, ours, reference


def _set_grads(models: tuple[torch.nn.Module, ...], step: int, generator: torch.Generator) -> None:
    """The same random gradients for every model; the bias only on even steps, ``unused`` never."""
    for named in zip(*(m.named_parameters() for m in models)):
        name, _ = named[0]
        grad = None
        if name != "unused" and not (name == "linear.bias" and step % 2):
            grad = torch.randn(named[0][1].shape, generator=generator, dtype=named[0][1].dtype) * 10 ** (step % 3 - 1)
        for _, p in named:
            p.grad = None if grad is None else grad.clone()


def _same(a: torch.nn.Module, b: torch.nn.Module, oa: torch.optim.Optimizer, ob: torch.optim.Optimizer) -> None:
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), name
        assert set(oa.state[p]) == set(ob.state[q]), name
        if oa.state[p]:
            assert torch.equal(oa.state[p]["exp_avg"], ob.state[q]["exp_avg"]), name


def _steps(models, optimizers_, steps: range, generator: torch.Generator) -> None:
    for step in steps:
        for optimizer in optimizers_:
            for group in optimizer.param_groups:  # a schedule: the lr changes every step
                group["lr"] = 1e-2 * (1 + step % 5) / 5 / (3 if group["weight_decay"] == 0 else 1)
        _set_grads(models, step, generator)
        for optimizer in optimizers_:
            optimizer.step()
        _same(*models, *optimizers_)


@pytest.mark.parametrize(
    "options", [{"foreach": True}, {"foreach": False}, {}], ids=["foreach", "per-parameter", "default"]
)
def test_lion_matches_lion_pytorch_bit_for_bit(options):
    ours_model, reference_model, ours, reference = _pair(**options)
    _steps((ours_model, reference_model), (ours, reference), range(20), torch.Generator().manual_seed(1))
    assert ours.state[ours_model.unused] == {}  # skipped: no gradient, no state
    mine, theirs = ours.state_dict(), reference.state_dict()
    assert mine["param_groups"] == theirs["param_groups"]  # the same keys and values
    assert mine["state"].keys() == theirs["state"].keys()


def test_mixed_dtypes_sparse_gradients_and_small_batches_take_the_same_update(monkeypatch):
    """float64 beside float32 (two batches of one group), a sparse gradient (the per-parameter path)
    and groups split into several calls (FOREACH_ELEMENTS lowered): still lion_pytorch's update."""
    monkeypatch.setattr(optimizers, "FOREACH_ELEMENTS", 40)
    ours_model, reference_model, ours, reference = _pair(foreach=True)
    for model in (ours_model, reference_model):
        model.conv.double()
    generator = torch.Generator().manual_seed(2)
    _steps((ours_model, reference_model), (ours, reference), range(6), generator)
    for step in range(6):
        rows = torch.tensor([[1, 4, 4, 9]])
        values = torch.randn(4, 6, generator=generator)
        for model in (ours_model, reference_model):
            model.zero_grad(set_to_none=True)
            model.embed.weight.grad = torch.sparse_coo_tensor(rows, values, (11, 6), check_invariants=True)
            model.linear.weight.grad = torch.ones(5, 7) * (step - 2.5)
        ours.step(), reference.step()
        _same(ours_model, reference_model, ours, reference)


def test_a_state_dict_of_lion_pytorch_loads_and_continues_identically():
    ours_model, reference_model, _, reference = _pair()
    generator = torch.Generator().manual_seed(3)
    twin = copy.deepcopy(reference_model)
    twin_optimizer = Reference(twin.groups(1e-2), lr=1e-2)
    _steps((reference_model, twin), (reference, twin_optimizer), range(7), generator)
    ours_model.load_state_dict(reference_model.state_dict())
    ours = Lion(ours_model.groups(1e-2), lr=1e-2, foreach=True)
    ours.load_state_dict(copy.deepcopy(reference.state_dict()))
    _same(ours_model, reference_model, ours, reference)
    _steps((ours_model, twin), (ours, twin_optimizer), range(7, 20), generator)  # ours against the one that went on


def test_lion_checks_its_settings():
    with pytest.raises(ValueError, match="lr must be positive"):
        Lion(Shapes().parameters(), lr=0.0)
    with pytest.raises(ValueError, match="betas"):
        Lion(Shapes().parameters(), betas=(0.9, 1.5))


def test_train_uses_ours_batched_on_cuda_and_per_parameter_on_the_cpu():
    assert type(optimizer_for(Shapes(), Settings(optimizer="lion"))) is Lion
    assert optimizers._batched(torch.zeros(0), None) is False
    assert "cuda" in optimizers._foreach_devices()


LION_RUN = Settings(
    steps=6, batch_size=32, lr=1e-3, optimizer="lion", weight_decay=0.5, checkpoint_every=3, log_every=1
)


def test_on_the_test_device_ours_takes_lion_pytorchs_steps(device):
    """``pytest --device cuda``: the multi-tensor kernels there (ours) against lion_pytorch's per-tensor
    ones, equal up to the rounding of a fused multiply-add; on the CPU to the bit."""
    ours_model, reference_model, ours, reference = _pair()
    ours_model.to(device), reference_model.to(device)
    generator = torch.Generator().manual_seed(4)
    for _step in range(10):
        for named in zip(ours_model.named_parameters(), reference_model.named_parameters()):
            grad = torch.randn(named[0][1].shape, generator=generator).to(device)
            for _, p in named:
                p.grad = grad.clone()
        ours.step(), reference.step()
    for (name, p), (_, q) in zip(ours_model.named_parameters(), reference_model.named_parameters()):
        if device.type == "cpu":
            assert torch.equal(p, q) and torch.equal(ours.state[p]["exp_avg"], reference.state[q]["exp_avg"]), name
        else:
            torch.testing.assert_close(p, q, msg=name)
            torch.testing.assert_close(ours.state[p]["exp_avg"], reference.state[q]["exp_avg"], msg=name)


@pytest.mark.parametrize("batched", [False, True], ids=["default", "foreach"])
def test_a_run_checkpointed_with_lion_pytorch_resumes_with_ours_exactly(tmp_path, monkeypatch, batched):
    """Runs before this Lion saved lion_pytorch's state: such a run killed after its step-3 checkpoint
    and resumed (with ours) ends where the whole run with lion_pytorch ends, and so does ours from the
    start; with the CPU's default (per parameter) and with the multi-tensor path CUDA takes."""
    from crate_compose.training.run_folder import opening as training  # where a run builds its optimizer

    if batched:
        monkeypatch.setattr(optimizers, "_foreach_devices", lambda: ("cpu",))

    def reference_for(model, settings):
        built = optimizer_for(model, settings)
        return Reference(built.param_groups, lr=settings.lr, betas=built.defaults["betas"])

    with monkeypatch.context() as patch:
        patch.setattr(training, "optimizer_for", reference_for)
        train(DIGITS, LION_RUN, overrides=SMALL, out=tmp_path / "reference", progress=False)
    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "reference", killed)
    (
        shutil.rmtree(killed / "checkpoints/step-000006"),
        shutil.rmtree(killed / "final"),
        (killed / "result.json").unlink(),
    )
    train(DIGITS, LION_RUN, overrides=SMALL, out=killed, resume=True, progress=False)
    train(DIGITS, LION_RUN, overrides=SMALL, out=tmp_path / "ours", progress=False)
    expected = load_file(tmp_path / "reference/final/model.safetensors")
    for run in (killed, tmp_path / "ours"):
        weights = load_file(run / "final/model.safetensors")
        assert all(torch.equal(expected[k], weights[k]) for k in expected), run.name
        assert train_losses(run) == train_losses(tmp_path / "reference"), run.name
    ours = load_file(tmp_path / "ours/checkpoints/step-000006/optimizer.safetensors")
    theirs = load_file(tmp_path / "reference/checkpoints/step-000006/optimizer.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
