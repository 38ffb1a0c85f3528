"""Masked language modelling (BERT; Devlin et al. 2019, Sec. 3.1 "Task #1: Masked LM" and App. A.1).

A bidirectional network reads a window ``[CLS] t_1 .. t_{N-2} [SEP]`` in which some tokens were hidden, and
predicts the original token at every hidden position. BERT's rule, drawn anew for every batch:

* each position that is not a special token ([CLS], [SEP], [PAD], ...) is **chosen** with probability 0.15;
* of the chosen positions, 80% are replaced by ``[MASK]``, 10% by a random token and 10% kept as they are;
* the loss is the cross-entropy at the chosen positions only (the mean over the batch's chosen tokens).

The draws, in this order, from one generator seeded by the run's seed, the step, the process and the
micro-batch: ``u = rand(B, N)`` (chosen where ``u < 0.15`` and not special), ``v = rand(B, N)`` (``[MASK]``
where ``v < 0.8``, a random token where ``0.8 <= v < 0.9``, kept otherwise), ``r = randint(R, (B, N))`` (the
random token: the ``r``-th of the ``R`` tokens that are not special; BERT's code draws from the whole
vocabulary, specials included, which this leaves out). Positions are chosen independently (as Hugging Face's
``DataCollatorForLanguageModeling``), where BERT's own data preparation picked exactly round(15%) of each
sequence.

Evaluation: on the first :data:`EVAL_WINDOWS` test windows, with positions and replacements drawn once from
the run's seed (the same at every evaluation), the loss and the accuracy at the chosen positions, beside the
unigram model's loss (the training split's token frequencies, which ignore the context) and its accuracy
(always guessing the most frequent token).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..data.set_registry import TOKENIZED_TEXT
from ..errors import TrainError
from .task_registry import ExampleRun, Session, Task, task

if TYPE_CHECKING:
    import torch

CHOSEN = 0.15  # BERT's masking rate
MASKED, RANDOM = 0.8, 0.1  # of the chosen: [MASK], a random token (the rest kept)
EVAL_WINDOWS = 1024  # held-out windows evaluated (the first ones, always the same)


@task
class MaskedLanguageModelling(Task):
    name = "mlm"
    heads = ("mlm_head",)
    summary = "BERT's masked language modelling: 15% of tokens chosen (80% [MASK], 10% random, 10% kept), predicted"
    trains_on = "tokenized text (--data bytes:text, wordpiece:text, bpe:text or KIND:folder:PATH)"
    inputs = "tokens"
    model_name = "masked language model"
    data_kinds = (TOKENIZED_TEXT,)
    columns = ("test_mlm_loss", "test_mlm_accuracy", "test_unigram_loss", "test_unigram_accuracy")
    metric = "test_mlm_loss"
    maximize = False
    logged = ("mlm_accuracy",)
    example = ExampleRun(
        "crate-bert-mini", "bytes:text", ("sizes.context=16", "sizes.d=16", "sizes.heads=2", "sizes.depth=1")
    )

    def check(self, spec: Any, data) -> None:
        super().check(spec, data)
        self.check_input(spec)
        causal = [step.name for _, _, _, step in spec.stages() if step.args.get("causal")]
        if causal:
            raise TrainError(
                f"spec '{spec.name}' masks later tokens ({', '.join(causal)}: causal: true); a masked "
                "language model reads the whole window (see specs/crate-bert.yaml)"
            )
        if getattr(data, "tokenizer", None) is None:
            raise TrainError(
                f"data set '{data.name}' has no tokenizer with a [MASK] token; task mlm trains on {self.trains_on}"
            )

    def loss(self, outputs, x, y, *, model, smoothing=0.0):
        raise TrainError("task mlm's loss needs the masking of the batch: it is computed by its session")

    def session(self, model: Any, settings, data) -> Session:
        return MaskingSession(self, model, settings, data)

    def evaluate(self, model, data, settings, *, top_k=None):
        import torch

        from ..seeds import step_seed
        from .held_out import evaluating, test_batches

        tokenizer = data.tokenizer
        count = min(len(data.test), EVAL_WINDOWS)
        loss_sum, correct, chosen_total, targets = 0.0, 0, 0, []
        with evaluating(model, settings.seed) as device:
            generator = torch.Generator(device=device).manual_seed(step_seed(settings.seed, "mlm-evaluation"))
            for x, y in test_batches(data, settings, device, size=64, count=count):
                inputs, chosen = mask_tokens(x, tokenizer, generator)
                loss, hits, n = _scored(model(inputs)["output"], y, chosen)
                loss_sum, correct, chosen_total = loss_sum + loss.item() * n, correct + hits, chosen_total + n
                targets.append(y[chosen].cpu())
        baseline_loss, baseline_accuracy = unigram_scores(data, torch.cat(targets))
        return {
            "test_mlm_loss": loss_sum / max(chosen_total, 1),
            "test_mlm_accuracy": correct / max(chosen_total, 1),
            "test_unigram_loss": baseline_loss,
            "test_unigram_accuracy": baseline_accuracy,
        }


class MaskingSession(Session):
    """A masked-LM run: each (micro-)batch masked by BERT's rule from its own seed, the loss where it was."""

    logged = MaskedLanguageModelling.logged

    def __init__(self, task: Task, model: Any, settings, data) -> None:
        super().__init__(task, model, settings, data)
        self.measured: dict[str, float] = {}

    def loss(self, net, model, x, y, step, ema=None):
        import torch

        generator = torch.Generator(device=x.device).manual_seed(self.seed("mlm", step, x))
        inputs, chosen = mask_tokens(x, self.data.tokenizer, generator)
        logits = net(inputs)["output"]
        loss, hits, n = _scored(logits, y, chosen)
        self.measured = {"mlm_accuracy": hits / max(n, 1)}
        return loss, logits

    def logs(self) -> dict[str, float]:
        return dict(self.measured)


