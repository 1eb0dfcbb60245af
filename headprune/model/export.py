"""Stock exports: a pruned model that plain transformers -- and so any runtime that reads the original family --
loads, with no headprune code and no headprune keys in its config.

Three formats (:data:`FORMATS`):

headprune   ``loading.save_pruned``: physically cut, any mask, kept heads recorded in the config
            (``headprune_kept_heads``); only ``headprune.load_model`` rebuilds it.
masked      the original architecture and config, the pruned heads' weights zeroed. For a pruned head h of a block
            with head size d_h at physical position p: W_O input columns [p d_h, (p+1) d_h) and W_Q output rows (with
            bias) of the same span are set to 0 -- and the rows of any further query-side per-head projection
            (``AttentionBlock.extra_rows``). The O columns alone make the head's contribution
            W_O[:, p] c_h = 0 for every context c_h, i.e. exactly a 0 gate (``gating.py``); Q then no longer
            matters and is zeroed for sparsity. A key/value head's W_K / W_V rows (and key-side extras) are zeroed
            only when every query head reading it is pruned, so every kept head sees its own keys and values
            unchanged (grouped-query attention). Same compute as the dense model: the export says so. A tuned
            mask's scales are baked into the kept heads' O columns (``surgery.bake_scales``), as in every format.
uniform     the cut of ``surgery.prune_model`` with a stock config: possible when every layer keeps the same
            number q of query heads in the same number n of key/value groups, c = q / n heads per kept group
            (multi-head attention: c = 1, n = q). Surgery then holds each kept group's K/V rows once and orders
            the kept query heads group by group, which is stock ``repeat_kv`` (position p reads K/V head p // c),
            so the config only needs ``num_attention_heads`` = q, ``num_key_value_heads`` = n and an explicit
            ``head_dim`` = d_h (unchanged; ``hidden_size`` stays). Only families whose config takes ``head_dim``
            explicitly can say this (:data:`UNIFORM_TYPES`); GPT-2 and the BERT family, DeBERTa and ModernBERT
            derive head size as hidden / heads, so for them a smaller head count would change every head's size.

:func:`nearest_uniform` rounds any mask to a uniform one changing the fewest heads (an exact minimum, see there).

transformers 5.23's heterogeneous ``per_layer_config`` (``PretrainedConfig(per_layer_config=...)``) would allow a
different head count per layer, but only dots3 / gemma4 / step3p7 / neomme / diffusion_gemma modeling code reads
it -- none of the families headprune supports -- so a non-uniform cut stays a headprune checkpoint.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..errors import HeadpruneError
from .arch import AttentionBlock, adapt, out_axis
from .layers import drop_layers
from .loading import save_pruned, write_staged
from .mask import HeadMask
from .onnx_export import OPSET, export_onnx
from .surgery import bake_scales, head_features, prune_model

# model_type values whose config and attention read an explicit head_dim (transformers 5.23:
# ``getattr(config, "head_dim", hidden_size // num_attention_heads)`` in each attention's __init__)
UNIFORM_TYPES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3",
                 "gemma3_text": "Gemma 3 (text)", "phi3": "Phi-3"}

FORMATS = {
    "headprune": {"what": "physically cut, any mask; kept heads recorded in the config",
                  "loads_in": "headprune only (headprune.load_model, the CLI, the dashboard)",
                  "saves_compute": True},
    "masked": {"what": "original architecture and config, pruned heads' weights zeroed (same output as the mask)",
               "loads_in": "plain transformers (AutoModel*.from_pretrained) and every runtime that loads the "
                           "original model: vLLM, TGI, llama.cpp conversion, ONNX export",
               "saves_compute": False},
    "uniform": {"what": "physically smaller, stock config (same head count in every layer); "
                        f"families: {', '.join(UNIFORM_TYPES.values())}",
                "loads_in": "plain transformers and every runtime that reads the family's config with an explicit "
                            "head_dim (vLLM, TGI, llama.cpp conversion)",
                "saves_compute": True},
    "onnx": {"what": f"one ONNX graph of the cut model (any mask, opset {OPSET}, dynamic batch and sequence axes; "
                     "encoder classifiers and causal LMs without a key/value cache), the tokenizer beside it",
             "loads_in": "onnxruntime (onnxruntime.InferenceSession on model.onnx, any language binding) and every "
                         "runtime that reads ONNX; no transformers or headprune needed",
             "saves_compute": True},
}

# formats that carry a mask's dropped layers: a headprune checkpoint records them, an ONNX graph leaves them out
DROPS_LAYERS = ("headprune", "onnx")

MASKED_NOTE = ("The masked export has the original size and speed: pruned heads are zeroed, not removed, so it "
               "saves no compute or memory. It loads anywhere the original loads. For a smaller, faster model use "
               "format 'uniform' (a stock config, same head count per layer) or 'headprune' (any mask).")


class ExportError(HeadpruneError):
    pass


def _stock_config(model: nn.Module) -> None:
    """Drop every ``headprune_*`` key from the model's config (and its text config), in place."""
    for config in {id(c): c for c in (model.config, getattr(model.config, "text_config", None)) if c}.values():
        for key in [k for k in vars(config) if k.startswith("headprune_")]:
            delattr(config, key)


