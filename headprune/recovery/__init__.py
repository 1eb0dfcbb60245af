"""Recovery after pruning: fine-tune, LoRA or distil what is left of a pruned model, pruned heads kept pruned.

    spec.py    RecoverySpec (method, epochs/steps, lr, batch, seed, LoRA rank, distillation T and α), validated once
    train.py   RecoveryRun (the student: cut or gated; Trainer, memory plan, estimate, checkpoints, resume)
    report.py  metric sets dense / pruned / recovered, the export, the run file's record, recover_cell
"""

from .report import export_recovered, headline_gain, recover_cell, run_record, stage_metrics
from .spec import DEFAULT_LR, METHODS, RecoveryError, RecoverySpec
from .train import (
    MODES,
    RecoveryResult,
    RecoveryRun,
    check_teacher,
    data_role,
    distill_kl,
    lora_targets,
    recovery_loss,
    teacher_problem,
)

__all__ = ["DEFAULT_LR", "METHODS", "MODES", "RecoveryError", "RecoveryResult", "RecoveryRun", "RecoverySpec",
           "check_teacher", "data_role", "distill_kl", "export_recovered", "headline_gain", "lora_targets",
           "recover_cell", "recovery_loss", "run_record", "stage_metrics", "teacher_problem"]
