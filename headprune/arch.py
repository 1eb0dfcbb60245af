"""Architecture adapters: where each supported encoder keeps its attention heads.

An adapter is detected from the loaded modules (their classes and attributes), never from the model's name.
Everything else in headprune (gating, surgery, capture, criteria) talks to blocks through this file only.

Terms
-----
block   one set of Q/K/V/O weights. BERT-like models have one block per layer; ALBERT shares one block across
        all layers ("tied"), so a head index there is one unit across every layer (Greedy-Gnorm paper, Fig. 1).
core    the module that calls transformers' attention interface and returns ``(out, attn_weights)``.
kept    original head ids still physically present in the block's weights, in weight order. Surgery shrinks it;
        masks and score maps always speak in original ids so an L x H grid stays drawable after pruning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from .errors import UnsupportedArchitecture

SUPPORTED = ("bert", "roberta", "xlm-roberta", "albert", "distilbert", "electra")


@dataclass
class AttentionBlock:
    index: int
    core: nn.Module
    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    output: nn.Linear
    head_size: int
    kept: list[int] = field(default_factory=list)

    @property
    def n_live(self) -> int:
        return len(self.kept)


@dataclass
class ModelAdapter:
    arch: str
    model: nn.Module
    blocks: list[AttentionBlock]
    n_heads: int
    n_layers: int
    tied: bool
    layer_to_block: list[int]
    layer_modules: nn.ModuleList | None
    # True when the core module also applies the O projection (ALBERT, DistilBERT); False when O sits in a
    # sibling "SelfOutput" module (BERT family). Surgery needs it to stand in for a block with no heads.
    core_applies_output: bool

    @property
    def grid_shape(self) -> tuple[int, int]:
        return (len(self.blocks), self.n_heads)

    @property
    def unit_name(self) -> str:
        return "tied head (all layers)" if self.tied else "head"

    def live_grid(self):
        """Bool tensor (n_blocks, n_heads): which original heads are still physically present."""
        import torch

        live = torch.zeros(self.grid_shape, dtype=torch.bool)
        for b in self.blocks:
            live[b.index, b.kept] = True
        return live


def _kept_heads(model: nn.Module, block_index: int, n_heads: int) -> list[int]:
    recorded = getattr(model.config, "headprune_kept_heads", None) or {}
    kept = recorded.get(str(block_index), recorded.get(block_index))
    return list(range(n_heads)) if kept is None else [int(h) for h in kept]


def _find_encoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The ModuleList of encoder layers, found by attribute shape (encoder.layer / transformer.layer)."""
    for name, module in model.named_modules():
        for attr in ("layer",):
            layers = getattr(module, attr, None)
            if isinstance(layers, nn.ModuleList) and len(layers) > 0 and hasattr(layers[0], "attention"):
                return name, layers
    return None


def _bert_like_block(i: int, layer: nn.Module, model: nn.Module, n_heads: int) -> AttentionBlock | None:
    att = getattr(layer, "attention", None)
    core = getattr(att, "self", None)
    out = getattr(getattr(att, "output", None), "dense", None)
    if core is None or out is None or not all(hasattr(core, a) for a in ("query", "key", "value")):
        return None
    return AttentionBlock(i, core, core.query, core.key, core.value, out, core.attention_head_size,
                          _kept_heads(model, i, n_heads))


def _distilbert_block(i: int, layer: nn.Module, model: nn.Module, n_heads: int) -> AttentionBlock | None:
    core = getattr(layer, "attention", None)
    if core is None or not all(hasattr(core, a) for a in ("q_lin", "k_lin", "v_lin", "out_lin")):
        return None
    return AttentionBlock(i, core, core.q_lin, core.k_lin, core.v_lin, core.out_lin, core.attention_head_size,
                          _kept_heads(model, i, n_heads))


def _model_type(model: nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", "unknown"))


def adapt(model: nn.Module) -> ModelAdapter:
    """Build the adapter for ``model`` (any supported *ForSequenceClassification or base model).

    Raises UnsupportedArchitecture, naming the model's type and the supported ones.
    """
    config = getattr(model, "config", None)
    n_heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", None)

    # ALBERT: groups of shared layers under encoder.albert_layer_groups
    groups = None
    for module in model.modules():
        if hasattr(module, "albert_layer_groups"):
            groups = module.albert_layer_groups
            break
    if groups is not None:
        blocks: list[AttentionBlock] = []
        for group in groups:
            for albert_layer in group.albert_layers:
                core = albert_layer.attention
                i = len(blocks)
                blocks.append(AttentionBlock(i, core, core.query, core.key, core.value, core.dense,
                                             core.attention_head_size, _kept_heads(model, i, n_heads)))
        n_layers = config.num_hidden_layers
        inner = config.inner_group_num
        layer_to_block = []
        for layer in range(n_layers):
            group_idx = int(layer / (n_layers / config.num_hidden_groups))
            layer_to_block.extend(group_idx * inner + j for j in range(inner))
        return ModelAdapter("albert", model, blocks, n_heads, len(layer_to_block), True, layer_to_block,
                            None, core_applies_output=True)

    found = _find_encoder_layers(model)
    if found is not None and n_heads:
        _, layers = found
        for arch_builder, applies_out in ((_bert_like_block, False), (_distilbert_block, True)):
            blocks = [arch_builder(i, layer, model, n_heads) for i, layer in enumerate(layers)]
            if all(b is not None for b in blocks):
                mt = _model_type(model)
                arch = mt if mt in SUPPORTED else ("distilbert" if applies_out else "bert")
                return ModelAdapter(arch, model, blocks, n_heads, len(blocks), False, list(range(len(blocks))),
                                    layers, core_applies_output=applies_out)

    raise UnsupportedArchitecture(
        f"Unsupported architecture: model type '{_model_type(model)}' ({type(model).__name__}). "
        f"headprune supports encoder classifiers of these families: {', '.join(SUPPORTED)}."
    )
