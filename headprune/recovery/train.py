"""Recovery after pruning: train what is left of a pruned model, with the pruned heads kept pruned.

Which model is trained (``RecoveryRun.mode``)
    cut    the physically cut model (``surgery.prune_model`` on a copy): the pruned heads' parameters do not exist,
           so nothing can bring them back, and every step is as cheap as the smaller model. Used for the
           ``headprune`` and ``uniform`` exports and for a folder written by ``prune`` (its cut heads are gone).
    gated  the original architecture under headprune's gates (``gating.gate_heads``, a 0 gate on each pruned
           head's context before O), used where the mask cannot be cut: the ``masked`` export (original
           architecture) and weights offloaded by accelerate. The pruned heads' O columns, Q rows and the K/V rows
           no kept head reads are zeroed first (``export.zero_pruned_heads``). Their gradient is then exactly 0
           (the gate multiplies their context, and so every path through them, by 0) and AdamW leaves a parameter
           with zero value and zero gradient at zero (weight decay of 0 is 0, first and second moments stay 0);
           after every optimizer step and after a LoRA merge they are zeroed again all the same, so they stay at
           zero whatever the optimizer or the merge wrote. LoRA in gated mode adapts Q/K/V only: an adapter on O
           would read the ungated context beside the gated base layer.

Engine: transformers ``Trainer`` (AdamW, linear warm-up and decay, gradient clipping at 1, seeded sampling,
per-epoch checkpoints with optimizer, scheduler and RNG states, ``resume_from_checkpoint``), with a
``compute_loss`` that uses headprune's task losses (``model.task.Task.loss``) and, for distillation, the KL term of
``spec.py``; callbacks report progress and losses and let a progress callback raise ``Cancelled`` between steps.
The batch size is the effective one: the memory planner (``model.memory``, a "gradient" pass) gives the rows a
micro-batch may hold and the rest is gradient accumulation. peft (the ``recover`` extra) is imported only for LoRA.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..data import TextDataset, data_role, make_batches, model_inputs
from ..errors import Cancelled
from ..estimate import TimeEstimate, device_name
from ..model.arch import adapt
from ..model.device import resolve_device
from ..model.export import zero_pruned_heads
from ..model.gating import gate_heads
from ..model.mask import HeadMask
from ..model.memory import plan_for
from ..model.surgery import prune_model
from ..model.task import IGNORE_INDEX, Task, task_of
from .spec import RecoveryError, RecoverySpec
from .workdir import SPEC_FILE, check_work_dir

Progress = Callable[[float, str], None]
MODES = ("cut", "gated")


# -- data ------------------------------------------------------------------------------------------------------

class Rows(torch.utils.data.Dataset):
    """One tokenized row per item (``make_batches`` with batches of one: its LM labels and truncation rules)."""

    def __init__(self, tokenizer, ds: TextDataset, max_length: int):
        self.rows = [{k: v[0] for k, v in model_inputs(b).items()} | {"labels": b["labels"][0]}
                     for b in make_batches(tokenizer, ds, 1, max_length, sort_by_length=False)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def collate(rows: list[dict], pad_id: int) -> dict:
    """Rows padded on the right to the longest: input ids with ``pad_id``, masks with 0, LM labels with -100."""
    width = max(len(r["input_ids"]) for r in rows)
    out = {}
    for key in rows[0]:
        if rows[0][key].ndim == 0:
            out[key] = torch.stack([r[key] for r in rows])
            continue
        fill = {"input_ids": pad_id, "labels": IGNORE_INDEX}.get(key, 0)
        out[key] = torch.stack([F.pad(r[key], (0, width - len(r[key])), value=fill) for r in rows])
    return out


# -- losses ----------------------------------------------------------------------------------------------------

def distill_kl(task: Task, student: torch.Tensor, teacher: torch.Tensor, batch: dict, temperature: float):
    """T² · KL(softmax(z_t / T) ‖ softmax(z_s / T)): mean over rows (classifier) or over real positions (LM)."""
    t = temperature
    log_s = F.log_softmax(student.float() / t, dim=-1)
    log_t = F.log_softmax(teacher.float() / t, dim=-1)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1)          # (B,) or (B, T)
    if task.is_lm:
        real = batch["attention_mask"].to(kl.device).bool()
        kl = kl[real]
    return t * t * kl.mean()


def recovery_loss(spec: RecoverySpec, task: Task, logits: torch.Tensor, batch: dict,
                  teacher_logits: torch.Tensor | None = None) -> torch.Tensor:
    """The task loss, or (1 − α) · task + α · T² · KL with a teacher (``spec.py``)."""
    loss = task.loss(logits, batch)
    if teacher_logits is None:
        return loss
    return (1 - spec.alpha) * loss + spec.alpha * distill_kl(task, logits, teacher_logits, batch, spec.temperature)


# -- teacher ---------------------------------------------------------------------------------------------------

def teacher_problem(student_config, teacher_config) -> str | None:
    """Why a teacher cannot distil into the student, or None: one is a language model and the other a classifier,
    the families differ (the teacher reads the student's batches: its token ids and input names), the vocabulary
    sizes differ (any task: an id past the teacher's vocabulary does not exist there), or a classifier's label
    count differs. Takes configs (objects or config.json dicts), so a teacher folder can be refused before either
    model loads."""
    def get(config, key):
        return config.get(key) if isinstance(config, dict) else getattr(config, key, None)

    def labels(config):
        id2label = get(config, "id2label")
        return len(id2label) if id2label else get(config, "num_labels")

    def lm(config):
        return any(m in " ".join(get(config, "architectures") or []) for m in ("ForCausalLM", "LMHeadModel"))

    def kind(config):
        return "a language model" if lm(config) else "a classifier"

    if lm(student_config) != lm(teacher_config):
        return f"the teacher is {kind(teacher_config)} and the student {kind(student_config)}"
    st, tt = get(student_config, "model_type"), get(teacher_config, "model_type")
    if st and tt and st != tt:
        return f"the families differ (a {tt} teacher, a {st} student)"
    sv, tv = get(student_config, "vocab_size"), get(teacher_config, "vocab_size")
    if sv != tv:
        return f"the vocabularies differ ({tv} tokens in the teacher, {sv} in the student)"
    if not lm(student_config) and labels(student_config) != labels(teacher_config):
        return f"the label counts differ ({labels(teacher_config)} in the teacher, {labels(student_config)} in " \
               "the student)"
    return None


def check_teacher(student: nn.Module, student_tokenizer, teacher: nn.Module, teacher_tokenizer) -> None:
    """Refuse a teacher whose outputs cannot be compared with the student's: label count, vocabulary size, or
    (language models) a tokenizer mapping tokens to other ids. Raises RecoveryError."""
    problem = teacher_problem(student.config, teacher.config)
    if problem is None and teacher_tokenizer is not None and student_tokenizer is not None \
            and teacher_tokenizer.get_vocab() != student_tokenizer.get_vocab():
        problem = "the tokenizers map tokens to different ids"
    if problem:
        raise RecoveryError(f"The teacher cannot be distilled from: {problem}. Accepted: a teacher of the "
                            "student's family, tokenizer and vocabulary (and label set, for a classifier), such as "
                            "the model before pruning (the default).")


# -- the Trainer -----------------------------------------------------------------------------------------------

class _RecoveryTrainer(Trainer):
    """``Trainer`` with headprune's loss (and the distillation term) in ``compute_loss``."""

    def __init__(self, *args, recovery_spec: RecoverySpec, task: Task, teacher: nn.Module | None, **kwargs):
        super().__init__(*args, **kwargs)
        self.recovery_spec, self.task, self.teacher = recovery_spec, task, teacher

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(**model_inputs(inputs)).logits
        teacher_logits = None
        if self.teacher is not None:
            with torch.no_grad():
                teacher_logits = self.teacher(**model_inputs(inputs)).logits
        loss = recovery_loss(self.recovery_spec, self.task, logits, inputs, teacher_logits)
        return (loss, logits) if return_outputs else loss


class _Report(TrainerCallback):
    """Progress, losses and cancel between steps; in gated mode, the pruned heads zeroed after every step."""

    def __init__(self, progress: Progress | None, on_loss: Callable[[int, float], None] | None,
                 keep_zero: Callable[[], None] | None):
        self.progress, self.on_loss, self.keep_zero = progress, on_loss, keep_zero
        self.losses: list[tuple[int, float]] = []

    def on_step_end(self, args, state, control, **kwargs):
        if self.keep_zero is not None:
            self.keep_zero()
        if self.progress is not None:   # may raise Cancelled: the run stops here, the last checkpoint stays
            last = f", loss {self.losses[-1][1]:.4f}" if self.losses else ""
            self.progress(state.global_step / max(state.max_steps, 1),
                          f"step {state.global_step}/{state.max_steps}{last}")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append((int(state.global_step), float(logs["loss"])))
            if self.on_loss is not None:
                self.on_loss(int(state.global_step), float(logs["loss"]))


# -- a run -----------------------------------------------------------------------------------------------------

@dataclass
class RecoveryResult:
    """A finished run: the trained model (LoRA merged; cut, or uncut with the pruned heads zeroed) and its log."""

    model: nn.Module
    mode: str
    mask: HeadMask | None
    losses: list[tuple[int, float]]
    steps: int
    seconds: float
    trainable_parameters: int
    parameters: int
    resumed_from: str | None = None
    plan: dict = field(default_factory=dict)


def lora_targets(model: nn.Module, with_output: bool) -> list[str]:
    """Full module names of every block's Q/K/V projections (one fused module where fused), and O if asked."""
    adapter = adapt(model)
    wanted = {id(m) for b in adapter.blocks if b.kept
              for m in (b.query, b.key, b.value, *((b.output,) if with_output else ()))}
    return [name for name, module in model.named_modules() if id(module) in wanted]


def silence_dropout(model: nn.Module) -> Callable[[], None]:
    """Set every dropout of ``model`` to 0 (``nn.Dropout`` modules, and the float ``attention_dropout`` that
    Llama-style attention passes to sdpa); returns the function that puts the original rates back."""
    saved = []
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            saved.append((module, "p", module.p))
        elif isinstance(getattr(module, "attention_dropout", None), float):
            saved.append((module, "attention_dropout", module.attention_dropout))
    for module, name, _ in saved:
        setattr(module, name, 0.0)

    def restore() -> None:
        for module, name, rate in saved:
            setattr(module, name, rate)
    return restore


def trainable_counts(model: nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters) of ``model``."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


class RecoveryRun:
    """One recovery run, prepared: the student to train, its data and the batch plan (nothing trained yet).

    Parameters
    ----------
    spec : the hyper-parameters (``RecoverySpec``).
    model : the model as loaded (dense, or already cut by ``prune``); never changed: the student is a copy.
    tokenizer : its tokenizer.
    mask : the heads to prune (original ids), or None (train the model as loaded, e.g. a pruned folder).
    train : training rows, labels aligned to the model (``data.align_labels``) or LM text.
    work_dir : the folder of per-epoch checkpoints (``--resume`` continues from the last one).
    mode : "cut" | "gated" | None (cut unless ``gated_export`` or weights are offloaded).
    teacher : the frozen dense model for distillation (default: ``model`` itself when it is uncut).
    gated_export : the output keeps the original architecture (format masked): train gated.
    memory_budget : as ``model.memory.resolve_budget`` reads it (micro-batch rows of a gradient pass).
    """

    def __init__(self, spec: RecoverySpec, model: nn.Module, tokenizer, mask: HeadMask | None, train: TextDataset,
                 *, work_dir: str | Path, mode: str | None = None, teacher: nn.Module | None = None,
                 teacher_tokenizer=None, gated_export: bool = False, memory_budget: int | str | float | None = None,
                 task: Task | None = None):
        if len(train) == 0:
            raise RecoveryError("The training data has no rows. Accepted: --train-data with at least one row.")
        self.spec, self.tokenizer, self.work_dir = spec, tokenizer, Path(work_dir)
        self.task = task or task_of(model)
        if not self.task.is_lm and train.labels is None:
            raise RecoveryError(f"{train.source} has no labels, but the model is a classifier: its training data "
                                "needs a label column.")
        already_cut = any(b.kept != list(range(b.n_heads)) for b in adapt(model).blocks)
        offloaded = any(p.device.type == "meta" for p in model.parameters())
        self.mode = mode or ("gated" if (gated_export or offloaded) and mask is not None else "cut")
        if self.mode not in MODES:
            raise RecoveryError(f"Unknown recovery mode {self.mode!r}; accepted: {', '.join(MODES)}.")
        if self.mode == "gated" and already_cut:
            raise RecoveryError("This model already has heads cut out, so it can only be trained cut and written "
                                "as a headprune checkpoint (format 'headprune').")
        self.mask = mask
        set_seed(spec.seed)
        if self.mode == "cut":
            self.student = prune_model(model, mask) if mask is not None else copy.deepcopy(model)
        else:
            self.student = zero_pruned_heads(copy.deepcopy(model), mask)
        self.adapter = adapt(self.student)   # module references survive peft's wrapping (O is never replaced)
        self.restore_dropout = (lambda: None) if spec.dropout else silence_dropout(self.student)
        self.teacher = None
        if spec.distill:
            if teacher is None and already_cut:
                raise RecoveryError("Distillation needs the dense model as teacher, but this model already has "
                                    "heads cut out: pass --teacher with the model before pruning.")
            self.teacher = teacher if teacher is not None else model
            check_teacher(self.student, tokenizer, self.teacher, teacher_tokenizer or tokenizer)
            self.teacher.eval()
        self.device = next(model.parameters()).device if not offloaded else resolve_device("auto")
        if spec.lora:
            self.student = self._with_lora(self.student)
        elif spec.freeze_embeddings:
            self.student.get_input_embeddings().weight.requires_grad_(False)
        self.trainable, self.parameters = trainable_counts(self.student)
        self.rows = Rows(tokenizer, train, spec.max_length)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        longest = max(len(r["input_ids"]) for r in self.rows.rows)
        micro = plan_for(self.adapter.model, memory_budget, self.device).rows("gradient", longest, spec.batch_size)
        self.micro_batch = int(micro)
        self.accumulation = math.ceil(spec.batch_size / self.micro_batch)
        per_epoch = math.ceil(len(self.rows) / (self.micro_batch * self.accumulation))
        self.total_steps = spec.steps or spec.epochs * per_epoch
        self.steps_per_epoch = per_epoch

    def _with_lora(self, model: nn.Module) -> nn.Module:
        """``model`` with peft LoRA adapters on the kept heads' projections (module doc: no O adapter when gated)."""
        from peft import LoraConfig, TaskType, get_peft_model  # deferred: peft is the optional "recover" extra
        spec = self.spec
        config = LoraConfig(r=spec.lora_rank, lora_alpha=spec.lora_alpha or 2 * spec.lora_rank, lora_dropout=0.0,
                            target_modules=lora_targets(model, with_output=self.mode == "cut"),
                            task_type=TaskType.CAUSAL_LM if self.task.is_lm else TaskType.SEQ_CLS)
        return get_peft_model(model, config)

    def plan(self) -> dict:
        """The batch plan and what is trained, for the run file."""
        return {"mode": self.mode, "micro_batch": self.micro_batch, "accumulation": self.accumulation,
                "effective_batch": self.micro_batch * self.accumulation, "steps": self.total_steps,
                "steps_per_epoch": self.steps_per_epoch, "train_rows": len(self.rows),
                "trainable_parameters": self.trainable, "parameters": self.parameters,
                "device": str(self.device)}

    # -- zeroing (gated mode) ----------------------------------------------------------------------------------
    def _keep_zero(self) -> None:
        """Zero the pruned heads' weights again (gated mode): on the base weights, beside any LoRA adapter."""
        if self.mode == "gated" and self.mask is not None:
            zero_pruned_heads(self.adapter.model, self.mask)

    # -- estimate ----------------------------------------------------------------------------------------------
    def estimate(self) -> TimeEstimate:
        """Expected duration: one timed forward + backward of a micro-batch (and the teacher's forward) × the
        micro-batches of every step. Good to a factor of about two (one batch timed; lengths vary)."""
        batch = collate([self.rows[i] for i in range(min(self.micro_batch, len(self.rows)))], self.pad_id)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        self.student.to(self.device)
        with self.gates():
            self._time_step(batch)  # warm-up: first-call allocations are not the rate
            seconds = self._time_step(batch)
        self.student.zero_grad(set_to_none=True)
        per_step = seconds * self.accumulation
        rows, length = batch["input_ids"].shape
        return TimeEstimate(per_step * self.total_steps, f"{self.spec.method} recovery ({self.total_steps} steps)",
                            device_name(self.student),
                            f"one forward + backward of {rows} rows × {length} tokens: {seconds:.2f} s")

    def _time_step(self, batch: dict) -> float:
        start = time.perf_counter()
        teacher_logits = None
        if self.teacher is not None:
            with torch.no_grad():
                teacher_logits = self.teacher(**model_inputs(batch)).logits
        loss = recovery_loss(self.spec, self.task, self.student(**model_inputs(batch)).logits, batch, teacher_logits)
        loss.backward()
        return time.perf_counter() - start

    # -- the run -----------------------------------------------------------------------------------------------
    def _check_work_dir(self, resume: bool) -> str | None:
        """The checkpoint to resume from (None: a fresh run); refuses a work folder of another run."""
        wanted = {**self.spec.to_json(), "mode": self.mode, "mask": self.mask.to_json() if self.mask else None}
        last = check_work_dir(self.work_dir, resume=resume, wanted=wanted, config=self.student.config.to_dict())
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / SPEC_FILE).write_text(json.dumps(wanted, indent=1), encoding="utf-8")
        return last

    def arguments(self) -> TrainingArguments:
        spec = self.spec
        return TrainingArguments(
            output_dir=str(self.work_dir), num_train_epochs=spec.epochs, max_steps=spec.steps or -1,
            learning_rate=spec.learning_rate, weight_decay=spec.weight_decay, lr_scheduler_type="linear",
            warmup_steps=int(spec.warmup * self.total_steps), max_grad_norm=1.0,
            per_device_train_batch_size=self.micro_batch, gradient_accumulation_steps=self.accumulation,
            seed=spec.seed, data_seed=spec.seed, save_strategy="epoch", eval_strategy="no", logging_steps=1,
            report_to=[], disable_tqdm=True, remove_unused_columns=False, dataloader_num_workers=0,
            use_cpu=self.device.type == "cpu", log_level="error")

    def run(self, *, resume: bool = False, progress: Progress | None = None,
            on_loss: Callable[[int, float], None] | None = None) -> RecoveryResult:
        """Train and finish: the recovered model (LoRA merged, pruned heads absent or zero). A ``Cancelled``
        raised by ``progress`` between steps propagates: the checkpoints of finished epochs stay in ``work_dir``."""
        return self.finish(*self.train(resume=resume, progress=progress, on_loss=on_loss))

    def train(self, *, resume: bool = False, progress: Progress | None = None,
              on_loss: Callable[[int, float], None] | None = None) -> tuple[nn.Module, _Report, Trainer, float]:
        """The training alone: (trained model, peft-wrapped for LoRA and not merged yet, its report, the
        Trainer, seconds). ``finish`` turns them into a RecoveryResult."""
        self.resumed_from = self._check_work_dir(resume)
        report = _Report(progress, on_loss, self._keep_zero if self.mode == "gated" else None)
        trainer = _RecoveryTrainer(model=self.student, args=self.arguments(), train_dataset=self.rows,
                                   data_collator=lambda rows: collate(rows, self.pad_id),
                                   processing_class=self.tokenizer, callbacks=[report],
                                   recovery_spec=self.spec, task=self.task, teacher=self.teacher)
        for noisy in (PrinterCallback, ProgressCallback):   # they print to stdout, where the CLI's JSON goes
            trainer.remove_callback(noisy)
        start = time.perf_counter()
        with self.gates():
            trainer.train(resume_from_checkpoint=self.resumed_from)
        trainer.model.eval()
        return trainer.model, report, trainer, time.perf_counter() - start

    def gates(self):
        """The gates the student trains under: the mask in gated mode, none when cut."""
        return gate_heads(self.adapter.model, self.mask if self.mode == "gated" else None, self.adapter)

    def finish(self, model: nn.Module, report: _Report, trainer: Trainer, seconds: float) -> RecoveryResult:
        """Merge LoRA into the weights (in place), zero the pruned heads again in gated mode, and record."""
        if self.spec.lora:
            model = model.merge_and_unload()
        self.restore_dropout()   # the modules peft wrapped are the same objects: the recovered model gets its rates
        model.eval()
        self._keep_zero()
        return RecoveryResult(model, self.mode, self.mask, report.losses, int(trainer.state.global_step), seconds,
                              self.trainable, self.parameters, self.resumed_from, self.plan())


__all__ = ["MODES", "Progress", "RecoveryResult", "RecoveryRun", "Rows", "Cancelled", "check_teacher", "collate",
           "data_role", "distill_kl", "lora_targets", "recovery_loss", "silence_dropout", "teacher_problem",
           "trainable_counts"]
