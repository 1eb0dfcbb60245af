"""A mixed KV cache for generation: full heads keep every key/value, streaming heads keep S + W.

:class:`MixedLayer` stores, per layer, the key/value heads of full groups as (B, n_full, T, d) tensors that grow
like transformers' ``DynamicLayer``, and those of streaming groups as (B, n_stream, <= S + W, d) tensors with
their token positions; ``update`` hands both to the attention function as a ``restrict.SplitKV`` and then drops
the streaming keys no later query can see. :func:`generate` runs a greedy or seeded sampling loop over a model
with the full cache, the full cache under the plan's restriction, or the mixed cache, timing the first token and
each later one, and measuring the cache's bytes from its tensors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

from .restrict import CONFIG_KEY, SplitKV

MODES = ("full", "restricted", "mixed")


class MixedLayer(CacheLayerMixin):
    """One layer of a :class:`MixedCache`. ``kv_stream``: per physical key/value head, does it stream?"""

    is_sliding = False

    def __init__(self, kv_stream: list[bool], sink: int, window: int):
        super().__init__()
        self.full_heads = [j for j, s in enumerate(kv_stream) if not s]
        self.stream_heads = [j for j, s in enumerate(kv_stream) if s]
        self.sink, self.window, self.length = sink, window, 0
        self.full_k = self.full_v = self.stream_k = self.stream_v = self.positions = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, _, _, d = key_states.shape
        empty = lambda n: key_states.new_zeros(b, n, 0, d)  # noqa: E731
        self.full_k, self.full_v = empty(len(self.full_heads)), empty(len(self.full_heads))
        self.stream_k, self.stream_v = empty(len(self.stream_heads)), empty(len(self.stream_heads))
        self.positions = torch.zeros(0, dtype=torch.long, device=key_states.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append (B, H_kv, T_new, d) keys/values; returns (split, split), both the :class:`SplitKV` of this layer
        (the attention function reads keys and values from the one object)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t_new = key_states.shape[-2]
        self.full_k = torch.cat([self.full_k, key_states[:, self.full_heads]], dim=-2)
        self.full_v = torch.cat([self.full_v, value_states[:, self.full_heads]], dim=-2)
        stream_k = torch.cat([self.stream_k, key_states[:, self.stream_heads]], dim=-2)
        stream_v = torch.cat([self.stream_v, value_states[:, self.stream_heads]], dim=-2)
        positions = torch.cat([self.positions, torch.arange(self.length, self.length + t_new,
                                                            device=self.positions.device)])
        self.length += t_new
        split = SplitKV(self.full_k, self.full_v, stream_k, stream_v, positions, self.full_heads,
                        self.stream_heads, self.length)
        # a later query q >= length sees p < S or p > q - W >= length - W: the last W keys suffice
        keep = (positions < self.sink) | (positions >= self.length - self.window)
        if bool(keep.all()):
            self.stream_k, self.stream_v, self.positions = stream_k, stream_v, positions
        else:
            self.stream_k, self.stream_v = stream_k[:, :, keep].contiguous(), stream_v[:, :, keep].contiguous()
            self.positions = positions[keep]
        return split, split

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0   # the mask spans every position; streaming heads gather theirs

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.full_k, self.full_v, self.stream_k, self.stream_v) if t is not None]


class MixedCache(Cache):
    """A transformers ``Cache`` of :class:`MixedLayer` s, one per layer of a ``restrict.restricted`` copy."""

    def __init__(self, model):
        specs = getattr(model.config, CONFIG_KEY)
        super().__init__(layers=[MixedLayer(specs[i]["kv_stream"], specs[i]["sink"], specs[i]["window"])
                                 for i in range(len(specs))])


def cache_bytes(cache: Cache) -> int:
    """Bytes held by a cache's key/value tensors (measured from the tensors, not counted from a plan)."""
    total = 0
    for layer in cache.layers:
        tensors = layer.tensors() if isinstance(layer, MixedLayer) else [layer.keys, layer.values]
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

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "kv_bytes": self.kv_bytes, "time_to_first_token_s": self.first_token_s,
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
                      sum(later) / len(later) if later else 0.0, mode)
