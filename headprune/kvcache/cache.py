"""A mixed KV cache for generation: full heads keep every key/value, streaming heads keep S + W.

:class:`MixedLayer` stores, per layer, the key/value heads of full groups in a (B, n_full, capacity, d) buffer
that grows by a quarter when full, and those of streaming groups in S + W slots (B, n_stream, S + W, d), a ring
with each slot's token position (one ring per distinct window: a budget plan's groups keep S + W_g each);
``update`` writes the new keys in place and hands every part to the attention function as a ``restrict.SplitKV``,
so a decode step copies only its own key/value (``torch.cat`` copied the whole
cache every step). :func:`generate` runs a greedy or seeded sampling loop over a model with the full cache, the
full cache under the plan's restriction, or the mixed cache, timing the first token and each later one, and
measuring the cache's bytes from its tensors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

from .plan import KVPlanError
from .restrict import CONFIG_KEY, Dropped, KVPart, SplitKV

MODES = ("full", "restricted", "mixed")
GROWTH, MIN_GROWTH = 0.25, 256   # a full buffer grows by a quarter of itself, at least 256 tokens


# slots a ring allocates before any token arrives (more as positions need them, up to S + W)
RING_START = 4096


class Ring:
    """The S + W slots of the streaming heads sharing one window W: (B, n, S + W, d) keys and values. Position
    p < S sits in slot p (the sinks), a later one in slot S + (p - S) mod W (a ring: the new key overwrites position
    p - W, which no query from p on can see); ``slot_positions`` holds each slot's position. The attention function
    masks by position, so the ring's order does not matter. With ``compensation`` (RazorAttention's token,
    ``restrict`` module doc) the ring also keeps the float64 sums of every key and value it dropped and their count
    (``dropped``): 2 x d numbers per head beside its S + W slots, whatever the length."""

    def __init__(self, heads: list[int], sink: int, window: int, like: torch.Tensor, compensation: bool = False):
        b, _, _, d = like.shape
        self.heads, self.sink, self.window = heads, sink, window
        # a window longer than any generation (W = 10**9) must not allocate S + W slots up front: start with at most
        # RING_START slots and grow by doubling up to S + W as positions arrive (slots fill in order, see held)
        slots = min(sink + window, RING_START)
        self.k_buf, self.v_buf = like.new_zeros(b, len(heads), slots, d), like.new_zeros(b, len(heads), slots, d)
        self.slot_positions = torch.full((slots,), -1, dtype=torch.long, device=like.device)
        self.dropped = None
        if compensation:
            zeros = like.new_zeros(b, len(heads), d, dtype=torch.float64)
            self.dropped = Dropped(zeros, zeros.clone(), 0)

    def grow(self, needed: int) -> None:
        """Room for slot ``needed - 1``: the buffers doubled (at most S + W) until it fits."""
        have = self.k_buf.shape[2]
        if needed <= have:
            return
        size = min(max(needed, 2 * have), self.sink + self.window)
        extra = size - have
        pad = lambda t: torch.cat([t, t.new_zeros(*t.shape[:2], extra, t.shape[3])], dim=2)  # noqa: E731
        self.k_buf, self.v_buf = pad(self.k_buf), pad(self.v_buf)
        self.slot_positions = torch.cat([self.slot_positions, self.slot_positions.new_full((extra,), -1)])

    def fold(self, keys: torch.Tensor, values: torch.Tensor, new_pos: torch.Tensor, length: int, end: int) -> None:
        """Add to ``dropped`` the keys that leave the window once the tokens up to ``end`` are in: positions
        S <= p <= end - 1 - W not dropped before (those held, p >= length - W, and the new ones)."""
        held_k, held_v, held_pos = self.views(length)
        last = end - 1 - self.window
        for k, v, pos in ((held_k, held_v, held_pos), (keys, values, new_pos)):
            leaving = (pos >= self.sink) & (pos <= last)
            if bool(leaving.any()):
                self.dropped.k_sum += k[:, :, leaving].double().sum(-2)
                self.dropped.v_sum += v[:, :, leaving].double().sum(-2)
                self.dropped.count += int(leaving.sum())

    def snapshot(self) -> Dropped | None:
        d = self.dropped
        return None if d is None else Dropped(d.k_sum.clone(), d.v_sum.clone(), d.count)

    def held(self, length: int) -> int:
        """Slots in use after ``length`` tokens: they fill in order until all S + W are."""
        return min(length, self.sink + self.window)

    def views(self, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = self.held(length)
        return self.k_buf[:, :, :n], self.v_buf[:, :, :n], self.slot_positions[:n]

    def write(self, keys: torch.Tensor, values: torch.Tensor, new_pos: torch.Tensor, end: int) -> None:
        # a later query q >= end sees p < S or p > q - W >= end - W: the sinks and the last W keys suffice
        keep = (new_pos < self.sink) | (new_pos >= end - self.window)
        pos = new_pos[keep]
        slots = torch.where(pos < self.sink, pos, self.sink + (pos - self.sink) % self.window)
        if slots.numel():
            self.grow(int(slots.max()) + 1)
        self.k_buf[:, :, slots] = keys[:, :, keep]
        self.v_buf[:, :, slots] = values[:, :, keep]
        self.slot_positions[slots] = pos


class MixedLayer(CacheLayerMixin):
    """One layer of a :class:`MixedCache`. ``kv_stream``: per physical key/value head, does it stream?
    ``kv_windows``: its window W (one per head: a budget plan's groups differ; default ``window`` for all).

    Preallocated, so a decode step copies only its own key/value. Full heads write into a buffer (B, n_full,
    capacity, d) that grows geometrically when it runs out, by GROWTH of itself (amortised O(1) copies per token
    instead of ``torch.cat`` copying the whole cache every step; a quarter, not a doubling, so the spare capacity
    stays within 25 % of what the plan saves). Streaming heads sharing a window W hold one :class:`Ring` of S + W
    slots, so a budget plan keeps exactly S + W_g keys per group.
    """

    is_sliding = False

    def __init__(self, kv_stream: list[bool], sink: int, window: int | None = None,
                 kv_windows: list[int] | None = None, compensation: bool = False):
        super().__init__()
        self.compensation = compensation
        self.full_heads = [j for j, s in enumerate(kv_stream) if not s]
        kv_windows = [window] * len(kv_stream) if kv_windows is None else kv_windows
        by_window: dict[int, list[int]] = {}
        for j, s in enumerate(kv_stream):
            if s:
                by_window.setdefault(int(kv_windows[j]), []).append(j)
        self.windows = dict(sorted(by_window.items()))     # W -> the heads streaming at W
        self.stream_heads = [j for heads in self.windows.values() for j in heads]
        self.sink, self.length = sink, 0
        self.full_k_buf = self.full_v_buf = None
        self.rings: list[Ring] = []

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, _, _, d = key_states.shape
        if b > 1:
            # rows of a batch would share one position counter and one ring order; padded rows sit at other
            # positions than their tokens' indices, so a batch is refused rather than attended wrongly
            raise KVPlanError(f"The mixed KV cache generates one row at a time; got a batch of {b}. Generate each "
                              "prompt on its own (or use the restricted full cache, mode='restricted').")
        self.full_k_buf = key_states.new_zeros(b, len(self.full_heads), 0, d)
        self.full_v_buf = key_states.new_zeros(b, len(self.full_heads), 0, d)
        self.rings = [Ring(heads, self.sink, window, key_states, self.compensation)
                      for window, heads in self.windows.items()]
        self.is_initialized = True

    # -- what the layer holds (views of the buffers) ---------------------------------------------------------------
    @property
    def full_k(self) -> torch.Tensor:
        return self.full_k_buf[:, :, :self.length]

    @property
    def full_v(self) -> torch.Tensor:
        return self.full_v_buf[:, :, :self.length]

    def one_ring(self) -> Ring:
        if len(self.rings) != 1:
            raise KVPlanError(f"This layer streams at {len(self.rings)} windows; read its rings one by one.")
        return self.rings[0]

    @property
    def stream_k(self) -> torch.Tensor:
        """The streaming keys held, for a layer of one window (a one-window plan)."""
        return self.one_ring().views(self.length)[0]

    @property
    def stream_v(self) -> torch.Tensor:
        return self.one_ring().views(self.length)[1]

    @property
    def positions(self) -> torch.Tensor:
        return self.one_ring().views(self.length)[2]

    def append_full(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        end = self.length + keys.shape[-2]
        if end > self.full_k_buf.shape[-2]:
            held = self.full_k_buf.shape[-2]
            capacity = max(end, held + max(int(GROWTH * held), MIN_GROWTH))
            for name in ("full_k_buf", "full_v_buf"):
                old = getattr(self, name)
                grown = old.new_empty(*old.shape[:2], capacity, old.shape[-1])
                grown[:, :, :self.length] = old[:, :, :self.length]
                setattr(self, name, grown)
        self.full_k_buf[:, :, self.length:end] = keys
        self.full_v_buf[:, :, self.length:end] = values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append (B, H_kv, T_new, d) keys/values; returns (split, split), both the :class:`SplitKV` of this layer
        (the attention function reads keys and values from the one object)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t_new, end = key_states.shape[-2], self.length + key_states.shape[-2]
        new_pos = torch.arange(self.length, end, device=key_states.device)
        self.append_full(key_states[:, self.full_heads], value_states[:, self.full_heads])
        parts = [KVPart(self.full_heads, self.full_k_buf[:, :, :end], self.full_v_buf[:, :, :end],
                        torch.arange(end, device=key_states.device), None)]
        for ring in self.rings:
            new_k, new_v = key_states[:, ring.heads], value_states[:, ring.heads]
            if t_new > 1:
                # queries of a chunk may need keys its own later tokens push out of the ring: this step reads the
                # held keys and the whole chunk (a copy, once per chunk), the ring keeps what later queries can see;
                # a compensation token reads what was dropped before the chunk (the chunk's own drops per query)
                k, v, positions = ring.views(self.length)
                k, v = torch.cat([k, new_k], dim=-2), torch.cat([v, new_v], dim=-2)
                positions = torch.cat([positions, new_pos])
                dropped = ring.snapshot()
            if ring.dropped is not None:
                ring.fold(new_k, new_v, new_pos, self.length, end)
            ring.write(new_k, new_v, new_pos, end)
            if t_new == 1:   # the one new query sees every slot held: the ring after the write is what it reads
                k, v, positions = ring.views(end)
                dropped = ring.dropped
            parts.append(KVPart(ring.heads, k, v, positions, ring.window, dropped))
        self.length = end
        split = SplitKV(parts, end)
        return split, split

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0   # the mask spans every position; streaming heads gather theirs

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def tensors(self, allocated: bool = False) -> list[torch.Tensor]:
        """The keys/values held (views), or with ``allocated`` the buffers behind them (spare capacity included);
        a compensation token's running sums count in both."""
        if not self.is_initialized:
            return []
        sums = [t for r in self.rings if r.dropped is not None for t in (r.dropped.k_sum, r.dropped.v_sum)]
        if allocated:
            return [self.full_k_buf, self.full_v_buf] + [t for r in self.rings for t in (r.k_buf, r.v_buf)] + sums
        return [self.full_k, self.full_v] + [t for r in self.rings for t in r.views(self.length)[:2]] + sums


class MixedCache(Cache):
    """A transformers ``Cache`` of :class:`MixedLayer` s, one per layer of a ``restrict.restricted`` copy."""

    def __init__(self, model):
        specs = getattr(model.config, CONFIG_KEY)
        super().__init__(layers=[MixedLayer(specs[i]["kv_stream"], specs[i]["sink"], kv_windows=specs[i]["kv_windows"],
                                            compensation=specs[i].get("compensation", False))
                                 for i in range(len(specs))])


def cache_bytes(cache: Cache, allocated: bool = False) -> int:
    """Bytes held by a cache's key/value tensors (measured from the tensors, not counted from a plan); with
    ``allocated``, a mixed cache's buffers whole (the full heads' spare capacity included)."""
    total = 0
    for layer in cache.layers:
        tensors = layer.tensors(allocated) if isinstance(layer, MixedLayer) else [layer.keys, layer.values]
        total += sum(t.numel() * t.element_size() for t in tensors if t is not None)
    return total


def new_cache(model, mode: str) -> Cache:
    """The stock cache for ``"full"``; for ``"restricted"`` one growing layer per layer whatever the config says
    (a sliding-window layer's cache would drop the first keys, and the restriction reads key index = position;
    the sliding window is still applied by the model's mask); a :class:`MixedCache` for ``"mixed"``."""
    if mode == "mixed":
        return MixedCache(model)
    return DynamicCache(config=model.config) if mode == "full" else DynamicCache()


@torch.no_grad()
def fill_random(cache: Cache, shape: tuple[int, int, int], length: int, dtype=torch.float32, seed: int = 0,
                chunk: int = 1024, device: torch.device | str = "cpu") -> None:
    """Put ``length`` random keys/values into every layer of ``cache`` (shape: layers, H_kv, head dim), in chunks:
    a long prompt's cache for timing decode steps without a prefill forward (which the contents do not change).
    Drawn on the CPU (the same values for a seed on any device), then moved to ``device``, the model's."""
    n_layers, n_kv, d = shape
    gen = torch.Generator().manual_seed(seed)
    for start in range(0, length, chunk):
        t = min(chunk, length - start)
        for layer in range(n_layers):
            k = torch.randn(1, n_kv, t, d, generator=gen, dtype=dtype).to(device)
            cache.update(k, torch.randn(1, n_kv, t, d, generator=gen, dtype=dtype).to(device), layer)


@dataclass
class Generation:
    tokens: list[int]
    kv_bytes: int                   # measured from the cache tensors after the last step
    first_token_s: float            # prompt forward + first token
    per_token_s: float              # mean of the later steps
    mode: str
    kv_bytes_allocated: int = 0     # the buffers behind them (a mixed cache's full heads keep spare capacity)

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "kv_bytes": self.kv_bytes, "kv_bytes_allocated": self.kv_bytes_allocated,
                "time_to_first_token_s": self.first_token_s,
                "time_per_output_token_s": self.per_token_s, "cache": self.mode}


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, *, mode: str = "full", sample: bool = False,
             temperature: float = 1.0, seed: int = 0, cache: Cache | None = None,
             prefill_chunk: int | None = None, eos_token_id: int | None = None) -> Generation:
    """Generate after ``input_ids`` (1, T) with greedy decoding or seeded sampling.

    ``model``: the loaded model for ``mode="full"``, a ``restrict.restricted`` copy for ``"restricted"`` (ordinary
    cache, restriction by mask) and ``"mixed"`` (:class:`MixedCache`). ``cache``: a pre-filled cache to continue
    (``fill_random``), else a new one. ``prefill_chunk``: prompt tokens per forward (bounds the T_q x T_k masks).
    ``eos_token_id``: generation stops after this token (end of text), kept as the last of ``tokens``.
    """
    cache = new_cache(model, mode) if cache is None else cache
    gen = torch.Generator().manual_seed(seed)
    step = input_ids.shape[1] if prefill_chunk is None else prefill_chunk
    tokens, times = [], []
    start = time.perf_counter()
    for begin in range(0, input_ids.shape[1], step):
        logits = model(input_ids=input_ids[:, begin:begin + step], past_key_values=cache, use_cache=True,
                       logits_to_keep=1).logits
    for i in range(max_new_tokens):
        last = logits[:, -1].float()
        if sample:
            # drawn on the CPU with the CPU generator: the same seed gives the same tokens on any device (a
            # CUDA tensor cannot take a CPU generator at all)
            probs = torch.softmax(last / temperature, dim=-1).cpu()
            token = torch.multinomial(probs, 1, generator=gen).to(last.device)
        else:
            token = last.argmax(-1, keepdim=True)
        tokens.append(int(token))
        times.append(time.perf_counter() - start)
        if i + 1 == max_new_tokens or (eos_token_id is not None and tokens[-1] == eos_token_id):
            break
        start = time.perf_counter()
        logits = model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    later = times[1:]
    return Generation(tokens, cache_bytes(cache), times[0] if times else 0.0,
                      sum(later) / len(later) if later else 0.0, mode, cache_bytes(cache, allocated=True))
