"""How a run updates its weights (training/optimizers.py and the step in training/run.py): the
optimizers against their update rules written out here, the schedules, gradient accumulation against
one whole batch, the EMA's recursion, precision, stochastic depth, and exact resume of all of it."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from runfiles import train_losses
from safetensors.torch import load_file

from crate_compose.modules.residual import Residual, stochastic_depth
from crate_compose.settings import Settings
from crate_compose.tasks import settings_problems
from crate_compose.training.optimizers import EMA, lr_at, optimizer_for
from crate_compose.training.run import train
from crate_compose.training.run_folder import identity

pytestmark = pytest.mark.usefixtures("one_thread")

DIGITS = "specs/crate-digits.yaml"
SMALL = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=2"]


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([[1.0, -2.0], [0.5, 3.0]]))
        self.bias = torch.nn.Parameter(torch.tensor([0.25, -0.5]))


def _one_step(settings: Settings, grads: dict[str, torch.Tensor]) -> Tiny:
    model = Tiny()
    optimizer = optimizer_for(model, settings)
    for name, p in model.named_parameters():
        p.grad = grads[name].clone()
    optimizer.step()
    return model


GRADS = {"weight": torch.tensor([[0.1, -0.3], [0.0, 2.0]]), "bias": torch.tensor([-1.0, 0.5])}


def test_lion_is_the_sign_of_the_interpolated_gradient_with_decoupled_decay_on_matrices_only():
    settings = Settings(optimizer="lion", lr=0.01, weight_decay=0.5)
    model = _one_step(settings, GRADS)
    # Lion (Chen et al. 2023): w <- w(1 - lr wd) - lr sign(b1 m + (1 - b1) g), m = 0 at the first step
    weight = torch.tensor([[1.0, -2.0], [0.5, 3.0]]) * (1 - 0.01 * 0.5) - 0.01 * torch.sign(0.1 * GRADS["weight"])
    bias = torch.tensor([0.25, -0.5]) - 0.01 * torch.sign(0.1 * GRADS["bias"])  # no decay on vectors
    assert torch.allclose(model.weight, weight) and torch.allclose(model.bias, bias)


def test_sgd_with_momentum_and_nesterov_follows_torch():
    for nesterov in (False, True):
        settings = Settings(optimizer="sgd", lr=0.1, weight_decay=0.0, momentum=0.9, nesterov=nesterov)
        model = _one_step(settings, GRADS)
        assert torch.allclose(model.bias, torch.tensor([0.25, -0.5]) - 0.1 * GRADS["bias"] * (1.9 if nesterov else 1))


def test_adamw_keeps_the_default_betas_and_takes_others():
    model = Tiny()
    assert optimizer_for(model, Settings()).param_groups[0]["betas"] == (0.9, 0.999)
    assert optimizer_for(model, Settings(optimizer="lion")).param_groups[0]["betas"] == (0.9, 0.99)
    assert optimizer_for(model, Settings(beta2=0.95)).param_groups[0]["betas"] == (0.9, 0.95)


def test_the_schedules_after_a_linear_warm_up():
    cosine = Settings(lr=1.0, steps=110, warmup=10, min_lr=0.1)
    assert [lr_at(s, cosine) for s in (1, 5, 10)] == [0.1, 0.5, 1.0]
    assert lr_at(60, cosine) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(110, cosine) == pytest.approx(0.1)
    step = replace(cosine, schedule="step", lr_step=30, lr_decay=0.5)
    assert [lr_at(s, step) for s in (11, 39, 40, 70, 100)] == [1.0, 1.0, 0.5, 0.25, 0.125]
    assert lr_at(100, replace(cosine, schedule="constant")) == 1.0


def test_the_ema_is_the_exponential_recursion():
    model = Tiny()
    ema = EMA(model, 0.9)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    assert torch.allclose(ema.tensors["weight"], 0.9 * start + 0.1 * (start + 1))
    with ema.swapped_in(model):
        assert torch.allclose(model.weight, 0.9 * start + 0.1 * (start + 1))
    assert torch.allclose(model.weight, start + 1)  # its own weights again


@pytest.mark.parametrize("batched", [False, True], ids=["per-tensor", "multi-tensor"])
def test_the_ema_of_a_network_is_the_recursion_on_every_tensor_and_swaps_in_and_out_exactly(batched, monkeypatch):
    """The multi-tensor path (CUDA's: one ``_foreach_lerp_`` and ``_foreach_copy_`` over all tensors) and the
    per-tensor one (the CPU's) give the recursion on every floating tensor to the bit; swapping the average
    in copies into the model's own tensors (an optimizer or a compiled graph holding them sees it), and
    swapping back restores them exactly."""
    import crate_compose as cc
    from crate_compose.training import optimizers

    monkeypatch.setattr(optimizers, "_foreach_devices", lambda: ("cpu",) if batched else ())
    model = cc.build(DIGITS, overrides=SMALL)
    ema = EMA(model, 0.75)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.5 + i)
    moved = {k: v.clone() for k, v in model.state_dict().items()}
    ema.update(model)
    for name, average in ema.tensors.items():
        assert torch.equal(average, start[name].lerp(moved[name], 0.25)), name
    tensors = [p for p in model.parameters()]
    with ema.swapped_in(model):
        assert all(a is b for a, b in zip(tensors, model.parameters()))  # the same tensors, new values
        for name, value in model.state_dict().items():
            assert torch.equal(value, ema.tensors[name]), name
    for name, value in model.state_dict().items():
        assert torch.equal(value, moved[name]), name


@pytest.mark.parametrize("optimizer", ["adamw", "lion", "sgd"])
def test_adamw_takes_torchs_fused_kernel_and_steps_as_the_unfused_one(optimizer, device):
    """AdamW steps with torch's fused kernel on the CPU and CUDA (a third of the bytes of the multi-tensor
    kernels, benchmarks/kernels.py; 2.3x faster than one parameter at a time on the CPU, benchmarks/optimizer_step.py), to float32 rounding
    of the unfused step over a few steps; the other optimizers keep their own kernels."""
    model = Tiny().to(device)
    chosen = optimizer_for(model, Settings(optimizer=optimizer, weight_decay=0.1, lr=0.01))
    assert bool(chosen.defaults.get("fused")) == (optimizer == "adamw")
    if optimizer != "adamw":
        return
    reference = Tiny().to(device)
    unfused = torch.optim.AdamW(
        [{"params": [reference.weight], "weight_decay": 0.1}, {"params": [reference.bias], "weight_decay": 0.0}],
        lr=0.01,
        foreach=False,
    )
    for step in range(3):
        for net, optimizer_ in ((model, chosen), (reference, unfused)):
            for p in net.parameters():
                p.grad = torch.full_like(p, 0.5 * (step + 1)) - p
            optimizer_.step()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_stochastic_depth_rises_to_the_rate_over_the_residual_steps_and_keeps_the_expectation():
    import crate_compose as cc

    model = cc.build(DIGITS, overrides=SMALL)
    stochastic_depth(model, 0.2)
    rates = [m.drop_path for m in model.modules() if isinstance(m, Residual) and m.adds_skip]
    assert rates[0] == 0 and rates[-1] == pytest.approx(0.2) and rates == sorted(rates)
    step = next(m for m in model.modules() if isinstance(m, Residual) and m.drop_path)
    step.drop_path = 0.5
    skip, branch = torch.zeros(4000, 3, 5), torch.ones(4000, 3, 5)
    step.train()
    out = step.combine(skip, branch)
    assert set(out.unique().tolist()) == {0.0, 2.0} and abs(out.mean().item() - 1) < 0.05
    assert (out[:, 0, 0:1] == out[:, :, :].amax((1, 2), keepdim=True)[:, :, 0]).all()  # a whole example at once
    step.eval()
    assert torch.equal(step.combine(skip, branch), branch)


def test_settings_are_checked():
    problems = dict(settings_problems(Settings(optimizer="adam", accumulate=3, ema=1.0, precision="fp8")))
    assert set(problems) == {"optimizer", "accumulate", "ema", "precision"}
    assert "does not divide batch_size 64" in problems["accumulate"]
    assert [name for name, _ in settings_problems(Settings(compile=True, compile_mode="fastest"))] == ["compile_mode"]
    assert "a mode of --compile" in dict(settings_problems(Settings(compile_mode="reduce-overhead")))["compile_mode"]
    assert settings_problems(Settings(compile=True, compile_mode="reduce-overhead")) == []


def test_accumulating_micro_batches_is_the_same_step_as_the_whole_batch(tmp_path):
    base = Settings(steps=4, batch_size=32, lr=3e-3, log_every=1)
    whole = train(DIGITS, base, overrides=SMALL, out=tmp_path / "whole", progress=False)
    split = train(DIGITS, replace(base, accumulate=4), overrides=SMALL, out=tmp_path / "split", progress=False)
    a, b = load_file(tmp_path / "whole/final/model.safetensors"), load_file(tmp_path / "split/final/model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert whole.train_loss == pytest.approx(split.train_loss, abs=1e-5)


RECIPE_LIKE = Settings(
    steps=6,
    batch_size=32,
    lr=1e-3,
    optimizer="lion",
    weight_decay=0.5,
    ema=0.9,
    accumulate=2,
    drop_path=0.1,
    label_smoothing=0.1,
    checkpoint_every=3,
    log_every=1,
)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_killed_run_resumes_exactly_with_lion_ema_accumulation_and_precision(tmp_path, precision, device):
    settings = replace(RECIPE_LIKE, precision=precision)
    train(DIGITS, settings, overrides=SMALL, out=tmp_path / "whole", progress=False, device=str(device))
    broken = tmp_path / "broken"
    train(DIGITS, settings, overrides=SMALL, out=broken, progress=False, device=str(device))
    shutil.rmtree(broken / "checkpoints/step-000006"), shutil.rmtree(broken / "final")  # killed after step 3's
    shutil.rmtree(broken / "final-ema"), (broken / "result.json").unlink()  # checkpoint
    record = json.loads((broken / identity.RUN_FILE).read_text())
    assert record["identity"]["settings"]["precision" if precision != "fp32" else "optimizer"]  # recorded
    train(DIGITS, settings, overrides=SMALL, out=broken, resume=True, progress=False, device=str(device))
    for folder in ("final", "final-ema"):
        a = load_file(tmp_path / "whole" / folder / "model.safetensors")
        b = load_file(broken / folder / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), folder
    assert train_losses(tmp_path / "whole") == train_losses(broken)
    ema = load_file(broken / "checkpoints/step-000006/ema.safetensors")
    final = load_file(broken / "final-ema/model.safetensors")
    assert all(torch.equal(ema[k], final[k].float()) for k in final if k in ema)


def test_resuming_with_another_optimizer_is_refused(tmp_path):
    train(DIGITS, replace(RECIPE_LIKE, steps=3), overrides=SMALL, out=tmp_path / "run", progress=False)
    with pytest.raises(identity.RunMismatch, match="settings.optimizer: lion in the run, adamw now"):
        train(
            DIGITS,
            replace(RECIPE_LIKE, optimizer="adamw"),
            overrides=SMALL,
            out=tmp_path / "run",
            resume=True,
            progress=False,
        )


def test_a_run_from_before_these_settings_keeps_its_identity():
    """Settings at their defaults stay out of the identity: run.json files written before them still match."""
    recorded = identity.identity("spec", "name", replace(Settings(), warmup=5), "data", "0.1.0")
    assert not set(recorded["settings"]) & set(identity.LATER)
    assert (
        "optimizer"
        in identity.identity("spec", "name", replace(Settings(optimizer="lion"), warmup=5), "d", "v")["settings"]
    )


def test_epochs_set_the_steps_and_the_warm_up(tmp_path):
    result = train(
        DIGITS, Settings(epochs=1, warmup_epochs=1, batch_size=256), overrides=SMALL, out=tmp_path / "r", progress=False
    )
    assert result.steps == 1437 // 256  # the digits' training split, in whole batches
    assert json.loads((tmp_path / "r" / identity.RUN_FILE).read_text())["identity"]["settings"]["warmup"] == 5


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compile_trains_the_same_weights_as_eager_within_float_tolerance(tmp_path, device, mode):
    """``--compile`` and ``--compile-mode reduce-overhead`` (CUDA graphs on a GPU: ``pytest --device cuda``)."""
    settings = Settings(steps=2, batch_size=16, lr=1e-3)
    train(DIGITS, settings, overrides=SMALL, out=tmp_path / "eager", progress=False, device=str(device))
    train(
        DIGITS,
        replace(settings, compile=True, compile_mode=mode),
        overrides=SMALL,
        out=tmp_path / "compiled",
        progress=False,
        device=str(device),
    )
    a = load_file(Path(tmp_path / "eager/final/model.safetensors"))
    b = load_file(Path(tmp_path / "compiled/final/model.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4


def test_a_checkpoint_written_before_these_settings_resumes(tmp_path):
    """Its state.json lacks the later settings: they had their defaults then."""
    run = tmp_path / "run"
    settings = Settings(steps=4, batch_size=16, checkpoint_every=2)
    train(DIGITS, settings, overrides=SMALL, out=run, progress=False)
    shutil.rmtree(run / "checkpoints/step-000004"), shutil.rmtree(run / "final"), (run / "result.json").unlink()
    state_file = run / "checkpoints/step-000002/state.json"
    state = json.loads(state_file.read_text())
    state["settings"] = {k: v for k, v in state["settings"].items() if k not in identity.LATER and k != "workers"}
    state_file.write_text(json.dumps(state))
    assert train(DIGITS, settings, overrides=SMALL, out=run, resume=True, progress=False).steps == 4


@pytest.mark.slow
def test_a_bf16_compiled_run_killed_after_a_checkpoint_resumes_to_the_same_weights(tmp_path, device):
    """What a user does on a GPU (``pytest --device cuda``; the CPU by default): ``--precision bf16
    --compile`` with the recipe's Lion, EMA and label smoothing, killed after its checkpoint at step 3
    (everything later removed, as a SIGKILL leaves it) and resumed: the same losses and the same final
    weights, bit for bit."""
    settings = replace(RECIPE_LIKE, precision="bf16", compile=True, accumulate=1, drop_path=0.0)
    whole = tmp_path / "whole"
    train(DIGITS, settings, overrides=SMALL, out=whole, progress=False, device=str(device))
    killed = tmp_path / "killed"
    shutil.copytree(whole, killed)
    for later in ("checkpoints/step-000006", "final", "final-ema"):
        shutil.rmtree(killed / later)
    (killed / "result.json").unlink()
    train(DIGITS, settings, overrides=SMALL, out=killed, resume=True, progress=False, device=str(device))
    assert train_losses(killed) == train_losses(whole)
    for folder in ("final", "final-ema"):
        a, b = load_file(whole / folder / "model.safetensors"), load_file(killed / folder / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), folder
