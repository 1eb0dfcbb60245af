"""What every architecture adapter produces: blocks of heads, their projections and grouping.

Terms
-----
block   one set of Q/K/V/O weights. Most models have one block per layer; ALBERT shares one block across all
        layers ("tied"), so a head index there is one unit across every layer (Greedy-Gnorm paper, Fig. 1).
core    the module that calls transformers' attention interface and returns ``(out, attn_weights)``.
kept    original query-head ids still physically present in the block's weights, in weight order. Surgery
        shrinks it; masks and score maps always speak in original ids so an L x H grid stays drawable.
group   grouped-query attention (GQA): query head h of a block with H query and H_kv key/value heads reads
        key/value head h // (H / H_kv). Groups are numbered 0..H_kv-1 per block; multi-head attention is the
        case H_kv = H (every head its own group).
kv_sources  for each key/value head physically present, the original group it holds, in weight order. After an
        uneven cut surgery may hold a group's key/value rows more than once (see surgery.py); stock transformers
        then pairs physical query position p with physical key/value head p // (n_live / n_kv_live).

Projections
-----------
``query``, ``key`` and ``value`` are the modules producing Q, K and V; ``output`` is O: its *input* features are
the concatenated head contexts, head by head. A module is an ``nn.Linear`` (weight out x in) or transformers'
``Conv1D`` (weight in x out); :func:`out_axis` tells which.

Where each head's rows live: one description for surgery, gating, capture, criteria and exporters
-------------------------------------------------------------------------------------------------
Every projection's output features are a sequence of d_h-row *chunks*, one per head of one part, and
:meth:`AttentionBlock.chunks` lists them in row order as ``(part, physical head)`` pairs for any head counts
(query heads n_q, key/value heads n_kv, n_q a multiple of n_kv). Separate Q, K, V modules hold their own part's
heads in order. A fused module (``query is key is value``) follows its block's ``layout`` (:data:`LAYOUTS`):

``"blocks"``    all query heads, then all key heads, then all value heads: Q | K | V
                (GPT-2 ``c_attn``, Phi-3 ``qkv_proj``, ModernBERT ``Wqkv``, MPT ``Wqkv``, Falcon multi-query)
``"grouped"``   per key/value head j: the query heads reading it, then k_j, then v_j
                [q_(j g) .. q_(j g + g - 1), k_j, v_j], g = n_q / n_kv (Falcon's new decoder architecture); with
                one query head per group this is the per-head interleaving [q_h, k_h, v_h] of GPT-NeoX / Pythia,
                BLOOM, Falcon's old multi-head architecture and DeBERTa v1's ``in_proj``

:meth:`AttentionBlock.rows` gives the output features of given heads of a part (what gradients are sliced by,
what a masked export zeroes, what a GGUF / ONNX exporter reads per head); :meth:`AttentionBlock.rows_after` the
features a cut keeps, in the order the same layout has at the new counts (what surgery slices). Physical query
position p reads physical key/value head p // (n_q / n_kv), as stock ``repeat_kv`` does, in every layout.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

PARTS = ("query", "key", "value")
LAYOUTS = ("blocks", "grouped")   # fused Q/K/V row layouts (module doc)


def out_axis(module: nn.Module) -> int:
    """Weight axis indexing output features: 0 for nn.Linear, 1 for transformers' Conv1D (weight in x out)."""
    return 1 if type(module).__name__ == "Conv1D" else 0


def in_features(module: nn.Module) -> int:
    return module.weight.shape[1 - out_axis(module)]


def out_features(module: nn.Module) -> int:
    return module.weight.shape[out_axis(module)]


def fused_chunks(layout: str, n_query: int, n_kv: int) -> list[tuple[str, int]]:
    """The d_h-row chunks of a fused Q/K/V module of ``layout`` at ``n_query`` / ``n_kv`` heads (module doc)."""
    if layout == "blocks":
        return [("query", p) for p in range(n_query)] + [(part, j) for part in ("key", "value") for j in range(n_kv)]
    if layout == "grouped":
        g = n_query // n_kv if n_kv else 0
        return [chunk for j in range(n_kv)
                for chunk in [("query", j * g + i) for i in range(g)] + [("key", j), ("value", j)]]
    raise ValueError(f"unknown fused layout {layout!r}; known: {', '.join(LAYOUTS)}")


