"""The device name a width profile is keyed by (GPU model, or CPU model from /proc/cpuinfo), and
small host-to-device uploads that never drain a CUDA stream."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's "model name"), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({cpu_model()})"


def upload(values, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A small host list / array as a tensor on `device`. On CUDA it goes through pinned memory
    (torch's caching host allocator) with a non_blocking copy: a pageable copy would wait for
    the stream (one drain per call); this one is queued behind the work already issued."""
    host = torch.as_tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
