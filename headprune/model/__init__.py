"""The model layer: a transformer's attention heads and everything that acts on them directly.

Read bottom-up (each line imports only the lines below it; pyproject.toml's import contract keeps it so):

    export.py     stock exports any runtime loads: masked (weights zeroed) and uniform cuts; nearest_uniform
    onnx_export.py  the cut model as one ONNX graph for onnxruntime, checked there; timing two graphs
    loading.py    load_model / save_pruned; named models (the demos register themselves)
    capture.py    attention probabilities under any attention implementation, one layer at a time if asked
    sizes.py      parameter accounting: what a model holds, what a mask would leave
    layers.py     run the model from layer l up (stand-ins keep every layer's list position)
    gating.py     THE one place heads are gated (a hook on each O projection's input)
    surgery.py    THE one place heads are cut (Q/K/V rows, O columns; grouped-query layouts)
    tokenizer.py  a tokenizer fitted to its model: pad rule, context length
    device.py     device choice, dtypes, accelerate device maps
    arch/         where each family keeps its heads: adapters, one registry
    mask.py       HeadMask: which heads are kept
    task.py       what the output head computes (classification, regression, lm): losses, metric direction
    hooks.py      THE one owner of hooks, forward wrappers, stand-ins and hook-free private copies

The names most callers need are importable from here: ``from headprune.model import load_model, HeadMask, ...``.
"""

from .capture import AttentionMaps, capture_attention, stream_attention
from .gating import gate_heads
from .hooks import structural_copy
from .loading import LoadedModel, load_model, save_pruned
from .mask import HeadMask
from .surgery import prune_model

__all__ = ["AttentionMaps", "HeadMask", "LoadedModel", "capture_attention", "gate_heads", "load_model",
           "prune_model", "save_pruned", "stream_attention", "structural_copy"]
