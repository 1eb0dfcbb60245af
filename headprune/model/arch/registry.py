"""The registry of model families: each family is a detector that recognises a model *from its modules* (classes
and attributes, never the model's name) and returns a :class:`~headprune.model.arch.base.ModelAdapter`, or None.

Adding a family = one ``@family(...)`` function in one module of this package (imported by ``arch/__init__``,
whose import order is the detection order); nothing else in headprune changes.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ...errors import ModelLoadError, UnsupportedArchitecture
from .base import ModelAdapter

Detector = Callable[[nn.Module], "ModelAdapter | None"]


class Family:
    def __init__(self, name: str, examples: str, detect: Detector):
        self.name, self.examples, self.detect = name, examples, detect


FAMILIES: list[Family] = []


def family(name: str, examples: str) -> Callable[[Detector], Detector]:
    """Register ``detect`` as the detector of family ``name`` (``examples``: the model types it covers)."""

    def register(detect: Detector) -> Detector:
        FAMILIES.append(Family(name, examples, detect))
        return detect

    return register


def supported() -> str:
    """Human-readable list of the supported families."""
    return "; ".join(f"{f.name} ({f.examples})" for f in FAMILIES)


def adapt(model: nn.Module) -> ModelAdapter:
    """Build the adapter for ``model`` (a classifier, causal LM or base model of a supported family).

    Raises UnsupportedArchitecture, naming the model's type and the supported families; ModelLoadError when the
    model is of a known family but its weights do not have the shapes its head counts and layout say
    (``AttentionBlock.check_shapes``): cutting it would slice the wrong rows.
    """
    for fam in FAMILIES:
        adapter = fam.detect(model)
        if adapter is not None:
            adapter.family = fam.name
            problems = [p for p in (b.check_shapes() for b in adapter.blocks) if p]
            if problems:
                raise ModelLoadError(f"This {fam.name} model's weights do not match its configuration: {problems[0]}"
                                     f"{f' (and {len(problems) - 1} more blocks)' if len(problems) > 1 else ''}. "
                                     "Accepted: weights of the shapes its config.json describes (a checkpoint saved "
                                     "with its own config).")
            return adapter
    model_type = str(getattr(getattr(model, "config", None), "model_type", "unknown"))
    raise UnsupportedArchitecture(
        f"Unsupported architecture: model type '{model_type}' ({type(model).__name__}); headprune cannot "
        f"find its attention heads. Supported families: {supported()}.")
