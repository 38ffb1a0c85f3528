"""Language modelling: the cross-entropy of every next token of a window of text.

A causal network reads ``N`` tokens and predicts, at every position, the token after it (the target is the
window shifted by one): bytes of ``--data text``, or the ids of any tokenized text set (``KIND:text``,
``KIND:shakespeare``, ``KIND:folder:PATH``: its token streams in next-token windows, :func:`~crate_compose.data.
texts.next_token_data`). The test split reports, on its first :data:`EVAL_WINDOWS` windows (always the same
ones), the cross-entropy per token in nats (``test_loss``: per byte on a byte set) beside the unigram baseline
(``test_unigram_loss``, the training split's token frequencies, also per token) and the bigram baseline
(``test_bigram_loss``, its add-one pair counts, each token given the one before), and, where the ids say how
much text they stand for (every kind but wordpiece: :meth:`~crate_compose.data.text_sets.tokens.Tokenizer.lengths`), the
same nats over the text those tokens decode to: ``test_bits_per_byte`` (bits per UTF-8 byte) and
``test_loss_per_char`` (nats per character), figures that compare across tokenizers.
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
    heads = ("lm_head",)
    summary = (
        "cross-entropy of every next token (a byte, or a tokenized set's id); per token beside the unigram "
        "baseline, per byte and per character"
    )
    trains_on = (
        "--data text or a tokenized text set (KIND:text, KIND:shakespeare, KIND:folder:PATH; KIND bytes, "
        "wordpiece, bpe or gpt2)"
    )
    inputs = "tokens"
    model_name = "language model"
    data_kinds = (NEXT_BYTES,)
    # test_bits_per_byte and test_loss_per_char: not on a wordpiece set (its ids do not say the text's length)
    columns = ("test_loss", "test_bits_per_byte", "test_unigram_loss", "test_loss_per_char", "test_bigram_loss")
    metric = "test_loss"
    maximize = False
    example = ExampleRun(
        "causal-crate-bytes", "text", ("sizes.context=16", "sizes.d=16", "sizes.heads=2", "sizes.depth=1")
    )

    def check(self, spec: Any, data) -> None:
        super().check(spec, data)
        self.check_input(spec)
        if len(spec.input.shape) != 1:
            raise TrainError(
                f"spec '{spec.name}' does not take token ids (input: shape [N], dtype int64), so it is "
                "no language model"
            )
        needed = data.sizes.get("vocab", 256)
        vocabs = [step.args.get("vocab") for _, _, _, step in spec.stages() if "vocab" in step.args]
        if any(isinstance(v, int) and v < needed for v in vocabs):
            raise TrainError(
                f"spec '{spec.name}' has a vocabulary of {min(vocabs)}; the ids of {data.name} need "
                f"{needed} (declare sizes.vocab and it is set from the data)"
            )

    def loss(self, outputs, x, y, *, model, smoothing=0.0):
        import torch.nn.functional as F

        from ..modules.precision import float32

        return F.cross_entropy(float32(outputs["output"]).flatten(0, 1), y.flatten(), label_smoothing=smoothing)

    def evaluate(self, model, data, settings, *, top_k=None):
        """Held-out cross-entropy per token on the first windows, the unigram baseline, and where the ids say how
        much text they stand for, the same nats per byte (in bits) and per character (module docstring)."""
        import math

        from ..data.text_sets.tokens import Tokenizer
        from .held_out import evaluating, test_batches

        lengths = (data.tokenizer or Tokenizer("bytes")).lengths()  # the text set: bytes, no tokenizer
        count = min(len(data.test), EVAL_WINDOWS)
        loss_sum, nats, text = 0.0, 0.0, [0, 0]  # the windows' mean losses, summed; all nats; the text's length
        with evaluating(model, settings.seed) as device:
            for x, y in test_batches(data, settings, device, size=64, count=count):
                loss = self.loss(model(x), x, y, model=model).item()
                loss_sum, nats = loss_sum + loss * len(x), nats + loss * y.numel()
                if lengths is not None:  # the bytes and characters the targets decode to
                    text = [total + int(table[y.cpu()].sum()) for total, table in zip(text, lengths)]
        per_text = {
            "test_bits_per_byte": nats / text[0] / math.log(2) if text[0] else None,
            "test_loss_per_char": nats / text[1] if text[1] else None,
        }
        metrics = {
            "test_loss": loss_sum / count,
            **per_text,
            "test_unigram_loss": data.unigram_loss,
            "test_bigram_loss": data.bigram_loss,
        }
        return {name: metrics[name] for name in self.columns if metrics[name] is not None}
