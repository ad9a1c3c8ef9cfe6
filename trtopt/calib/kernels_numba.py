"""The compiled counting loop of `trtopt.calib.kernels` (numba), imported on the first calibration only.

Every compiled function here is a plain module-level function, and the loops call each other as globals:
numba caches such functions on disk (`cache=True`) and a later process loads the machine code instead of
compiling it again (about 2 s for the counting loop). A function built at run time around a closure cannot
be reused that way: numba keys its cache on the closure's contents, which pickle differently in each
process, so every process compiled it again and added another entry and file to the cache
(numba/numba issues #2065 and #6264).

Where the cache goes (numba's `numba/core/caching.py`, locators tried in order; docs: "Notes on Caching",
https://numba.readthedocs.io/en/stable/developer/caching.html): `NUMBA_CACHE_DIR` if set; else the
package's own `__pycache__` if it can be written; else the user-wide cache directory
(`~/.cache/numba` on Linux), as for a package installed read-only by root. When none of them can be
written, numba refuses `cache=True`; the loops are then compiled without a cache, once in each process,
and a warning says how to give them one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

log = logging.getLogger(__name__)

# error_model="numpy": a division by zero gives inf or nan as numpy does, with no check in the loop.
OPTIONS: dict[str, Any] = {"nogil": True, "error_model": "numpy"}
_warned: list[str] = []


def compiled(function: Callable[..., Any]) -> Any:
    """`function` compiled by numba (GIL released), cached on disk where numba finds a writable directory."""
    try:
        return numba.njit(cache=True, **OPTIONS)(function)
    except RuntimeError as error:  # "cannot cache function ...: no locator available"
        if not _warned:
            _warned.append(str(error))
            log.warning(
                "numba found no writable cache directory (%s): calibration's compiled loops are compiled "
                "again in every process, a few seconds each time. Set NUMBA_CACHE_DIR to a writable "
                "directory to keep them.", error)
        return numba.njit(**OPTIONS)(function)


@compiled
def merge_bins(counts: np.ndarray, shift: int) -> None:
    """Coarsen the grid in place by 2**shift: bin j goes to bin j >> shift (exact; see kernels' doc)."""
    shift = min(shift, 62)
    for j in range(1, counts.size):
        c = counts[j]
        if c:
            counts[j] = 0
            counts[j >> shift] += c


@compiled
def count_abs(values: np.ndarray, counts: np.ndarray, state: np.ndarray, channel_sums: np.ndarray) -> None:
    """`trtopt.calib.kernels.count_abs`, one read of each value (the state's layout is kernels')."""
    fine = counts.size
    exponent = int(state[0])
    top = math.ldexp(1.0, exponent)
    scale = fine / top
    amax = state[1]
    zeros = 0
    nonfinite = 0
    rows, channels, length = values.shape
    for n in range(rows):
        for c in range(channels):
            even = 0.0  # two accumulators: the float64 adds do not serialise the loop
            odd = 0.0
            for j in range(length):
                v = values[n, c, j]
                a = abs(v)
                if not a < top:  # a new range, or NaN / Inf: rare, so the branch predicts well
                    if not math.isfinite(a):
                        nonfinite += 1
                        continue
                    grown = math.frexp(a)[1]
                    merge_bins(counts, grown - exponent)
                    exponent = grown
                    top = math.ldexp(1.0, exponent)
                    scale = fine / top
                # No data-dependent branch here: `if a == 0` mispredicts on ReLU outputs (1.4x slower).
                counts[int(a * scale)] += 1
                zeros += int(a == 0)
                amax = max(amax, a)
                if j & 1:
                    odd += v
                else:
                    even += v
            channel_sums[c] += even + odd
    state[0] = exponent
    state[1] = amax
    state[2] += zeros
    state[3] += nonfinite
