"""Which heads need the whole KV cache: cache plans, exact streaming heads, a mixed cache for generation."""

from .cache import MixedCache, cache_bytes, generate
from .plan import KVPlan, KVPlanError
from .restrict import restricted

__all__ = ["KVPlan", "KVPlanError", "MixedCache", "cache_bytes", "generate", "restricted"]