def _check_uncut(adapter, what: str) -> None:
    cut = [b.index for b in adapter.blocks if b.kept != list(range(b.n_heads))]
    if cut:
        raise ExportError(f"The {what} export starts from the original model, but this one already has heads cut "
                          f"out (blocks {cut[:5]}). Load the uncut model and give the whole mask, or export with "
                          "format 'headprune'.")


def _binary(mask: HeadMask, adapter) -> torch.Tensor:
    if mask.shape != adapter.grid_shape:
        raise ExportError(f"Mask shape {mask.shape} does not fit this model's {adapter.grid_shape} heads.")
    if not mask.is_binary:
        raise ExportError("An export needs a binary mask (0 = remove, 1 = keep); soft gates exist only at run time.")
    return mask.keep_bool()


def _zero(module: nn.Module, index: list[int], output_side: bool) -> None:
    """Set the ``index`` output features (rows, with their bias) or input features (columns) of ``module`` to 0."""
    axis = out_axis(module) if output_side else 1 - out_axis(module)
    idx = torch.tensor(index, dtype=torch.long, device=module.weight.device)
    with torch.no_grad():
        module.weight.index_fill_(axis, idx, 0.0)
        if output_side and getattr(module, "bias", None) is not None:
            module.bias.index_fill_(0, idx.to(module.bias.device), 0.0)


def _mask_block(block: AttentionBlock, pruned: list[int]) -> None:
    d = block.head_size
    q_pos = [block.kept.index(h) for h in pruned]
    readers = block.kv_of_position()
    dead_kv = [j for j in range(block.n_kv_live) if all(p in q_pos for p, r in enumerate(readers) if r == j)]
    q_off = block.fused_span("query")[0] if block.fused else 0
    k_off = block.fused_span("key")[0] if block.fused else 0
    v_off = block.fused_span("value")[0] if block.fused else 0
    _zero(block.output, head_features(q_pos, d), output_side=False)
    _zero(block.query, head_features(q_pos, d, q_off), output_side=True)
    if dead_kv:
        _zero(block.key, head_features(dead_kv, d, k_off), output_side=True)
        _zero(block.value, head_features(dead_kv, d, v_off), output_side=True)
    for module, side in block.extra_rows:
        rows = q_pos if side == "query" else dead_kv
        if rows:
            _zero(module, head_features(rows, d), output_side=True)


def masked_model(model: nn.Module, mask: HeadMask) -> nn.Module:
    """A deep copy of ``model`` (original architecture) whose pruned heads' weights are zeroed (module docstring).

    Its outputs equal ``gate_heads(model, mask)``'s. ``model`` must be uncut (a headprune checkpoint is not the
    original architecture any more). Raises ExportError.
    """
    _check_uncut(adapt(model), "masked")
    target = copy.deepcopy(model)
    zero_pruned_heads(target, mask)
    bake_scales(target, mask)
    _stock_config(target)
    return target


def zero_pruned_heads(model: nn.Module, mask: HeadMask) -> nn.Module:
    """Zero, in place, the weights of the heads ``mask`` prunes (O columns, Q rows, K/V rows no kept head reads:
    the module docstring's masked layout); heads already cut are ignored. Returns ``model``. Recovery calls it on
    the model it trains under gates, so a pruned head stays at zero whatever an optimizer or a LoRA merge wrote."""
    adapter = adapt(model)
    keep = _binary(mask, adapter)
    for block in adapter.blocks:
        pruned = [h for h in block.kept if not keep[block.index, h]]
        if pruned:
            _mask_block(block, pruned)
    return model


# -- uniform cuts -----------------------------------------------------------------------------------------------

