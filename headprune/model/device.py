"""Device choice: CUDA when available, else CPU; mixed precision only on GPU."""

from __future__ import annotations

import contextlib
import json

import torch

from ..errors import DeviceError
from ..userinput import json_or_file

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


def input_device(model) -> torch.device:
    """Where a model's inputs go: its embedding's device (with a device map, accelerate's hooks move activations
    on from there); the CPU when the embedding is offloaded to disk (its weights are on "meta")."""
    device = model.get_input_embeddings().weight.device
    return torch.device("cpu") if device.type == "meta" else device


def synchronise(device: torch.device) -> None:
    """Wait for the work queued on ``device``: a CUDA call returns before its kernels finish, so a clock read
    without this times the launch, not the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, dtype: str | None = "bf16"):
    """bf16/fp16 autocast on CUDA only (CPU stays float32 so results match the equivalence tests)."""
    if device.type != "cuda" or dtype in (None, "fp32", "float32"):
        return contextlib.nullcontext()
    torch_dtype = torch.bfloat16 if dtype == "bf16" and torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast("cuda", dtype=torch_dtype)


# -- placement of models too big for one device (accelerate) ----------------------------------------------------

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OFFLOAD_HELP = ("--device-map auto (spread the layers over every GPU, then CPU memory, then disk), a JSON map "
                "sending some modules to \"cpu\" or \"disk\" (offload), or --dtype bf16 / fp16 (half the memory)")


def parse_dtype(name: str | None) -> torch.dtype | None:
    """"fp32" | "bf16" | "fp16" -> torch dtype (None: the checkpoint's own)."""
    if name in (None, "", "auto"):
        return None
    if name not in DTYPES:
        raise DeviceError(f"Unknown dtype '{name}'. Accepted: {', '.join(DTYPES)}.")
    return DTYPES[name]


def available_devices() -> list[str]:
    return ["cpu", "disk"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]


DEVICE_MAP_ACCEPTED = ("'auto', a JSON object {\"module.name\": device} or a JSON file holding one, e.g. "
                       '{"model.embed_tokens": 0, "model.layers": "cpu", "lm_head": "disk"}')


def parse_device_map(spec: str | dict | None) -> str | dict | None:
    """``"auto"``, a JSON object ``{"module.name": device}`` (device: "cpu", "disk", a GPU index or "cuda:N"), or
    a path to such a JSON file. Every device is checked against this machine, so an absent GPU is named in a
    clear error instead of accelerate's bare AssertionError."""
    if spec in (None, ""):
        return None
    if isinstance(spec, str):
        if spec == "auto":
            return "auto"
        spec, _ = json_or_file(spec, "--device-map", DEVICE_MAP_ACCEPTED, DeviceError)
    if not isinstance(spec, dict) or not spec:
        raise DeviceError(f"A device map is a non-empty JSON object {{\"module.name\": device}}; got "
                          f"{json.dumps(spec)[:60]}. Accepted: {DEVICE_MAP_ACCEPTED}.")
    for module, device in spec.items():
        _check_placement(module, device)
    return spec


def _check_placement(module: str, device) -> None:
    name = f"cuda:{device}" if isinstance(device, int) and not isinstance(device, bool) else str(device)
    if name.isdigit():
        name = f"cuda:{name}"
    if name in ("cpu", "disk") or (name.startswith("cuda:") and name in available_devices()):
        return
    raise DeviceError(f"The device map sends '{module}' to '{device}', which this machine does not have. "
                      f"Available: {', '.join(available_devices())}.")
