"""DuoAttention's identification of retrieval heads, as published: gates learned by distillation.

Xiao et al. 2024, "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming Heads"
(arXiv 2410.10819, §3.2; reference code mit-han-lab/duo-attention, ``duo_attn/train.py``, ``duo_attn/patch/llama.py``
``llama_duo_attention_forward_two_way``, ``duo_attn/data.py``, ``duo_attn/utils.py``):

gate         one α per key/value head (grouped-query group), shared by its query heads; the head's output is
             α · full attention + (1 − α) · streaming attention (the first S and last W keys only), α clamped to
             [0, 1] in the forward pass and after every optimizer step; initialised at 1 (``--initial_value``)
frozen model the weights are never trained: only the gates get gradients (``torch.autograd.grad`` on the gates, so
             no gradient lands on a weight of the caller's model, which may be shared)
data         synthetic passkeys in filler text (``duo_attn/data.py``, MultiplePasskeyRetrievalDataset): here the
             calibration rows' tokens are the haystack and a row is ``longctx.passkey_rows_from`` ([BOS] + filler
             + key + filler + key), the needle at depths spread evenly over [0, 1]; a tiny model answers no
             written question, so the question is the key's repeat, as in headprune's passkey task. The rows are
             as long as the median calibration row (a choice, measured: the longest row let heads that read far
             for other reasons win the gates) and the key fills ``key_share`` of a row (3/4: two copies of
             round(3/8 (L - 1)) tokens, at least 6; the reference's keys are short in 1k-32k rows, a choice for
             rows of tens of tokens, measured below)
loss         the L2 error of the final hidden states (the base model's output, after its last norm) between the
             full model and the gated one on the label tokens -- ``((h_full - h_mixed)^2).mean(-1).sum() / n`` as
             in ``train.py``, the labels being the question's key tokens (the reference marks the question and
             answer tokens themselves, unshifted) -- plus ``reg_weight`` · L1 of the gates. The reference's
             ``duo_attn/loss.py`` is not in the published tree we could read; its ``l1_loss`` of the concatenated
             gates is taken here as their mean absolute value (a choice, stated)
optimizer    AdamW, weight decay 0, learning rate ``lr`` with the reference's schedule (linear warm-up over the
             first fifth, linear decay over the last fifth, floor 0.1 of the peak)
deploy       by a threshold (α ≥ τ keeps the whole cache; reference default 0.5) or by a sparsity quantile (the
             share of groups with the highest α; ``plan.top_share``, the reference's ``sparsify_attention_heads``)

The gated forward runs on a private copy (``hooks.structural_copy``) whose config carries the gates
(``config.headprune_duo``); the attention function ``headprune_duo`` is registered with transformers'
``AttentionInterface`` like the plan's restriction (``restrict``). The reference's defaults are for 7B models at
1k-32k tokens (lr 0.1, 1000 steps, S = 64, W = 256, reg 0.05). headprune's (``DEFAULTS``: 30 steps of 4 rows, lr 0.1,
reg 2, key share 3/4, rows of the median calibration length) were chosen by measurement on demo-circuit at S = 1,
W = 4 (docs/explanation/kv-duo.md): at reg 0.05 every gate of layers 0-1 stays at 1 and the plan picks among ties;
with these, the six induction heads (headprune's role detector) are the six highest gates on every seed tried.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

from ..limits import Interval
from ..model.arch import adapt
from ..model.gating import gate_heads
from ..model.hooks import structural_copy
from .longctx import KEY_TOKENS, passkey_rows_from
from .plan import KVPlanError, check_decoder, check_window
from .restrict import base_allowed, repeat_kv, window_allowed

ATTENTION = "headprune_duo"
CONFIG_KEY = "headprune_duo"
STEPS = Interval(1, 100_000, integer=True, why="optimizer steps of the gates")
BATCH = Interval(1, 4096, integer=True, why="passkey rows in one forward pass of the teacher and the gated copy")
# every passkey row of the training is built before the first step (steps x batch of them, each a row of tokens):
# each option inside its limit can still ask for 10**10 rows, so their product has a limit of its own
TRAINING_ROWS = Interval(1, 200_000, integer=True, why="passkey rows built before training: --duo-steps x "
                                                       "--duo-batch")
LR = Interval(0, 10, closed="right", why="the gates' learning rate (reference: 0.1)")
REG = Interval(0, 100, why="weight of the gates' L1 penalty (reference: 0.05)")
THRESHOLD = Interval(0, 1, why="a gate at or above it keeps the whole cache (reference: 0.5)")
KEY_SHARE = Interval(0, 1, closed="right", why="the share of a passkey row the key's two copies fill")
# chosen by measurement (module doc, docs/explanation/kv-duo.md): cheap and right on demo-circuit
DEFAULTS = {"steps": 30, "lr": 0.1, "reg_weight": 2.0, "batch_size": 4, "initial_value": 1.0, "key_share": 0.75}
# arguments of an attention call that change its arithmetic, which the mixed attention does not implement
UNSUPPORTED = ("softcap", "s_aux", "sinks", "sliding_window")


@dataclass
class DuoGates:
    """Learned gates (L, H_kv) in [0, 1], the run's parameters and its cost: ``losses``/``distill``/``reg`` per
    step, ``seconds`` of training."""

    gates: np.ndarray
    sink: int
    window: int
    params: dict = field(default_factory=dict)
    losses: list = field(default_factory=list)
    distill: list = field(default_factory=list)
    reg: list = field(default_factory=list)
    seconds: float = 0.0

    def query_scores(self, n_heads: int, live: np.ndarray | None = None) -> np.ndarray:
        """(L, H) each query head's group gate; NaN where the head is not live (cut or gated off)."""
        scores = np.repeat(self.gates, n_heads // self.gates.shape[1], axis=1).astype(float)
        return scores if live is None else np.where(live, scores, np.nan)

    def to_json(self) -> dict:
        return {"gates": self.gates.tolist(), "sink": self.sink, "window": self.window, **self.params,
                "steps_run": len(self.losses), "loss_first": self.losses[0] if self.losses else None,
                "loss_last": self.losses[-1] if self.losses else None, "distill_last":
                self.distill[-1] if self.distill else None, "seconds": round(self.seconds, 3)}


def duo_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """α · full + (1 − α) · streaming attention per query head (module doc). query (B, H, T_q, d), key/value
    (B, H_kv, T_k, d) -> ((B, T_q, H, d), None)."""
    used = [name for name in UNSUPPORTED if kwargs.get(name) is not None]
    if used:
        raise KVPlanError(f"DuoAttention's gated attention does not implement {', '.join(used)} (this model's "
                          "attention uses it); accepted: plain causal softmax attention (Llama, Mistral without a "
                          "sliding window, Qwen, ...).")
    spec = getattr(module.config, CONFIG_KEY)[module.layer_idx]
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    t_q, t_k = query.shape[2], key.shape[2]
    k_pos = torch.arange(t_k, device=query.device)
    allowed = base_allowed(attention_mask, t_q, k_pos)
    near = allowed & window_allowed(k_pos[t_k - t_q:], k_pos, spec["sink"], spec["window"])[None, None]
    full = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling)
    stream = F.scaled_dot_product_attention(query, key, value, attn_mask=near, scale=scaling)
    alpha = spec["gates"][spec["block"], spec["groups"]].clamp(0, 1).to(query.dtype)[None, :, None, None]
    out = alpha * full + (1 - alpha) * stream
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, duo_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, eager_mask)