def uniform_shape(model: nn.Module, mask: HeadMask) -> tuple[int, int] | None:
    """(query heads per layer q, key/value heads per layer n) when ``mask`` keeps a uniform layout, else None.

    Uniform: every block keeps q >= 1 query heads in n key/value groups with q / n heads in every kept group.
    """
    adapter = adapt(model)
    keep = _binary(mask, adapter)
    shapes = set()
    for block in adapter.blocks:
        counts = Counter(block.group_of(h) for h in range(block.n_heads) if keep[block.index, h])
        if not counts or len(set(counts.values())) != 1:
            return None
        shapes.add((sum(counts.values()), len(counts)))
    return shapes.pop() if len(shapes) == 1 else None


def _text_config(model: nn.Module):
    return getattr(model.config, "text_config", None) or model.config


def config_refuses(model: nn.Module, query_heads: int, kv_heads: int) -> str | None:
    """Why the family's stock config refuses ``query_heads`` / ``kv_heads`` per layer (its own validation, e.g.
    Llama and Gemma 3 require hidden_size % num_attention_heads == 0 even with an explicit head_dim), or None."""
    config = copy.deepcopy(_text_config(model))
    config.num_attention_heads, config.num_key_value_heads = query_heads, kv_heads
    config.head_dim = adapt(model).blocks[0].head_size
    try:
        if hasattr(config, "validate"):
            config.validate()
    except Exception as exc:  # transformers raises its own (strict dataclass) error type, wrapping a ValueError
        return str(getattr(exc, "__cause__", None) or exc).strip()
    return None


def type_problem(model_type: str) -> str | None:
    """Why a model of ``model_type`` (its config's, or its text config's) cannot be cut to a stock config, or None.

    Needs no model: the CLI asks before loading one, from the folder's config.json.
    """
    if model_type in UNIFORM_TYPES:
        return None
    return (f"A uniform cut with a stock config needs a family whose config takes head_dim explicitly "
            f"({', '.join(UNIFORM_TYPES.values())}); '{model_type}' ties the head size to hidden size / heads, so "
            "fewer heads would change every head's size. Export it with format 'masked' (original architecture, "
            "pruned heads zeroed, loads anywhere) or 'headprune' (smaller, loads in headprune).")


def family_problem(model: nn.Module) -> str | None:
    """Why no mask at all can cut ``model`` to a stock config (its family, or heads already cut), or None."""
    problem = type_problem(_text_config(model).model_type)
    if problem:
        return problem
    if any(b.kept != list(range(b.n_heads)) for b in adapt(model).blocks):
        return ("A uniform export starts from the original model, but this one already has heads cut out. Load the "
                "uncut model and give the whole mask.")
    return None


def uniform_problem(model: nn.Module, mask: HeadMask) -> str | None:
    """Why ``model`` cannot be cut by ``mask`` to a stock config (a message naming what is accepted), or None."""
    problem = family_problem(model)
    if problem:
        return problem
    adapter = adapt(model)
    config = _text_config(model)
    if uniform_shape(model, mask) is None:
        per_layer = [int(row.sum()) for row in _binary(mask, adapter)]
        return (f"This mask keeps {per_layer} query heads per layer; a stock config needs the same number in every "
                "layer (and, with grouped-query attention, the same number in every kept key/value group). Round "
                "it with nearest_uniform (CLI: prune --format uniform does), or export with format 'headprune'.")
    refused = config_refuses(model, *uniform_shape(model, mask))
    if refused:
        return (f"The stock {UNIFORM_TYPES[config.model_type]} config refuses {uniform_shape(model, mask)[0]} query "
                f"heads per layer: {refused} nearest_uniform picks only counts the config accepts; or export with "
                "format 'headprune'.")
    return None


def uniform_model(model: nn.Module, mask: HeadMask, cut: nn.Module | None = None) -> nn.Module:
    """``surgery.prune_model(model, mask)`` with a stock config: num_attention_heads = q, num_key_value_heads = n,
    head_dim = d_h, no headprune keys. Raises ExportError (:func:`uniform_problem`) when the mask or family does
    not allow it. ``cut``: that cut made already (and since fine-tuned, by recovery), used in place of a new one
    (its config is rewritten in place)."""
    problem = uniform_problem(model, mask)
    if problem:
        raise ExportError(problem)
    q, n = uniform_shape(model, mask)
    head_dim = adapt(model).blocks[0].head_size
    cut = prune_model(model, mask) if cut is None else cut
    for block in adapt(cut).blocks:  # surgery's equal-per-group layout is stock repeat_kv: K/V once, in order
        if not len(set(block.kv_sources)) == len(block.kv_sources) == n or block.n_live != q:
            raise ExportError(f"Block {block.index} was cut to {block.n_live} query / {block.kv_sources} key/value "
                              f"heads, not the stock layout {q} / {n}; export with format 'headprune'.")
    _stock_config(cut)
    config = _text_config(cut)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = q, n, head_dim
    return cut


