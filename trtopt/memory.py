"""Memory estimates made before the work, so a too-large model, shape or batch is a message, not an OOM kill.

Linux over-commits memory: a 43 GB activation (1x3x60000x60000 float32) is not refused by `malloc` but
killed later by the kernel (exit 137, no message). trtopt therefore estimates what a run needs from the
shapes and compares it with what the machine has free (`MemAvailable`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from trtopt.errors import TrtoptError

log = logging.getLogger(__name__)


def available_bytes() -> int | None:
    """Memory the machine can still give (Linux `MemAvailable`, else psutil), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except (ImportError, AttributeError, OSError):
        return None


def tensor_bytes(shape: Iterable[int], dtype: Any) -> int:
    """Bytes of a dense tensor (Python ints: no overflow for absurd shapes)."""
    return math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize


def require_memory(needed: int, what: str, fix: str) -> None:
    """Raise a `TrtoptError` when `needed` bytes exceed what the machine has available."""
    free = available_bytes()
    if free is not None and needed > free:
        raise TrtoptError(
            f"{what} needs about {_gib(needed)} of memory; this machine has {_gib(free)} available.",
            fix=fix,
        )


def _tensor_sizes(graph: Any, batch: int) -> list[int]:
    """Every tensor's size in a gs.Graph with inferred shapes, a dynamic batch set to `batch` (their sum: an upper
    bound for plain inference, where ONNX Runtime reuses buffers, and for calibration, which exposes the
    calibrated activations, not every tensor, at once)."""
    sizes = []
    for tensor in graph.tensors().values():
        shape, dtype = getattr(tensor, "shape", None), getattr(tensor, "dtype", None)
        if shape is None or dtype is None:
            continue
        dims = [d if isinstance(d, int) and d > 0 else (batch if i == 0 else 1) for i, d in enumerate(shape)]
        try:
            sizes.append(tensor_bytes(dims, dtype))
        except TypeError:
            continue
    return sizes


def check_graph_memory(graph: Any, batch: int) -> None:
    """Refuse a model whose two largest tensors (at `batch`: a layer's input and output, the least any run holds)
    cannot fit in the available memory; warn where every tensor at once would not.

    Every tensor at once is an upper bound, often several times what the build holds: a fingerprint model at
    8 x 384 x 320 was estimated at 20.1 GiB and held 4.3-4.8 GB, so refusing on it accepted or refused the same
    build as other work on the machine came and went (round 13's hunt). An absurd shape is still refused: a
    1 x 3 x 60000 x 60000 input alone is 43 GB."""
    inputs = ", ".join(f"{t.name} {list(t.shape or [])}" for t in graph.inputs)
    dynamic = any(t.shape and not (isinstance(t.shape[0], int) and t.shape[0] > 0) for t in graph.inputs)
    what = f"Running this model (inputs {inputs}{f', dynamic batch taken as {batch}' if dynamic else ''})"
    sizes = sorted(_tensor_sizes(graph, batch), reverse=True)
    fix = ("Check the input shapes (the model's or --shapes): they may be far larger than intended; or use a "
           "smaller --calib-batch, or a machine with more memory.")  # fmt: skip
    require_memory(sum(sizes[:2]), f"{what} to calibrate and verify it (its two largest tensors at once)", fix)
    free = available_bytes()
    if free is not None and sum(sizes) > free:
        log.warning("%s may need up to %s, every tensor at once (calibration holds fewer), and this machine has %s "
                    "available: if the build is killed (exit code 137), use a smaller --calib-batch.", what,
                    _gib(sum(sizes)), _gib(free))  # fmt: skip


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
