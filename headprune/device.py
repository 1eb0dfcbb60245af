"""Device choice: CUDA when available, else CPU; mixed precision only on GPU."""

from __future__ import annotations

import contextlib

import torch

from .errors import DeviceError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    if isinstance(name, torch.device):
        return name
    name = (name or "auto").lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceError("Device 'cuda' was asked for, but no CUDA GPU is available here. "
                              "Use --device auto or --device cpu.")
        return torch.device(name)
    if name == "cpu":
        return torch.device("cpu")
    raise DeviceError(f"Unknown device '{name}'. Accepted: {', '.join(DEVICES)}.")


def autocast(device: torch.device, dtype: str | None = "bf16"):
    """bf16/fp16 autocast on CUDA only (CPU stays float32 so results match the equivalence tests)."""
    if device.type != "cuda" or dtype in (None, "fp32", "float32"):
        return contextlib.nullcontext()
    torch_dtype = torch.bfloat16 if dtype == "bf16" and torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast("cuda", dtype=torch_dtype)