@dataclass
class UniformRounding:
    """What :func:`nearest_uniform` chose and changed (original head ids, (layer, head) pairs)."""

    mask: HeadMask
    query_heads: int                     # q: query heads kept in every layer
    kv_heads: int                        # n: key/value groups kept in every layer
    added: list[tuple[int, int]] = field(default_factory=list)     # pruned in the given mask, kept now
    removed: list[tuple[int, int]] = field(default_factory=list)   # kept in the given mask, pruned now

    @property
    def changed(self) -> int:
        return len(self.added) + len(self.removed)

    def to_json(self) -> dict:
        return {"query_heads_per_layer": self.query_heads, "kv_heads_per_layer": self.kv_heads,
                "changed": self.changed, "added": [list(x) for x in self.added],
                "removed": [list(x) for x in self.removed]}

    def describe(self) -> str:
        if not self.changed:
            return f"The mask is uniform already: {self.query_heads} query heads per layer."
        return (f"Rounded to {self.query_heads} query heads in {self.kv_heads} key/value groups per layer: "
                f"{len(self.added)} pruned heads kept again, {len(self.removed)} more heads pruned "
                f"({self.changed} changed).")


def nearest_uniform(model: nn.Module, mask: HeadMask, scores: torch.Tensor | None = None) -> UniformRounding:
    """The uniform mask (:func:`uniform_shape`) nearest to ``mask``: fewest heads changed, exactly.

    For a target of n groups with c heads each, a block whose group g keeps k_g heads costs
        sum_g k_g + sum_{g chosen} (|k_g - c| - k_g)
    flips (a chosen group is filled up or trimmed to c, every other group emptied), minimised by choosing the n
    groups with the smallest |k_g - c| - k_g. Every (c, n) with c <= heads per group, n <= groups is tried; the
    total over blocks decides, ties going to more heads kept (then fewer groups, i.e. fewer K/V rows). Within a
    group the heads kept are the already-kept ones first, then by ``scores`` (n_blocks x n_heads, higher = more
    important; default: lower head id), and group ties go to the higher summed score. Multi-head attention is the
    case of groups of one head (c = 1, n = q). For a family of :data:`UNIFORM_TYPES` only shapes its stock config
    accepts are tried (:func:`config_refuses`: Llama needs hidden_size % q == 0).
    """
    adapter = adapt(model)
    keep = _binary(mask, adapter)
    score = torch.zeros(adapter.grid_shape) if scores is None else \
        torch.nan_to_num(torch.as_tensor(scores, dtype=torch.float32), nan=0.0)
    size = adapter.blocks[0].group_size
    n_groups = adapter.blocks[0].n_kv_heads
    if any(b.group_size != size or b.n_kv_heads != n_groups for b in adapter.blocks):
        raise ExportError("Blocks differ in their key/value grouping; a uniform config cannot describe them.")

    def rank(block, members):  # already kept first, then higher score, then lower id
        return sorted(members, key=lambda h: (not keep[block.index, h], -float(score[block.index, h]), h))

    def plan(c: int, n: int):
        total, chosen_all = 0, []
        for block in adapter.blocks:
            groups = {g: [h for h in range(block.n_heads) if block.group_of(h) == g] for g in range(n_groups)}
            kept = {g: sum(bool(keep[block.index, h]) for h in hs) for g, hs in groups.items()}
            order = sorted(groups, key=lambda g: (abs(kept[g] - c) - kept[g],
                                                  -sum(float(score[block.index, h]) for h in groups[g]), g))
            chosen = order[:n]
            total += sum(kept.values()) + sum(abs(kept[g] - c) - kept[g] for g in chosen)
            chosen_all.append([h for g in sorted(chosen) for h in rank(block, groups[g])[:c]])
        return total, chosen_all

    stock = _text_config(model).model_type in UNIFORM_TYPES   # then only shapes its config accepts
    shapes = [(c, n) for c in range(1, size + 1) for n in range(1, n_groups + 1)
              if not (stock and config_refuses(model, c * n, n))]
    best = min(((plan(c, n), c, n) for c, n in shapes), key=lambda t: (t[0][0], -t[1] * t[2], t[2]))
    (_, chosen_all), c, n = best
    values = torch.zeros(adapter.grid_shape)
    for block, heads in zip(adapter.blocks, chosen_all):
        values[block.index, heads] = 1.0
    new = values.bool()
    added = [tuple(x) for x in (new & ~keep).nonzero().tolist()]
    removed = [tuple(x) for x in (keep & ~new).nonzero().tolist()]
    return UniformRounding(HeadMask(values, mask.scales), c * n, n, added, removed)   # a kept head keeps its scale


