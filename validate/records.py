"""The record one validate run appends: what the worker measured, plus the environment. The
launcher uses the same helpers for the record of a failed run. No torch at import."""

from __future__ import annotations

import datetime as _dt
import platform
import socket
from typing import Any

# Set by the launcher in the workers' environment: it, not rank 0, writes failure records, so
# it can pick the root cause among the ranks' errors.
LAUNCHED_ENV = "PLANNER_VALIDATE_LAUNCHED"

MEASURED_FIELDS = (
    "measured_step_time_s", "measured_step_times_s", "measured_tokens_per_s",
    "measured_peak_mem_gb", "losses", "first_step_grad_norm", "reference_loss",
    "reference_grad_norm",
)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """'Type: first line of the message', at most `limit` characters."""
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    if type(exc).__name__ == "OutOfMemoryError":
        msg = "out of memory: " + msg
    return msg[:limit]


def device_name(device: Any) -> str:
    """'NVIDIA H100 80GB HBM3' on GPUs, the CPU model and thread count on CPUs."""
    import torch

    if getattr(device, "type", device) == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {cpu_model()} ({torch.get_num_threads()} threads per rank)"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() otherwise)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: Any) -> dict[str, Any]:
    """torch version, host, date (UTC), device in words."""
    import torch

    return {
        "device": device_name(device),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "hostname": socket.gethostname(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def failure_fields(reason: str, backend: str | None) -> dict[str, Any]:
    """The measured fields of a run that did not finish: null, with the reason."""
    out: dict[str, Any] = {k: None for k in MEASURED_FIELDS}
    out.update(measured_step_times_s=[], losses=[], backend=backend, ok=False, error=reason)
    return out