def mask_tokens(
    x: "torch.Tensor", tokenizer: Any, generator: "torch.Generator"
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """BERT's masking of the token ids ``x`` ``(B, N)`` (the module docstring's rule and draws): the inputs with
    the chosen positions replaced, and the chosen positions ``(B, N)`` bool."""
    import torch

    special = torch.tensor(sorted(tokenizer.specials), device=x.device)
    ids = torch.arange(tokenizer.size, device=x.device)
    ordinary = ids[~torch.isin(ids, special)]
    u = torch.rand(x.shape, generator=generator, device=x.device)
    v = torch.rand(x.shape, generator=generator, device=x.device)
    r = torch.randint(len(ordinary), x.shape, generator=generator, device=x.device)
    chosen = (u < CHOSEN) & ~torch.isin(x, special)
    inputs = torch.where(chosen & (v < MASKED), torch.full_like(x, tokenizer.mask), x)
    inputs = torch.where(chosen & (v >= MASKED) & (v < MASKED + RANDOM), ordinary[r], inputs)
    return inputs, chosen


def _scored(logits: "torch.Tensor", y: "torch.Tensor", chosen: "torch.Tensor") -> tuple["torch.Tensor", int, int]:
    """The mean cross-entropy at the chosen positions (0 with a gradient when none is), the right guesses there
    and their number."""
    import torch.nn.functional as F

    from ..modules.precision import float32

    picked = float32(logits)[chosen]  # (n, V)
    n = int(chosen.sum())
    if n == 0:
        return logits.sum() * 0.0, 0, 0
    return F.cross_entropy(picked, y[chosen]), int((picked.argmax(-1) == y[chosen]).sum()), n


def unigram_scores(data: Any, targets: "torch.Tensor") -> tuple[float, float]:
    """The unigram model's loss (add-one counts of the training split's tokens) and its accuracy (the most
    frequent token always) on ``targets``, the tokens hidden at evaluation."""
    import torch

    counts = torch.bincount(data.train.tokens.flatten(), minlength=data.tokenizer.size).double() + 1
    for special in data.tokenizer.specials:
        counts[special] = 1.0
    log_p = (counts / counts.sum()).log()
    if len(targets) == 0:
        return float("nan"), float("nan")
    return float(-log_p[targets].mean()), float((targets == counts.argmax()).double().mean())
