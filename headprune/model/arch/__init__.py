"""Architecture adapters: where each supported model keeps its attention heads.

    base.py       what every adapter produces: ModelAdapter, AttentionBlock (Q/K/V/O, fused spans, groups)
    registry.py   the one registry of families (@family, adapt, supported)
    encoders.py   BERT family, DistilBERT, ALBERT (tied)
    causal.py     GPT-J, GPT-Neo, OPT, Phi-1/1.5/2, OLMo 2 (norm over all heads), gpt-oss (sinks)
    decoders.py   Llama-style (Llama, Qwen2/3, Mistral, Gemma 3), Phi-3, GPT-2
    modern.py     DeBERTa v1, v2/v3, ModernBERT
    bidirectional.py  MPNet (shared per-head position bias), Longformer (local + global), XLM, Nystromformer
    fused.py      GPT-NeoX / Pythia (fused head-interleaved Q/K/V), the fused decoders' shared builder
    alibi.py      BLOOM, Falcon, MPT (attention in their own code, ALiBi biases sliced per layer after a cut)

Everything else in headprune (gating, surgery, capture, criteria, live evaluation) talks to heads through the
adapter only. The family modules are imported here, in detection order, so that importing ``arch`` registers
them all.
"""

from __future__ import annotations

# causal before decoders: OLMo 2 and gpt-oss also have Llama's q/k/v/o_proj, and their own detector must see them first
# bidirectional before encoders: Longformer and Nystromformer also have BERT's attention.self/output layout
# alibi (which imports fused first) finds its families by attributes no other family has
from . import alibi, bidirectional, causal, decoders, encoders, fused, modern  # noqa: F401  (registration)
from .base import PARTS, AttentionBlock, ModelAdapter, in_features, out_axis, out_features
from .registry import FAMILIES, adapt, family, supported

SUPPORTED = tuple(f.name for f in FAMILIES)

__all__ = ["AttentionBlock", "ModelAdapter", "FAMILIES", "PARTS", "SUPPORTED", "adapt", "family", "supported",
           "in_features", "out_axis", "out_features"]
