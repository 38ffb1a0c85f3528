"""Language modelling: the cross-entropy of every next byte of a window of text.

A causal network reads ``N`` bytes and predicts, at every position, the byte after it (the target is the
window shifted by one). The test split reports the cross-entropy per byte in nats and bits beside the
unigram baseline (the entropy of the training split's byte frequencies), on its first
:data:`EVAL_WINDOWS` windows, always the same ones.
"""

from __future__ import annotations

from typing import Any

from ..data.set_registry import NEXT_BYTES
from ..errors import TrainError
from .task_registry import ExampleRun, Task, task

EVAL_WINDOWS = 1024  # held-out windows a language model is evaluated on (the first ones, always the same)


@task
class LanguageModelling(Task):
    name = "lm"
    summary = "cross-entropy of every next byte; bits per byte beside the unigram baseline"
    trains_on = "--data text"
    inputs = "tokens"
    model_name = "language model"
    data_kinds = (NEXT_BYTES,)
    columns = ("test_loss", "test_bits_per_byte", "test_unigram_loss")
    metric = "test_loss"
    maximize = False
    example = ExampleRun("causal-crate-bytes", "text", ("sizes.context=16", "sizes.d=16", "sizes.heads=2", "sizes.depth=1"))

    def check(self, spec: Any, data) -> None:
        super().check(spec, data)
        self.check_input(spec)
        if len(spec.input.shape) != 1:
            raise TrainError(f"spec '{spec.name}' does not take token ids (input: shape [N], dtype int64), so it is "
                             "no language model")
        vocabs = [step.args.get("vocab") for _, _, _, step in spec.stages() if "vocab" in step.args]
        if any(isinstance(v, int) and v < 256 for v in vocabs):
            raise TrainError(f"spec '{spec.name}' has a vocabulary of {min(vocabs)}; byte-level text needs 256 "
                             "(declare sizes.vocab and it is set from the data)")

    def loss(self, outputs, x, y, *, model, smoothing=0.0):
        import torch.nn.functional as F

        from ..modules.precision import float32

        return F.cross_entropy(float32(outputs["output"]).flatten(0, 1), y.flatten(), label_smoothing=smoothing)

    def evaluate(self, model, data, settings, *, top_k=None):
        """Held-out cross-entropy per byte (nats and bits) on the first windows, and the unigram baseline."""
        import math

        from .held_out import evaluating, test_batches

        count = min(len(data.test), EVAL_WINDOWS)
        loss_sum = 0.0
        with evaluating(model, settings.seed) as device:
            for x, y in test_batches(data, settings, device, size=64, count=count):
                loss_sum += self.loss(model(x), x, y, model=model).item() * len(x)
        loss = loss_sum / count
        return {"test_loss": loss, "test_bits_per_byte": loss / math.log(2), "test_unigram_loss": data.unigram_loss}
