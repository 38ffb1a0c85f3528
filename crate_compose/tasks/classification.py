"""Classification: the cross-entropy of the class, top-1 (and top-k) accuracy on the test split.

The loss is torch's cross-entropy of the logits against class indices ``(B,)`` or, from ``--mixup`` and
``--cutmix``, class probabilities ``(B, classes)``; ``--label-smoothing e`` applies to both
(``(1 - e) y + e / classes``). Half outputs are scored in float32.
"""

from __future__ import annotations

from typing import Any

from ..data.set_registry import IMAGES, LABELED_IMAGES, LABELED_TOKENS
from ..errors import TrainError
from .task_registry import ExampleRun, Task, task


@task
class Classification(Task):
    name = "classify"
    heads = ("classify",)
    summary = "cross-entropy of the class; test accuracy and loss"
    trains_on = "labeled images"
    data_kinds = (LABELED_IMAGES, LABELED_TOKENS)  # images, and token windows (KIND:modules), of a class
    columns = ("test_accuracy", "test_loss")
    metric = "test_accuracy"
    maximize = True
    example = ExampleRun("crate-digits", "digits", ("sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"))
    mixes_labels = True

    def check(self, spec: Any, data) -> None:
        if data.provides == IMAGES and not data.classes:  # images without labels
            raise TrainError(f"data set '{data.name}' has no labels to classify; use --task mae")
        super().check(spec, data)
        from ..building.inspection import inspect

        shape = inspect(spec).output_shape  # from the footprints: no weights
        if len(shape) != 2:
            masks = any(step.primitive == "mask" for step in spec.preprocess)
            hint = "; a spec with a mask step trains with --task mae" if masks else " (crate-compose list tasks)"
            raise TrainError(
                f"spec '{spec.name}' outputs {list(shape)} (a batch of "
                f"{'x'.join(map(str, shape[1:]))}), not one score per class ([B, classes]): task "
                f"classify trains a network whose head ends in a classifier{hint}"
            )

    def loss(self, outputs, x, y, *, model, smoothing=0.0):
        import torch.nn.functional as F

        from ..modules.precision import float32

        return F.cross_entropy(float32(outputs["output"]), y, label_smoothing=smoothing)

    def evaluate(self, model, data, settings, *, top_k=None):
        """Top-1 accuracy and loss; ``top_k``: also the share of examples whose class is among the ``k``
        largest logits (``test_top{k}``)."""
        from .held_out import evaluating, test_batches

        total, correct, among, loss_sum = 0, 0, 0, 0.0
        with evaluating(model, settings.seed) as device:
            for x, y in test_batches(data, settings, device):
                outputs = model(x)
                logits = outputs["output"]
                loss_sum += self.loss(outputs, x, y, model=model).item() * len(x)
                correct += (logits.argmax(-1) == y).sum().item()
                if top_k:
                    among += (logits.topk(top_k, dim=-1).indices == y[:, None]).any(-1).sum().item()
                total += len(x)
        return {
            "test_accuracy": correct / total,
            "test_loss": loss_sum / total,
            **({f"test_top{top_k}": among / total} if top_k else {}),
        }