def round_to_uniform(model: nn.Module, mask: HeadMask, scores: torch.Tensor | None = None) -> UniformRounding:
    """:func:`nearest_uniform` for a model that can be cut to a stock config (no change when ``mask`` already
    fits); raises ExportError naming why not (:func:`family_problem`) otherwise."""
    problem = family_problem(model)
    if problem:
        raise ExportError(problem)
    return nearest_uniform(model, mask, scores)


# -- writing ----------------------------------------------------------------------------------------------------

def _write_stock(model: nn.Module, tokenizer, out: Path) -> Path:
    """Save ``model`` (stock config) and ``tokenizer`` as safetensors into ``out`` (``loading.write_staged``)."""
    def write(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)

    return write_staged(out, write)


def export_model(model: nn.Module, tokenizer, mask: HeadMask, out: str | Path, format: str = "headprune",
                 extra: dict | None = None, dropped_layers: Sequence[int] = (), cut: nn.Module | None = None) -> dict:
    """Write ``model`` pruned by ``mask`` to the folder ``out`` in ``format`` (:data:`FORMATS`).

    Returns {"format", "out", "loads_in", "saves_compute", "note", "model"} where "model" is the written model
    (for size reports). Nothing half-written is left: every format writes into a temporary folder and renames
    it. ``extra`` is saved as headprune.json (headprune format) or as the graph's metadata (onnx).
    ``dropped_layers`` (a mask's whole-layer rule, ``model.mask.dropped_layers``) are skipped for good in the written
    model; only the headprune format (which records them) and onnx (whose graph leaves them out) carry them.
    ``cut``: ``prune_model(model, mask)`` made already (recovery fine-tunes it), written instead of a new cut
    (formats headprune, uniform and onnx; masked starts from ``model``). The onnx format's report
    (``onnx_export.export_onnx``: file, opset, inputs, axes, check) is under "onnx". Raises ExportError
    (onnx: OnnxExportError).
    """
    if format not in FORMATS:
        raise ExportError(f"Unknown export format {format!r}; accepted: {', '.join(FORMATS)}.")
    if dropped_layers and format not in DROPS_LAYERS:
        raise ExportError(f"The mask drops whole layers {list(dropped_layers)} (SAP's layer rule); only the "
                          f"{' and '.join(DROPS_LAYERS)} formats carry a dropped layer, {format!r} cannot. Accepted: "
                          f"--format {' or '.join(DROPS_LAYERS)}.")
    out = Path(out)
    if format == "masked" and cut is not None:
        raise ExportError("The masked export keeps the original architecture; a cut model cannot be written as "
                          "one. Export it with format 'headprune' or 'uniform'.")
    if format == "headprune":
        written = prune_model(model, mask) if cut is None else cut
        drop_layers(adapt(written), dropped_layers)
        save_pruned(written, tokenizer, out, extra=extra)
        note = "A headprune checkpoint: smaller and faster, loaded by headprune.load_model (any mask)."
    elif format == "onnx":
        graph = export_onnx(model, tokenizer, mask, out, cut=cut, dropped_layers=dropped_layers, extra=extra)
        written = graph.pop("model")
        note = (f"An ONNX graph of the cut model (opset {OPSET}, dynamic batch and sequence): "
                f"onnxruntime.InferenceSession('{Path(graph['file'])}') runs it on {', '.join(graph['inputs'])} "
                "(int64, e.g. from the tokenizer beside it with return_tensors='np'); its logits matched the cut "
                f"model's within {graph['check']['relative']:.0e} of their scale.")
    elif format == "masked":
        written = masked_model(model, mask)
        _write_stock(written, tokenizer, out)
        note = MASKED_NOTE
    else:
        written = uniform_model(model, mask, cut)
        _write_stock(written, tokenizer, out)
        note = "A stock checkpoint with fewer heads per layer: plain transformers loads the smaller model."
    info = FORMATS[format]
    return {"format": format, "out": str(out), "loads_in": info["loads_in"], "saves_compute": info["saves_compute"],
            "note": note, "model": written, **({"onnx": graph} if format == "onnx" else {})}