def gated_copy(model, gates: torch.Tensor, sink: int, window: int):
    """A private copy of ``model`` whose attention mixes full and streaming by ``gates`` (L, H_kv)."""
    copy = structural_copy(model)
    adapter = adapt(copy)
    specs = {}
    for layer, block_index in enumerate(adapter.layer_to_block):
        block = adapter.blocks[block_index]
        # each physical query position reads the gate of its original key/value group (surgery may have cut some)
        groups = [block.kv_sources[j] for j in block.kv_of_position()]
        specs[layer] = {"gates": gates, "block": block.index, "groups": torch.tensor(groups, dtype=torch.long),
                        "sink": sink, "window": window}
    setattr(copy.config, CONFIG_KEY, specs)
    copy.set_attn_implementation(ATTENTION)
    return copy


def final_hidden(model, ids: torch.Tensor) -> torch.Tensor:
    """(B, T, D) the base model's output (after its final norm: what the reference's ``model.model`` returns)."""
    return model.base_model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state


def filler_from_batches(batches: list[dict], special: set[int]) -> np.ndarray:
    """The calibration rows' real tokens (no padding, no special token), concatenated: the haystack."""
    out = []
    for batch in batches:
        for ids, keep in zip(batch["input_ids"], batch["attention_mask"].bool()):
            out.extend(t for t in ids[keep].tolist() if t not in special)
    return np.array(out, dtype=np.int64)