@dataclass
class AttentionBlock:
    index: int
    core: nn.Module
    query: nn.Module
    key: nn.Module
    value: nn.Module
    output: nn.Module
    head_size: int
    kept: list[int] = field(default_factory=list)
    n_heads: int = 0                     # original query heads H
    n_kv_heads: int = 0                  # original key/value heads H_kv (= H without GQA)
    kv_sources: list[int] = field(default_factory=list)
    # Sets the core's head-count attributes after surgery: (core, n_query_heads, n_kv_heads) -> None
    set_counts: Callable[[nn.Module, int, int], None] | None = None
    # Forward of a core with zero heads left: (core, inner_forward, *args, **kwargs) -> what the core returns
    empty_forward: Callable[..., Any] | None = None
    # Forward installed on a core that must read per-layer head counts the stock forward takes from the
    # shared config (Phi-3); None when the stock forward already reads the core's own attributes.
    counted_forward: Callable[..., Any] | None = None
    # Further per-head projections, each (module, side): its output rows are laid out head by head like the
    # "query" or "key" side it is multiplied with, and surgery cuts them with that side (DeBERTa's position
    # projections pos_key_proj / pos_query_proj). Gating needs nothing: a gate on the context entering O
    # silences every path of the head.
    extra_rows: list[tuple[nn.Module, str]] = field(default_factory=list)
    # How a fused Q/K/V module orders its heads' rows (:data:`LAYOUTS`); read only when the block is fused.
    layout: str = "blocks"
    # Further per-head parameters, each (module, attribute name): a tensor whose dim 0 holds the physical query
    # heads' entries head by head, the same number per head (one: gpt-oss's learned attention sinks,
    # Nystromformer's per-head convolution over values; d_h: DeBERTa v1's q_bias / v_bias, added to each head's
    # query and value after its fused in_proj -- a multi-head family, where value heads are the query heads).
    # Surgery keeps the kept heads' entries; the family's ``set_counts`` updates whatever counts them.
    head_params: list[tuple[nn.Module, str]] = field(default_factory=list)
    # True when Q and K pass through a norm over *all* heads' features before attention (OLMo 2's q_norm /
    # k_norm): every head's Q/K rows feed the statistics of the others, so surgery keeps the Q and K rows of every
    # original head (and the norms) and cuts V and O only; the core's forward (``counted_forward``) picks the kept
    # heads after the norm. Masked exports zero only O columns and V rows for the same reason.
    norm_spans_heads: bool = False

    @property
    def n_live(self) -> int:
        return len(self.kept)

    @property
    def n_kv_live(self) -> int:
        return len(self.kv_sources)

    @property
    def fused(self) -> bool:
        return self.query is self.key

    @property
    def group_size(self) -> int:
        """Original query heads per key/value head (H / H_kv)."""
        return self.n_heads // self.n_kv_heads

    def group_of(self, head: int) -> int:
        """Original key/value group of original query head ``head``."""
        return head // self.group_size

    def chunks(self, name: str, n_query: int | None = None, n_kv: int | None = None) -> list[tuple[str, int]]:
        """The d_h-row chunks of the module producing part ``name``, in row order, as (part, physical head), at
        ``n_query`` / ``n_kv`` heads (default: the heads present now). See the module doc."""
        n_query = self.n_live if n_query is None else n_query
        n_kv = self.n_kv_live if n_kv is None else n_kv
        if self.norm_spans_heads and name in ("query", "key"):   # every original head's Q/K rows stay (above)
            n_query, n_kv = self.n_heads, self.n_kv_heads
        if not self.fused:
            return [(name, i) for i in range(n_query if name == "query" else n_kv)]
        return fused_chunks(self.layout, n_query, n_kv)

    def rows(self, name: str, heads) -> list[int]:
        """Output features of the module producing part ``name`` that hold its physical heads ``heads`` (query
        positions for "query", key/value heads for "key" / "value"), d_h each, in the order of ``heads``."""
        where = {chunk: i for i, chunk in enumerate(self.chunks(name))}
        d = self.head_size
        return [where[name, h] * d + i for h in heads for i in range(d)]

    def part_rows(self, name: str) -> list[int]:
        """Output features of every head of part ``name``, head by head (query heads in weight order)."""
        return self.rows(name, range(self.n_live if name == "query" else self.n_kv_live))

    def rows_after(self, module: nn.Module, q_pos: list[int], kv_pos: list[int]) -> list[int]:
        """Output features of ``module`` (one of query / key / value) that a cut keeping physical query positions
        ``q_pos`` and key/value heads ``kv_pos`` keeps, in the row order the block's layout has at the new counts."""
        name = next(p for p in PARTS if getattr(self, p) is module)
        where = {chunk: i for i, chunk in enumerate(self.chunks(name))}
        d = self.head_size
        old = {"query": q_pos, "key": kv_pos, "value": kv_pos}
        return [where[part, old[part][i]] * d + r for part, i in self.chunks(name, len(q_pos), len(kv_pos))
                for r in range(d)]

    def part(self, name: str, out: torch.Tensor) -> torch.Tensor:
        """The ``name`` ("query"/"key"/"value") features of ``out`` -- the output of ``getattr(self, name)``, or a
        gradient of it -- head by head."""
        if not self.fused:
            return out
        rows = self.part_rows(name)
        if not rows:
            return out[..., :0]
        if rows[-1] - rows[0] + 1 == len(rows):   # one contiguous run (Q|K|V blocks): a view, no copy
            return out[..., rows[0]:rows[-1] + 1]
        return out.index_select(-1, torch.tensor(rows, dtype=torch.long, device=out.device))

    def fused_span(self, name: str) -> tuple[int, int]:
        """Output features [start, stop) of part ``name`` in a fused "blocks" module (Q, then K, then V); a
        "grouped" layout has no such run: use :meth:`rows`."""
        if self.layout != "blocks":
            raise ValueError(f"a '{self.layout}' fused layout holds part {name} in many runs; use rows()")
        d = self.head_size
        sizes = {"query": self.n_live * d, "key": self.n_kv_live * d, "value": self.n_kv_live * d}
        start = sum(sizes[p] for p in PARTS[:PARTS.index(name)])
        return start, start + sizes[name]

    def projections(self) -> list[nn.Module]:
        """The distinct modules producing Q, K and V (one when fused)."""
        return list({id(m): m for m in (self.query, self.key, self.value)}.values())

    def check_shapes(self) -> str | None:
        """Why the weights do not fit this block's description (heads x head size, layout), or None.

        A checkpoint whose fused Q/K/V or O has another width than its config's head counts say would otherwise be
        cut along the wrong rows; the adapter refuses it instead (``arch.registry.adapt``)."""
        d = self.head_size
        for module in self.projections():
            name = next(p for p in PARTS if getattr(self, p) is module)
            want = len(self.chunks(name)) * d
            if out_features(module) != want:
                what = "fused Q/K/V" if self.fused else name
                return (f"block {self.index}: its {what} projection has {out_features(module)} output features, but "
                        f"{self.n_live} query and {self.n_kv_live} key/value heads of size {d} "
                        f"({self.layout if self.fused else 'separate'} layout) need {want}")
        if in_features(self.output) != self.n_live * d:
            return (f"block {self.index}: its output projection reads {in_features(self.output)} features, but "
                    f"{self.n_live} heads of size {d} make {self.n_live * d}")
        return None

    def kv_of_position(self) -> list[int]:
        """For each physical query position, the physical key/value head it reads (stock ``repeat_kv`` order)."""
        if not self.kept or not self.kv_sources:
            return []
        g = self.n_live // self.n_kv_live
        return [p // g for p in range(self.n_live)]

    def part_layout(self, name: str) -> tuple[int, list[int]]:
        """(head slots held by the rows of part ``name``, the slot each physical query position reads).

        Normally Q holds the live query heads in weight order and K/V the physical key/value heads; where a norm
        spans all heads (``norm_spans_heads``) Q and K keep every original head and group, read by original id.
        """
        if self.norm_spans_heads and name == "query":
            return self.n_heads, list(self.kept)
        if self.norm_spans_heads and name == "key":
            return self.n_kv_heads, [self.group_of(h) for h in self.kept]
        if name == "query":
            return self.n_live, list(range(self.n_live))
        return self.n_kv_live, self.kv_of_position()


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
    # True when the core module also applies the O projection (decoders, ALBERT, DistilBERT); False when O
    # sits in a sibling "SelfOutput" module (BERT family).
    core_applies_output: bool
    family: str = ""
    causal: bool = False                 # decoder self-attention: query t sees keys <= t
    # What one layer returns, given its output hidden states (a bare tensor, or DeBERTa's (hidden, attn)).
    layer_output: Callable[[torch.Tensor], Any] = field(default=lambda hidden: hidden)
    # Modules skipped (with the given forward wrapper) while a forward replays from a layer above 0.
    replay_bypass: dict[nn.Module, Callable[..., Any]] = field(default_factory=dict)
    # Per forward layer, a short label of its attention kind ("full", "sliding") when layers differ; else None.
    layer_kinds: list[str] | None = None
    # True when the stock forward must be told to return attention probabilities (DeBERTa).
    needs_output_attentions: bool = False
    # Paths this model cannot take, each with the reason said to the user: "kv" (KV cache plans, which replace
    # transformers' registered attention functions: GPT-J and GPT-Neo compute attention in their own code, so a
    # plan would be silently ignored) or a criterion's name (Longformer's "taylor"). Read before weights load too
    # (``loading.declared_adapter``), so a refused path costs no waiting.
    refuses: dict[str, str] = field(default_factory=dict)
    # (block, core args, core kwargs, core output) -> (B, h_live, T, T) probabilities, for a core whose own output
    # is not that (Longformer's banded local + global form); None: the core's second output is the map.
    attention_probs: Callable[..., Any] | None = None
    # True when the cores' projections see (T, B, features) rather than (B, T, features) (Longformer).
    sequence_first: bool = False

    @property
    def grid_shape(self) -> tuple[int, int]:
        return (len(self.blocks), self.n_heads)

    @property
    def unit_name(self) -> str:
        return "tied head (all layers)" if self.tied else "head"

    @property
    def n_kv_heads(self) -> int:
        return self.blocks[0].n_kv_heads if self.blocks else 0

    @property
    def grouped(self) -> bool:
        """True for grouped-query attention (fewer key/value heads than query heads)."""
        return any(b.n_kv_heads != b.n_heads for b in self.blocks)

    def live_grid(self) -> torch.Tensor:
        """Bool tensor (n_blocks, n_heads): which original heads are still physically present."""
        live = torch.zeros(self.grid_shape, dtype=torch.bool)
        for b in self.blocks:
            live[b.index, b.kept] = True
        return live

    def group_grid(self) -> torch.Tensor:
        """Long tensor (n_blocks, n_heads): the original key/value group of every query head."""
        return torch.tensor([[b.group_of(h) for h in range(self.n_heads)] for b in self.blocks], dtype=torch.long)


def find_layers(model: nn.Module, core_of: Callable[[nn.Module], Any], needs: tuple[str, ...]) -> nn.ModuleList | None:
    """The first ModuleList of layers whose attention core (``core_of(layer)``, None when absent) has every
    attribute in ``needs``: how a family recognises its layers from modules, never from names."""
    for module in model.modules():
        for child in module.children():
            if isinstance(child, nn.ModuleList) and len(child) > 0:
                core = core_of(child[0])
                if core is not None and all(hasattr(core, a) for a in needs):
                    return child
    return None


def own_attention_refusal(family: str) -> str:
    """Why a family whose cores compute attention in their own code cannot take a KV cache plan (``refuses["kv"]``)."""
    return (f"{family} computes attention in its own code rather than through transformers' registered attention "
            "functions, which a KV cache plan replaces; the plan would be silently ignored, so it is refused. KV "
            "plans work on decoders that call those functions (Llama, Qwen, Mistral, Gemma, Phi, OPT, OLMo, "
            "gpt-oss, GPT-NeoX / Pythia, ...).")


def kept_heads(model: nn.Module, block_index: int, n_heads: int) -> list[int]:
    """Original query heads physically present in block ``block_index`` (recorded by surgery in the config)."""
    recorded = getattr(model.config, "headprune_kept_heads", None) or {}
    kept = recorded.get(str(block_index), recorded.get(block_index))
    return list(range(n_heads)) if kept is None else [int(h) for h in kept]


def kv_sources(model: nn.Module, block_index: int, n_heads: int, n_kv_heads: int, kept: list[int]) -> list[int]:
    """Original group held by each physical key/value head (recorded by surgery; else derived from ``kept``)."""
    recorded = getattr(model.config, "headprune_kv_sources", None) or {}
    sources = recorded.get(str(block_index), recorded.get(block_index))
    if sources is not None:
        return [int(g) for g in sources]
    if n_kv_heads == n_heads:
        return list(kept)
    group_size = n_heads // n_kv_heads
    return sorted({h // group_size for h in kept})


def make_block(model: nn.Module, index: int, core: nn.Module, parts: tuple, head_size: int, n_heads: int,
               n_kv_heads: int, **behaviour) -> AttentionBlock:
    """Block ``index`` of ``model`` with Q/K/V/O ``parts``, its kept heads and key/value sources as surgery recorded
    them in the config (all heads of an uncut model), and the family's ``behaviour`` (AttentionBlock's fields)."""
    kept = kept_heads(model, index, n_heads)
    return AttentionBlock(index, core, *parts, head_size, kept, n_heads, n_kv_heads,
                          kv_sources(model, index, n_heads, n_kv_heads, kept), **behaviour)


def empty_context(args: tuple, kwargs: dict) -> torch.Tensor:
    """The (..., 0) context of a core with no heads, shaped like its hidden-states input."""
    hidden = args[0] if args else kwargs["hidden_states"]
    return hidden.new_zeros(*hidden.shape[:-1], 0)


def submodule(path: str) -> Callable[[nn.Module], nn.Module | None]:
    """A function giving ``layer.<path>`` (a dotted attribute path), or None where the layer lacks a step of it."""

    def find(layer: nn.Module) -> nn.Module | None:
        for name in path.split("."):
            layer = getattr(layer, name, None)
        return layer

    return find


def rotary_attention(core: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     position_embeddings, attention_mask, past_key_values, window: int | None, **kwargs):
    """The tail every rotary decoder's attention forward shares (transformers 5.23's Llama-style cores), for the
    forwards headprune installs on cut cores: rotary on Q and K (the core's own module's ``apply_rotary_pos_emb``),
    the cache update, then the registered attention function (the model's ``_attn_implementation``, so a KV plan's
    restriction applies). Returns (the heads' context (B, T, H_live * d), attention weights or None)."""
    mod = sys.modules[type(core).__module__]
    cos, sin = position_embeddings
    query, key = mod.apply_rotary_pos_emb(query, key, cos, sin)
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, core.layer_idx)
    interface = mod.ALL_ATTENTION_FUNCTIONS.get_interface(core.config._attn_implementation,
                                                          mod.eager_attention_forward)
    out, weights = interface(core, query, key, value, attention_mask,
                             dropout=0.0 if not core.training else core.attention_dropout, scaling=core.scaling,
                             **({"sliding_window": window} if window is not None else {}), **kwargs)
    return out.reshape(*query.shape[:1], query.shape[2], -1).contiguous(), weights
