"""What a recovery run is asked to do: one keyword-only spec, validated once, before anything loads.

Methods (:data:`METHODS`):
    finetune       every parameter of the kept structure trained (SAP §4.2's "retrain for a few epochs", encoders)
    lora           low-rank adapters (peft) on the kept heads' Q/K/V/O projections, merged on export (decoders,
                   large models); a classifier's head is trained in full (peft's SEQ_CLS ``modules_to_save``)
    distill        full fine-tuning on the task loss plus a temperature-scaled KL to a frozen dense teacher
    lora+distill   LoRA with the distillation loss
Distillation (Hinton et al. 2015): with student logits z_s, teacher logits z_t, temperature T and weight α,
    L = (1 − α) · L_task + α · T² · KL(softmax(z_t / T) ‖ softmax(z_s / T))
(the T² keeps the soft term's gradient scale independent of T); for a language model the KL is averaged over
every real (non-padding) position.

The defaults are a recipe measured to recover (issue 29 item 9; ``benchmarks/bench_recover.py``, numbers in the
README): distillation from the dense model (α 0.5, T 2), peak learning rate 2e-4 for full training (1e-3 for LoRA)
with 10 % linear warm-up then linear decay to zero, batches of 32, word embeddings frozen, dropout off, one pass over
the training rows. Why each departs from plain fine-tuning at the fine-tuning rate: the pruned model is not far from
a good one, so the dense model's logits (its confidences as well as its decisions) are a denser target than the
labels; a short run needs a rate several times the original fine-tuning's (5e-5) to move within a few hundred steps;
dropout on top of 50–75 % of the heads removed is noise the short run cannot average out; frozen word embeddings are
half a small encoder's parameters and most of an optimizer step's time, and pruning did not change them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import HeadpruneError
from ..limits import POSITIVE, ROWS_PER_BATCH, TOKENS_PER_ROW, UNIT, Interval

METHODS = ("finetune", "lora", "distill", "lora+distill")
DEFAULT_LR = {"finetune": 2e-4, "distill": 2e-4, "lora": 1e-3, "lora+distill": 1e-3}   # peak, after warm-up
WARMUP = Interval(0, 1, closed="left")     # share of the steps with a rising learning rate: [0, 1)
# upper bounds, each with its reason: a number past them reached the Trainer as an OverflowError or a run of ages
EPOCHS = Interval(1, 10_000, integer=True, why="passes over the training rows, run one after another")
STEPS = Interval(1, 100_000_000, integer=True, why="optimizer steps, run one after another")
LORA_RANK = Interval(1, 65_536, integer=True, why="the rank of an adapter is at most its layer's width")
MAX_LENGTH = Interval(2, TOKENS_PER_ROW.high, integer=True, why="tokens per row; rows are cut to the model's context")


class RecoveryError(HeadpruneError):
    """A recovery setting, teacher or run folder that cannot be used (the message says what is accepted)."""


@dataclass(frozen=True, kw_only=True)
class RecoverySpec:
    """Hyper-parameters of one recovery run (``lr`` None: the method's default, :data:`DEFAULT_LR`).

    ``epochs`` passes over the training rows, or ``steps`` optimizer steps when given (it wins over epochs).
    ``batch_size`` is the effective batch: the memory planner may split it into micro-batches whose gradients
    are accumulated (``RecoveryRun.plan``). ``alpha`` and ``temperature`` only matter for distillation,
    ``lora_rank`` / ``lora_alpha`` only for LoRA (alpha None: 2 × rank). ``freeze_embeddings`` keeps the input
    embeddings fixed in full fine-tuning (as the demo's own fine-tuning does): on a small encoder they are half the
    parameters and most of an optimizer step's time (a tied LM head stays fixed with them; LoRA ignores it).
    ``dropout`` keeps the model's dropout active while training (off by default: every dropout of the student is
    set to 0 for the run and restored after it, so an export keeps the model's own configuration).
    """

    method: str = "distill"
    epochs: int = 1
    steps: int | None = None
    lr: float | None = None
    batch_size: int = 32
    seed: int = 0
    weight_decay: float = 0.01
    warmup: float = 0.1
    lora_rank: int = 8
    lora_alpha: float | None = None
    temperature: float = 2.0
    alpha: float = 0.5
    max_length: int = 128
    freeze_embeddings: bool = True
    dropout: bool = False

    def __post_init__(self):
        if self.method not in METHODS:
            raise RecoveryError(f"Unknown recovery method {self.method!r}. Accepted: {', '.join(METHODS)}.")
        checks = [("epochs", self.epochs, EPOCHS, "passes over the training data"),
                  ("steps", self.steps, STEPS, "optimizer steps"),
                  ("lr", self.lr, POSITIVE, "the learning rate"),
                  ("batch-size", self.batch_size, ROWS_PER_BATCH, "rows per optimizer step"),
                  ("weight-decay", self.weight_decay, Interval(0, None), "AdamW's weight decay"),
                  ("warmup", self.warmup, WARMUP, "share of the steps with a rising learning rate"),
                  ("lora-rank", self.lora_rank, LORA_RANK, "the rank of the LoRA adapters"),
                  ("lora-alpha", self.lora_alpha, POSITIVE, "LoRA's scale numerator"),
                  ("temperature", self.temperature, POSITIVE, "the distillation temperature T"),
                  ("alpha", self.alpha, UNIT, "the weight of the distillation term"),
                  ("max-length", self.max_length, MAX_LENGTH, "tokens per row")]
        for name in ("freeze_embeddings", "dropout"):
            if not isinstance(getattr(self, name), bool):
                raise RecoveryError(f"{name} {getattr(self, name)!r}: must be true or false.")
        for name, value, limit, what in checks:
            problem = None if value is None else limit(value)
            if problem:
                raise RecoveryError(f"--{name} {value}: {what} {problem}.")

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.method]

    @property
    def lora(self) -> bool:
        return self.method.startswith("lora")

    @property
    def distill(self) -> bool:
        return self.method.endswith("distill")

    def to_json(self) -> dict:
        return {**asdict(self), "lr": self.learning_rate,
                "lora_alpha": (self.lora_alpha or 2 * self.lora_rank) if self.lora else None}
