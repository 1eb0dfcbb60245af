"""A mixed KV cache for generation: full heads keep every key/value, streaming heads keep S + W.

:class:`MixedLayer` stores, per layer, the key/value heads of full groups in a (B, n_full, capacity, d) buffer
that grows by a quarter when full, and those of streaming groups in S + W slots (B, n_stream, S + W, d), a ring
with each slot's token position; ``update`` writes the new keys in place and hands both parts to the attention
function as a ``restrict.SplitKV``, so a decode step copies only its own key/value (``torch.cat`` copied the whole
cache every step). :func:`generate` runs a greedy or seeded sampling loop over a model with the full cache, the
full cache under the plan's restriction, or the mixed cache, timing the first token and each later one, and
measuring the cache's bytes from its tensors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

from .restrict import CONFIG_KEY, SplitKV

MODES = ("full", "restricted", "mixed")
GROWTH, MIN_GROWTH = 0.25, 256   # a full buffer grows by a quarter of itself, at least 256 tokens


class MixedLayer(CacheLayerMixin):
    """One layer of a :class:`MixedCache`. ``kv_stream``: per physical key/value head, does it stream?

    Preallocated, so a decode step copies only its own key/value. Full heads write into a buffer (B, n_full,
    capacity, d) that grows geometrically when it runs out, by GROWTH of itself (amortised O(1) copies per token
    instead of ``torch.cat`` copying the whole cache every step; a quarter, not a doubling, so the spare capacity
    stays within 25 % of what the plan saves). Streaming heads hold S + W slots (B, n_stream, S + W, d): position
    p < S in slot p (the sinks), a later one in slot S + (p - S) mod W (a ring: the new key overwrites position
    p - W, which no query from p on can see), each slot's position in ``slot_positions``. The attention function
    masks by position, so the ring's order does not matter.
    """

    is_sliding = False

    def __init__(self, kv_stream: list[bool], sink: int, window: int):
        super().__init__()
        self.full_heads = [j for j, s in enumerate(kv_stream) if not s]
        self.stream_heads = [j for j, s in enumerate(kv_stream) if s]
        self.sink, self.window, self.length = sink, window, 0
        self.full_k_buf = self.full_v_buf = self.stream_k_buf = self.stream_v_buf = self.slot_positions = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, _, _, d = key_states.shape
        empty = lambda n, t: key_states.new_zeros(b, n, t, d)  # noqa: E731
        self.full_k_buf, self.full_v_buf = empty(len(self.full_heads), 0), empty(len(self.full_heads), 0)
        slots = self.sink + self.window
        self.stream_k_buf, self.stream_v_buf = empty(len(self.stream_heads), slots), empty(len(self.stream_heads),
                                                                                           slots)
        self.slot_positions = torch.full((slots,), -1, dtype=torch.long, device=key_states.device)
        self.is_initialized = True

    # -- what the layer holds (views of the buffers) ---------------------------------------------------------------
    @property
    def full_k(self) -> torch.Tensor:
        return self.full_k_buf[:, :, :self.length]

    @property
    def full_v(self) -> torch.Tensor:
        return self.full_v_buf[:, :, :self.length]

    @property
    def held(self) -> int:
        """Streaming slots in use: they fill in order until all S + W are."""
        return min(self.length, self.sink + self.window)

    @property
    def stream_k(self) -> torch.Tensor:
        return self.stream_k_buf[:, :, :self.held]

    @property
    def stream_v(self) -> torch.Tensor:
        return self.stream_v_buf[:, :, :self.held]

    @property
    def positions(self) -> torch.Tensor:
        return self.slot_positions[:self.held]

    def slot(self, positions: torch.Tensor) -> torch.Tensor:
        return torch.where(positions < self.sink, positions, self.sink + (positions - self.sink) % self.window)

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
        t_new = key_states.shape[-2]
        new_k, new_v = key_states[:, self.stream_heads], value_states[:, self.stream_heads]
        new_pos = torch.arange(self.length, self.length + t_new, device=self.slot_positions.device)
        self.append_full(key_states[:, self.full_heads], value_states[:, self.full_heads])
        if t_new > 1:
            # queries of a chunk may need keys its own later tokens push out of the ring: this step reads the
            # held keys and the whole chunk (a copy, once per chunk), the ring keeps what later queries can see
            stream_k = torch.cat([self.stream_k, new_k], dim=-2)
            stream_v = torch.cat([self.stream_v, new_v], dim=-2)
            positions = torch.cat([self.positions, new_pos])
        end = self.length + t_new
        # a later query q >= end sees p < S or p > q - W >= end - W: the sinks and the last W keys suffice
        keep = (new_pos < self.sink) | (new_pos >= end - self.window)
        slots = self.slot(new_pos[keep])
        self.stream_k_buf[:, :, slots] = new_k[:, :, keep]
        self.stream_v_buf[:, :, slots] = new_v[:, :, keep]
        self.slot_positions[slots] = new_pos[keep]
        self.length = end
        if t_new == 1:   # the one new query sees every slot held: the ring after the write is what it reads
            stream_k, stream_v, positions = self.stream_k, self.stream_v, self.positions
        split = SplitKV(self.full_k, self.full_v, stream_k, stream_v, positions, self.full_heads,
                        self.stream_heads, self.length)
        return split, split

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0   # the mask spans every position; streaming heads gather theirs

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def tensors(self, allocated: bool = False) -> list[torch.Tensor]:
        """The keys/values held (views), or with ``allocated`` the buffers behind them (spare capacity included)."""
        if not self.is_initialized:
            return []
        if allocated:
            return [self.full_k_buf, self.full_v_buf, self.stream_k_buf, self.stream_v_buf]
        return [self.full_k, self.full_v, self.stream_k, self.stream_v]


class MixedCache(Cache):
    """A transformers ``Cache`` of :class:`MixedLayer` s, one per layer of a ``restrict.restricted`` copy."""

    def __init__(self, model):
        specs = getattr(model.config, CONFIG_KEY)
        super().__init__(layers=[MixedLayer(specs[i]["kv_stream"], specs[i]["sink"], specs[i]["window"])
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
                chunk: int = 1024) -> None:
    """Put ``length`` random keys/values into every layer of ``cache`` (shape: layers, H_kv, head dim), in chunks:
    a long prompt's cache for timing decode steps without a prefill forward (which the contents do not change)."""
    n_layers, n_kv, d = shape
    gen = torch.Generator().manual_seed(seed)
    for start in range(0, length, chunk):
        t = min(chunk, length - start)
        for layer in range(n_layers):
            k = torch.randn(1, n_kv, t, d, generator=gen, dtype=dtype)
            cache.update(k, torch.randn(1, n_kv, t, d, generator=gen, dtype=dtype), layer)


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
             prefill_chunk: int | None = None) -> Generation:
    """Generate after ``input_ids`` (1, T) with greedy decoding or seeded sampling.

    ``model``: the loaded model for ``mode="full"``, a ``restrict.restricted`` copy for ``"restricted"`` (ordinary
    cache, restriction by mask) and ``"mixed"`` (:class:`MixedCache`). ``cache``: a pre-filled cache to continue
    (``fill_random``), else a new one. ``prefill_chunk``: prompt tokens per forward (bounds the T_q x T_k masks).
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
            token = torch.multinomial(torch.softmax(last / temperature, dim=-1), 1, generator=gen)
        else:
            token = last.argmax(-1, keepdim=True)
        tokens.append(int(token))
        times.append(time.perf_counter() - start)
        if i + 1 == max_new_tokens:
            break
        start = time.perf_counter()
        logits = model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    later = times[1:]
    return Generation(tokens, cache_bytes(cache), times[0] if times else 0.0,
                      sum(later) / len(later) if later else 0.0, mode, cache_bytes(cache, allocated=True))