def lr_factor(step: int, steps: int) -> float:
    """The reference's schedule (``train.py``): warm-up over the first fifth, decay over the last, floor 0.1."""
    fifth = max(1, steps // 5)
    return min(1.0, max((step + 1) / fifth, 0.1), max((steps - step) / fifth, 0.1))


def check_duo_params(*, steps, lr, reg_weight, batch_size, initial_value, key_share=DEFAULTS["key_share"]) -> None:
    """Refuse a training parameter outside its limits (before anything loads)."""
    for name, value, limit in (("steps", steps, STEPS), ("learning rate", lr, LR), ("reg weight", reg_weight, REG),
                               ("batch size", batch_size, BATCH), ("initial gate", initial_value, THRESHOLD),
                               ("key share", key_share, KEY_SHARE)):
        problem = limit(value)
        if problem:
            raise KVPlanError(f"DuoAttention {name} {value!r} {problem}.")
    problem = TRAINING_ROWS(steps * batch_size)
    if problem:
        raise KVPlanError(f"DuoAttention steps {steps} x batch size {batch_size} = {steps * batch_size:,} passkey rows "
                          f"{problem}: lower --duo-steps or --duo-batch.")


def key_tokens_of(length: int, key_share: float) -> int:
    """Tokens of a passkey row's key: its two copies fill ``key_share`` of the row after BOS, at least the
    passkey task's KEY_TOKENS (and at most what the row holds)."""
    return min(max(KEY_TOKENS, round(key_share * (length - 1) / 2)), (length - 1) // 2)


def train_gates(model, tokenizer, calib: list[dict], *, sink: int, window: int, length: int | None = None,
                steps: int = DEFAULTS["steps"], lr: float = DEFAULTS["lr"], reg_weight: float = DEFAULTS["reg_weight"],
                batch_size: int = DEFAULTS["batch_size"], initial_value: float = DEFAULTS["initial_value"],
                key_share: float = DEFAULTS["key_share"], seed: int = 0, mask=None, progress=None) -> DuoGates:
    """Learn one gate per key/value group of ``model`` (module doc) on passkey rows of ``length`` tokens (default:
    the median calibration row, at most the model's positions) in the calibration rows' text, the key filling
    ``key_share`` of each row. ``model`` is never changed. ``progress(fraction, message)`` after each step."""
    check_window(sink, window)
    check_duo_params(steps=steps, lr=lr, reg_weight=reg_weight, batch_size=batch_size, initial_value=initial_value,
                     key_share=key_share)
    adapter = adapt(model)
    check_decoder(adapter)
    special = set(tokenizer.all_special_ids)
    filler = filler_from_batches(calib, special)
    positions = getattr(model.config, "max_position_embeddings", None) or 4096
    if length is not None and length > positions:   # positions past the model's own: no embedding to train on
        raise KVPlanError(f"DuoAttention's passkey rows of {length} tokens are longer than the model's {positions} "
                          f"positions. Accepted: a length up to {positions}.")
    if length is None:
        lengths = np.concatenate([b["attention_mask"].sum(-1).numpy() for b in calib])
        length = min(positions, int(np.median(lengths)))
    if length <= sink + window:
        raise KVPlanError(f"DuoAttention's passkey rows of {length} tokens fit inside sink + window ({sink} + "
                          f"{window}): every head would see every key and the gates learn nothing. Use a smaller "
                          "--window or longer rows (--duo-length).")
    depths = np.linspace(0, 1, 11)
    rows = passkey_rows_from(filler, tokenizer, length, steps * batch_size, seed, depths,
                             key_tokens_of(length, key_share))
    n_labels = rows.key_tokens        # the question's key tokens (module doc)
    device = next(model.parameters()).device
    gates = torch.full((len(adapter.blocks), adapter.n_kv_heads), float(initial_value), device=device,
                       requires_grad=True)
    optimizer = torch.optim.AdamW([gates], lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps))
    reference, mixed = structural_copy(model), gated_copy(model, gates, sink, window)
    result = DuoGates(np.zeros(0), sink, window, {"steps": steps, "lr": lr, "reg_weight": reg_weight,
                                                  "batch_size": batch_size, "initial_value": initial_value,
                                                  "key_share": key_share, "length": length, "seed": seed,
                                                  "label_tokens": n_labels})
    start = time.perf_counter()
    with gate_heads(reference, mask), gate_heads(mixed, mask):
        for step in range(steps):
            with torch.no_grad():
                gates.clamp_(0, 1)
            ids = rows.input_ids[step * batch_size:(step + 1) * batch_size].to(device)
            with torch.no_grad():
                target = final_hidden(reference, ids)[:, -n_labels:].float()
            got = final_hidden(mixed, ids)[:, -n_labels:].float()
            distill = (target - got).pow(2).mean(-1).sum() / target.shape[0] / n_labels
            reg = gates.abs().mean()
            loss = distill + reg_weight * reg
            (gates.grad,) = torch.autograd.grad(loss, [gates])
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            result.losses.append(loss.item())
            result.distill.append(distill.item())
            result.reg.append(reg.item())
            if progress is not None:
                progress((step + 1) / steps, f"DuoAttention gates step {step + 1}/{steps}, loss {loss.item():.4f}")
    with torch.no_grad():
        gates.clamp_(0, 1)
    result.gates = gates.detach().cpu().numpy().astype(float)
    result.seconds = time.perf_counter() - start
    return result
