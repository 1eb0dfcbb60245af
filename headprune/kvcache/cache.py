"""A mixed KV cache for generation: full heads keep every key/value, streaming heads keep S + W.

:class:`MixedLayer` holds, per layer, two static buffers: the key/value heads of the full groups in one contiguous
(B, n_full, capacity, d) buffer, and those of the streaming groups in one padded ring (B, n_stream, S + W_max, d)
whose slots hold each key's token position (-1 empty); a head streaming at W_h < W_max (a budget plan's groups) uses
its first S + W_h slots, the rest stay empty and masked. ``update`` writes the new keys by index (``index_copy_``,
``scatter_``) and hands both parts to the attention function as a ``restrict.SplitKV``: one attention call for the
full heads, one for the streaming heads, each head masked by position. A decode step is the same short list of
tensor operations whatever the plan -- no loop over heads or windows, no read of a tensor's value on the host -- so
it can be captured by ``torch.compile`` (a CUDA graph on a GPU).

Why one padded ring rather than one ring per window: one ring is one scatter and one attention call per layer, what
a compiled step needs; the padding costs memory only where a budget plan's windows differ (``cache_bytes`` counts
the slots in use, ``allocated=True`` the padded buffers), and attention reads the padding as masked slots.

Two ways to size the full heads' buffer: given ``max_cache_len`` (static: the compiled path, like transformers'
``StaticCache``) it is allocated once and the full heads attend over all of it, the model's causal mask hiding the
slots not yet written; without it the buffer grows by a quarter (at least 256 tokens) when full and a step attends
over the tokens held. :func:`generate` runs a greedy or seeded sampling loop over a model with the full cache, the
full cache under the plan's restriction, or the mixed cache, eagerly or compiled, timing the first token and each
later one, and measuring the cache's bytes from its tensors.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, StaticCache

from .plan import KVPlanError
from .restrict import CONFIG_KEY, Dropped, SplitKV, chunk_entries, entry_parts

MODES = ("full", "restricted", "mixed")
GROWTH, MIN_GROWTH = 0.25, 256   # a full buffer grows by a quarter of itself, at least 256 tokens


# ring slots allocated before any token arrives in a growing cache (more as positions need them, up to S + W_max):
# a window longer than any generation (W = 10**9) must not allocate S + W slots up front
RING_START = 4096


def static_address(*tensors: torch.Tensor) -> None:
    """Tell dynamo these buffers keep their address (a CUDA graph replays into them); not while tracing."""
    if not torch.compiler.is_compiling():
        for t in tensors:
            torch._dynamo.mark_static_address(t)


class MixedLayer(CacheLayerMixin):
    """One layer of a :class:`MixedCache`. ``kv_stream``: per physical key/value head, does it stream?
    ``kv_windows``: its window W (one per head: a budget plan's groups differ; default ``window`` for all);
    ``max_cache_len``: the static size of the full heads' buffer (None: it grows). Module doc for the layout.

    Slots of a streaming head with window W: position p < S sits in slot p (the sinks), a later one in slot
    S + (p - S) mod W (a ring: the new key overwrites position p - W, which no query from p on can see). With
    ``compensation`` (RazorAttention's token, ``restrict`` module doc) the layer also keeps the float64 sums of
    every key and value each head dropped and their count (``dropped``), and the ring one more slot, where a
    decode step writes the entry (their means) that the head's queries attend to with weight N_d."""

    is_sliding = False

    def __init__(self, kv_stream: list[bool], sink: int, window: int | None = None,
                 kv_windows: list[int] | None = None, compensation: bool = False, max_cache_len: int | None = None):
        super().__init__()
        kv_windows = [window] * len(kv_stream) if kv_windows is None else kv_windows
        self.full_heads = [j for j, s in enumerate(kv_stream) if not s]
        self.stream_heads = [j for j, s in enumerate(kv_stream) if s]
        self.stream_windows = [int(kv_windows[j]) for j in self.stream_heads]
        self.sink, self.length = sink, 0
        self.compensation = compensation and bool(self.stream_heads)
        self.max_cache_len = max_cache_len
        self.is_compileable = max_cache_len is not None
        # slots a streaming head can ever use: S + W_max, and never more than a static cache's tokens
        self.ring_slots = sink + max(self.stream_windows, default=0)
        if max_cache_len is not None:
            self.ring_slots = min(self.ring_slots, max_cache_len)
        self.rows_of: dict = {}
        self.dropped: Dropped | None = None

    # -- buffers ---------------------------------------------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, _, _, d = key_states.shape
        if b > 1:
            # rows of a batch would share one position counter and one ring order; padded rows sit at other
            # positions than their tokens' indices, so a batch is refused rather than attended wrongly
            raise KVPlanError(f"The mixed KV cache generates one row at a time; got a batch of {b}. Generate each "
                              "prompt on its own (or use the restricted full cache, mode='restricted').")
        device = key_states.device
        index = lambda heads: torch.tensor(heads, dtype=torch.long, device=device)  # noqa: E731
        self.full_index, self.stream_index = index(self.full_heads), index(self.stream_heads)
        self.windows = index(self.stream_windows)
        self.position = torch.zeros((), dtype=torch.long, device=device)   # tokens seen, on the device
        capacity = self.max_cache_len or 0
        self.full_k_buf = key_states.new_zeros(b, len(self.full_heads), capacity, d)
        self.full_v_buf = key_states.new_zeros(b, len(self.full_heads), capacity, d)
        slots = self.ring_slots if self.max_cache_len is not None else min(self.ring_slots, RING_START)
        extra = 1 if self.compensation else 0   # the compensation entry's slot, after the ring's
        self.ring_k = key_states.new_zeros(b, len(self.stream_heads), slots + extra, d)
        self.ring_v = key_states.new_zeros(b, len(self.stream_heads), slots + extra, d)
        self.slot_positions = torch.full((len(self.stream_heads), slots), -1, dtype=torch.long, device=device)
        if self.compensation:
            sums = key_states.new_zeros(b, len(self.stream_heads), d, dtype=torch.float64)
            self.dropped = Dropped(sums, sums.clone(), torch.zeros(len(self.stream_heads), dtype=torch.float64,
                                                                     device=device))
        if self.max_cache_len is not None:
            static_address(self.position, self.full_k_buf, self.full_v_buf, self.ring_k, self.ring_v,
                           self.slot_positions, *([self.dropped.k_sum, self.dropped.v_sum, self.dropped.count]
                                                  if self.dropped is not None else []))
        self.is_initialized = True

    @property
    def slots(self) -> int:
        """Ring slots allocated (a growing cache's ring doubles up to S + W_max)."""
        return self.slot_positions.shape[1]

    def grow(self, end: int) -> None:
        """A growing cache only (outside any compiled step): room for ``end`` tokens in the full heads' buffer (by
        GROWTH of itself, at least MIN_GROWTH) and in the ring (doubled, at most S + W_max)."""
        held = self.full_k_buf.shape[2]
        if end > held:   # grown even with no full head (0 bytes), so full_k always spans the tokens seen
            capacity = max(end, held + max(int(GROWTH * held), MIN_GROWTH))
            for name in ("full_k_buf", "full_v_buf"):
                old = getattr(self, name)
                grown = old.new_empty(*old.shape[:2], capacity, old.shape[-1])
                grown[:, :, :self.length] = old[:, :, :self.length]
                setattr(self, name, grown)
        needed = min(end, self.ring_slots)
        if self.stream_heads and needed > self.slots:
            extra = min(max(needed, 2 * self.slots), self.ring_slots) - self.slots
            pad = lambda t: torch.cat([t[:, :, :self.slots], t.new_zeros(*t.shape[:2], extra, t.shape[3]),  # noqa
                                       t[:, :, self.slots:]], dim=2)
            self.ring_k, self.ring_v = pad(self.ring_k), pad(self.ring_v)
            self.slot_positions = torch.cat([self.slot_positions,
                                             self.slot_positions.new_full((len(self.stream_heads), extra), -1)], 1)

    # -- one step --------------------------------------------------------------------------------------------------
    def rows(self, groups: int):
        """(query rows of the full heads, of the streaming heads, the order that puts [full, streaming] back), made
        once per layer: a query head reads key/value head j if its row is in j x groups .. (j + 1) x groups - 1."""
        if groups not in self.rows_of:
            device = self.position.device
            rows = lambda heads: torch.tensor([h * groups + i for h in heads for i in range(groups)],  # noqa: E731
                                              dtype=torch.long, device=device)
            full, stream = rows(self.full_heads), rows(self.stream_heads)
            self.rows_of[groups] = (full, stream, torch.argsort(torch.cat([full, stream])))
        return self.rows_of[groups]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write (B, H_kv, T_new, d) keys/values; returns (split, split), both the :class:`SplitKV` of this layer
        (the attention function reads keys and values from the one object). One token (a decode step): writes by
        index into the static buffers, tensor operations only. A chunk of a prompt: its queries may need keys its
        own later tokens push out of the ring, so they read the ring and the chunk (a copy, once per chunk)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t_new = key_states.shape[-2]
        if self.max_cache_len is None:
            self.grow(self.length + t_new)
        elif t_new > 1 and int(self.position) + t_new > self.max_cache_len:   # a prompt chunk: not a decode step
            raise KVPlanError(f"The static mixed cache holds {self.max_cache_len} tokens; "
                              f"{int(self.position) + t_new} asked for. Size it for the prompt and the new tokens.")
        q_pos = torch.arange(t_new, device=key_states.device) + self.position
        both = bool(self.full_heads) and bool(self.stream_heads)
        full = stream = positions = entry = None
        if self.full_heads:
            keys, values = ((key_states.index_select(1, self.full_index), value_states.index_select(1, self.full_index))
                            if both else (key_states, value_states))
            self.full_k_buf.index_copy_(2, q_pos, keys)
            self.full_v_buf.index_copy_(2, q_pos, values)
            end = self.length + t_new
            full = ((self.full_k_buf, self.full_v_buf) if self.max_cache_len is not None
                    else (self.full_k_buf[:, :, :end], self.full_v_buf[:, :, :end]))
        if self.stream_heads:
            keys, values = ((key_states.index_select(1, self.stream_index),
                             value_states.index_select(1, self.stream_index)) if both else (key_states, value_states))
            if t_new == 1:
                stream, positions, entry = self.decode_ring(keys, values, q_pos)
            else:
                stream, positions, entry = self.chunk_ring(keys, values, q_pos)
        self.position.add_(t_new)
        if self.max_cache_len is None:
            self.length += t_new
        split = SplitKV(full, stream, positions, self.windows if self.stream_heads else None, self.sink, q_pos,
                        entry, self.rows, self.position)
        return split, split

    def slot_of(self, q_pos: torch.Tensor) -> torch.Tensor:
        """(n_s,) the slot each streaming head writes position ``q_pos`` (1,) into."""
        return torch.where(q_pos < self.sink, q_pos, self.sink + (q_pos - self.sink) % self.windows)

    def decode_ring(self, keys: torch.Tensor, values: torch.Tensor, q_pos: torch.Tensor):
        """One token into the ring: the slot of each head by its window, written with one scatter; with the token,
        the key it overwrites (position p - W_h, when >= S) added to the head's dropped sums first."""
        b, n, _, d = keys.shape
        slots = self.slot_of(q_pos).view(n, 1)
        index = slots.view(1, n, 1, 1).expand(b, n, 1, d)
        entry = None
        if self.compensation:
            leaving = (self.slot_positions.gather(1, slots) >= self.sink).double()            # (n, 1)
            self.dropped.k_sum.addcmul_(self.ring_k.gather(2, index)[:, :, 0].double(), leaving)
            self.dropped.v_sum.addcmul_(self.ring_v.gather(2, index)[:, :, 0].double(), leaving)
            self.dropped.count.add_(leaving.view(n))
        self.ring_k.scatter_(2, index, keys)
        self.ring_v.scatter_(2, index, values)
        self.slot_positions.scatter_(1, slots, q_pos.expand(n, 1))
        if self.compensation:   # the entry's slot, after the ring's: the means of what each head dropped
            mean_k, mean_v, log_weight = entry_parts(self.dropped.k_sum, self.dropped.v_sum, self.dropped.count,
                                                     keys.dtype)
            self.ring_k[:, :, -1] = mean_k
            self.ring_v[:, :, -1] = mean_v
            entry = log_weight.view(n, 1, 1)
        return (self.ring_k, self.ring_v), self.slot_positions, entry

    def chunk_ring(self, keys: torch.Tensor, values: torch.Tensor, q_pos: torch.Tensor):
        """A chunk of T tokens: its queries read the ring's keys and the chunk's; then every slot takes the newest
        position of the chunk that maps to it (a gather: a position another one of the chunk overwrites is never
        written), and with the token the keys leaving the window are added to the dropped sums."""
        n, slots = len(self.stream_heads), self.slots
        held = (self.ring_k[:, :, :slots], self.ring_v[:, :, :slots])
        all_k, all_v = torch.cat([held[0], keys], dim=2), torch.cat([held[1], values], dim=2)
        positions = torch.cat([self.slot_positions, q_pos.expand(n, -1)], dim=1)
        stream, entry = (all_k, all_v), None
        start, end = q_pos[:1], q_pos[-1:] + 1
        if self.compensation:
            mean_k, mean_v, entry = chunk_entries(self.dropped, all_k, all_v, positions, q_pos, self.sink,
                                                  self.windows)
            stream = (torch.cat([all_k, mean_k], dim=2), torch.cat([all_v, mean_v], dim=2))
            leaving = ((positions >= self.sink) & (positions <= end - 1 - self.windows[:, None])).double()
            self.dropped.k_sum.add_(torch.einsum("hj,bhjd->bhd", leaving, all_k.double()))
            self.dropped.v_sum.add_(torch.einsum("hj,bhjd->bhd", leaving, all_v.double()))
            self.dropped.count.add_(leaving.sum(-1))
        # the newest position <= end - 1 of each slot s of head h (module doc's slot rule), -1 for none
        s, w = torch.arange(slots, device=keys.device)[None, :], self.windows[:, None]
        j = s - self.sink
        last = end - 1 - self.sink - j
        ringed = torch.where(last >= 0, self.sink + j + w * torch.div(last, w, rounding_mode="floor"), -1)
        target = torch.where(s < self.sink, torch.where(s < end, s, -1), torch.where(j < w, ringed, -1))
        new = target >= start                                                        # (n, slots) from the chunk
        index = (target - start).clamp(min=0)[None, :, :, None].expand(keys.shape[0], -1, -1, keys.shape[3])
        self.ring_k[:, :, :slots] = torch.where(new[None, :, :, None], keys.gather(2, index.clamp(
            max=keys.shape[2] - 1)), held[0])
        self.ring_v[:, :, :slots] = torch.where(new[None, :, :, None], values.gather(2, index.clamp(
            max=keys.shape[2] - 1)), held[1])
        self.slot_positions.copy_(target)
        return stream, positions, entry

    # -- what the layer holds --------------------------------------------------------------------------------------
    def held(self, window: int) -> int:
        """Slots a streaming head of window W uses after the tokens seen: they fill in order up to S + W."""
        return min(self.seen(), self.sink + window)

    def seen(self) -> int:
        return int(self.position) if self.is_initialized else 0

    @property
    def full_k(self) -> torch.Tensor:
        return self.full_k_buf[:, :, :self.seen()]

    @property
    def full_v(self) -> torch.Tensor:
        return self.full_v_buf[:, :, :self.seen()]

    def one_window(self) -> int:
        if len(set(self.stream_windows)) != 1:
            raise KVPlanError(f"This layer streams at windows {sorted(set(self.stream_windows))}; read its heads one "
                              "by one (head_view).")
        return self.stream_windows[0]

    @property
    def stream_k(self) -> torch.Tensor:
        """The streaming keys held (B, n_s, slots in use, d), for a layer of one window."""
        return self.ring_k[:, :, :self.held(self.one_window())]

    @property
    def stream_v(self) -> torch.Tensor:
        return self.ring_v[:, :, :self.held(self.one_window())]

    @property
    def positions(self) -> torch.Tensor:
        return self.slot_positions[0, :self.held(self.one_window())]

    def head_view(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(keys (B, slots in use, d), values, positions) of the i-th streaming head."""
        n = self.held(self.stream_windows[i])
        return self.ring_k[:, i, :n], self.ring_v[:, i, :n], self.slot_positions[i, :n]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # the mask spans every position (streaming heads read theirs from it); a static cache's spans its buffer
        return (self.max_cache_len, 0) if self.max_cache_len is not None else (self.length + query_length, 0)

    def get_seq_length(self):
        # a static cache answers with its device counter (no host read inside a compiled step), as StaticLayer does
        if self.max_cache_len is not None:
            return self.position if self.is_initialized else 0
        return self.length

    def get_max_length(self) -> int:
        return self.max_cache_len or -1

    def tensors(self, allocated: bool = False) -> list[torch.Tensor]:
        """The keys/values held (views: each streaming head's slots in use), or with ``allocated`` the buffers behind
        them (spare capacity and ring padding included); a compensation token's running sums count in both."""
        if not self.is_initialized:
            return []
        sums = [] if self.dropped is None else [self.dropped.k_sum, self.dropped.v_sum]
        if allocated:
            return [self.full_k_buf, self.full_v_buf, self.ring_k, self.ring_v] + sums
        heads = [t for i in range(len(self.stream_heads)) for t in self.head_view(i)[:2]]
        return [self.full_k, self.full_v] + heads + sums


class MixedCache(Cache):
    """A transformers ``Cache`` of :class:`MixedLayer` s, one per layer of a ``restrict.restricted`` copy;
    ``max_cache_len``: static buffers for that many tokens (what a compiled decode step needs), else growing."""

    def __init__(self, model, max_cache_len: int | None = None):
        specs = getattr(model.config, CONFIG_KEY)
        super().__init__(layers=[MixedLayer(specs[i]["kv_stream"], specs[i]["sink"], kv_windows=specs[i]["kv_windows"],
                                            compensation=specs[i].get("compensation", False),
                                            max_cache_len=max_cache_len)
                                 for i in range(len(specs))])


def cache_bytes(cache: Cache, allocated: bool = False) -> int:
    """Bytes held by a cache's key/value tensors (measured from the tensors, not counted from a plan); with
    ``allocated``, a mixed cache's buffers whole (the full heads' spare capacity and the ring's padding included).
    A stock ``StaticCache`` holds its whole buffers either way."""
    total = 0
    for layer in cache.layers:
        tensors = layer.tensors(allocated) if isinstance(layer, MixedLayer) else [layer.keys, layer.values]
        total += sum(t.numel() * t.element_size() for t in tensors if t is not None)
    return total


def new_cache(model, mode: str, max_cache_len: int | None = None) -> Cache:
    """The stock cache for ``"full"`` (its ``StaticCache`` with ``max_cache_len``); for ``"restricted"`` one growing
    layer per layer whatever the config says (a sliding-window layer's cache would drop the first keys, and the
    restriction reads key index = position; the sliding window is still applied by the model's mask); a
    :class:`MixedCache` for ``"mixed"`` (static with ``max_cache_len``)."""
    if mode == "mixed":
        return MixedCache(model, max_cache_len)
    if mode == "full":
        if max_cache_len is not None:
            return StaticCache(config=model.config, max_cache_len=max_cache_len)
        return DynamicCache(config=model.config)
    if max_cache_len is not None:
        raise KVPlanError("The restricted full cache reads key index = position over a growing cache; it has no "
                          "static form. Compile the mixed cache (mode='mixed') or the stock one (mode='full').")
    return DynamicCache()


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
            k = torch.randn(1, n_kv, t, d, generator=gen, dtype=torch.float32).to(device, dtype)
            cache.update(k, torch.randn(1, n_kv, t, d, generator=gen, dtype=torch.float32).to(device, dtype), layer)


# -- compiled decoding -----------------------------------------------------------------------------------------------

def compile_problem(device: torch.device | str, model_class=None) -> str | None:
    """Why a decode step cannot be compiled here (None: it can): transformers marks the model class as not
    traceable as one graph (``_can_compile_fullgraph``), or the device has no compiler backend -- inductor builds
    C++ on a CPU (a C++ compiler on the PATH) and Triton kernels on a GPU."""
    device = torch.device(device)
    if model_class is not None and not getattr(model_class, "_can_compile_fullgraph", False):
        return (f"transformers does not mark {model_class.__name__} as compilable as one graph "
                "(_can_compile_fullgraph)")
    if device.type == "cpu":
        if not any(shutil.which(c) for c in (os.environ.get("CXX") or "", "g++", "c++", "clang++") if c):
            return ("torch.compile on the CPU builds C++ kernels and no C++ compiler (g++, c++, clang++, $CXX) is on "
                    "the PATH")
        return None
    if device.type == "cuda":
        return None if importlib.util.find_spec("triton") else "torch.compile on CUDA needs Triton, not installed"
    return f"torch.compile of a decode step is not offered on {device.type} (accepted: cpu, cuda)"


def decode_forward(model, token: torch.Tensor, cache: Cache) -> torch.Tensor:
    """One decode step: the logits of the last position after ``token`` (1, 1)."""
    return model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1).logits


def compiled_decoder(device: torch.device):
    """``torch.compile`` of :func:`decode_forward` as one graph (``fullgraph``: a graph break would put Python back
    inside the step): CUDA graphs on a GPU (``mode="reduce-overhead"``), inductor's default mode on a CPU. Compiled
    code is kept per cache layout (dynamo's guards), so a second generation over a cache of the same sizes reuses
    it; ``torch.compiler.reset()`` before a run measures the compile cost afresh."""
    return torch.compile(decode_forward, mode="reduce-overhead" if device.type == "cuda" else None, fullgraph=True)


@dataclass
class Generation:
    tokens: list[int]
    kv_bytes: int                   # measured from the cache tensors after the last step
    first_token_s: float            # prompt forward + first token
    per_token_s: float              # mean of the later steps (compiled: after the warm-up steps)
    mode: str
    kv_bytes_allocated: int = 0     # the buffers behind them (a mixed cache's full heads keep spare capacity)
    compiled: bool = False
    warmup_s: float | None = None   # compiled: the first decode steps, which compile (and on CUDA record the graph)
    step_s: list = field(default_factory=list)   # every decode step's seconds
    step_cpu_s: list = field(default_factory=list)   # and its CPU seconds in this thread (a shared CPU's other load
                                                     # stretches the wall clock, much less this)

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "kv_bytes": self.kv_bytes, "kv_bytes_allocated": self.kv_bytes_allocated,
                "time_to_first_token_s": self.first_token_s,
                "time_per_output_token_s": self.per_token_s, "cache": self.mode, "compiled": self.compiled,
                **({"compile_s": self.warmup_s} if self.compiled else {})}


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, *, mode: str = "full", sample: bool = False,
             temperature: float = 1.0, seed: int = 0, cache: Cache | None = None,
             prefill_chunk: int | None = None, eos_token_id: int | None = None, compile: bool = False) -> Generation:
    """Generate after ``input_ids`` (1, T) with greedy decoding or seeded sampling.

    ``model``: the loaded model for ``mode="full"``, a ``restrict.restricted`` copy for ``"restricted"`` (ordinary
    cache, restriction by mask) and ``"mixed"`` (:class:`MixedCache`). ``cache``: a pre-filled cache to continue
    (``fill_random``), else a new one. ``prefill_chunk``: prompt tokens per forward (bounds the T_q x T_k masks).
    ``eos_token_id``: generation stops after this token (end of text), kept as the last of ``tokens``.
    ``compile``: the decode steps run through :func:`compiled_decoder` over a static cache (the stock
    ``StaticCache`` for ``"full"``, a static :class:`MixedCache` for ``"mixed"``) sized for the prompt and the new
    tokens; the prompt goes in eagerly. Its first step (two on CUDA: the graph is recorded on the second) is the
    compile cost, ``warmup_s``, and ``per_token_s`` is the mean of the steps after it.
    """
    device = input_ids.device
    if cache is None:
        cache = new_cache(model, mode, input_ids.shape[1] + max_new_tokens if compile else None)
    elif compile and not cache.is_compileable:
        raise KVPlanError("A compiled decode step needs a static cache (StaticCache, or MixedCache with "
                          "max_cache_len); this one grows.")
    forward = compiled_decoder(device) if compile else decode_forward
    warmup = (2 if device.type == "cuda" else 1) if compile else 0
    gen = torch.Generator().manual_seed(seed)
    step = input_ids.shape[1] if prefill_chunk is None else prefill_chunk
    tokens, times, cpu = [], [], []
    start, start_cpu = time.perf_counter(), time.thread_time()
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
        tokens.append(int(token))     # the token read back: the clock waits for the step's work, on any device
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        if i + 1 == max_new_tokens or (eos_token_id is not None and tokens[-1] == eos_token_id):
            break
        start, start_cpu = time.perf_counter(), time.thread_time()
        logits = forward(model, token, cache)
    steps = times[1:]
    later = steps[warmup:]
    return Generation(tokens, cache_bytes(cache), times[0] if times else 0.0,
                      sum(later) / len(later) if later else 0.0, mode, cache_bytes(cache, allocated=True),
                      compile, sum(steps[:warmup]) if compile else None, steps, cpu[1:])
