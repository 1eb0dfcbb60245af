"""Head gating: the one place where a head's output is scaled by its gate.

transformers 5 dropped ``head_mask`` (and silently ignores the argument), so headprune gates heads itself: a
forward pre-hook on each block's output projection O multiplies the concatenated per-head context
``[c_1, ..., c_H]`` by ``[m_1 1_{d_h}, ..., m_H 1_{d_h}]`` before O is applied. The context is the same under
``sdpa`` and ``eager`` attention, so the gate works under both. A gate of 0 is exactly what removing the head's
rows of Q/K/V and columns of O does (tests/test_equivalence.py proves it against surgery); soft gates in
[0, 1] are differentiable, and d loss / d gate is Michel et al.'s head importance. A tuned HeadMask (Kwon et al.'s
mask tuning) gates a kept head by its real-valued scale (``HeadMask.gates``).

Weights are never touched: the gate is a named hook (``headprune.model.hooks``) at ``Stage.CHANGE`` on each O
projection, attached on entry and detached on exit. Code that needs the context *before* the gate (live evaluation
caches it) attaches its own hook at :data:`BEFORE_GATE`; code that needs what O receives uses :data:`AFTER_GATE`.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ..errors import MaskError
from .arch import ModelAdapter, adapt
from .hooks import Stage, attached, pre_hook
from .mask import HeadMask

BEFORE_GATE = Stage.EARLY    # a hook on O's input here sees each head's context as the attention computed it
GATE = Stage.CHANGE          # where the gate scales it
AFTER_GATE = Stage.OBSERVE   # a hook here sees what O receives (gated)


def _as_tensor(mask: HeadMask | torch.Tensor) -> torch.Tensor:
    return mask.gates if isinstance(mask, HeadMask) else mask


@contextmanager
def gate_heads(model, mask: HeadMask | torch.Tensor | None, adapter: ModelAdapter | None = None):
    """Within the block, heads of ``model`` are scaled by ``mask`` (n_blocks x n_heads, original head ids).

    ``mask`` may be a tensor that requires grad. ``None`` gates nothing. Heads already removed by surgery are
    simply absent: their gate entries are ignored. A tensor of shape (B, n_blocks, n_heads) gives every example
    of a batch of B its own gates (several ablations batched into one forward pass).
    """
    if mask is None:
        yield model
        return
    adapter = adapter or adapt(model)
    gates = _as_tensor(mask)
    if tuple(gates.shape[-2:]) != adapter.grid_shape or gates.ndim not in (2, 3):
        raise MaskError(f"Mask shape {tuple(gates.shape)} does not fit this model's "
                        f"{adapter.grid_shape[0]}x{adapter.grid_shape[1]} heads (blocks x heads).")
    hooks = []
    for block in adapter.blocks:
        if not block.kept:
            continue
        kept = torch.tensor(block.kept, dtype=torch.long)

        def scale_context(module, args, kwargs, _block=block, _kept=kept):
            context = args[0]
            gate = gates[..., _block.index, :].to(device=context.device)[..., _kept.to(context.device)]
            scale = gate.to(context.dtype).repeat_interleave(_block.head_size, dim=-1)
            if scale.ndim == 2:  # per-example gates: (B, H*d_h) -> (B, 1, ..., H*d_h)
                scale = scale.view(scale.shape[0], *[1] * (context.ndim - 2), scale.shape[1])
            return (context * scale,) + tuple(args[1:]), kwargs

        hooks.append(pre_hook(block.output, scale_context, f"gate block {block.index}", GATE))
    with attached(hooks):
        yield model
