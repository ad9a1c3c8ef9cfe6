"""The per-value loop of calibration: count |x| into a fine grid whose range grows by powers of two.

The grid of a tensor has ``2**F`` bins of width ``2**(E - F)`` over [0, 2**E), where E is the smallest
exponent with max|x| < 2**E (so E depends on the largest value alone). A value a = |x| lands in bin
``floor(a * 2**(F - E))``: the product is exact (a power-of-two scale only moves the exponent; a result
too small for float32 is below 1 and lands in bin 0 either way), so the bin is a pure function of a
and E. When a larger value raises E to E' the counts merge in place, bin j into bin ``j >> (E' - E)``,
and ``floor(floor(a * 2**(F-E)) / 2**(E'-E)) = floor(a * 2**(F-E'))``: the grid after any sequence of
batches, in any order and of any size, is bit-identical to the grid of all values counted at once with
the final E. That is the "re-binning that is exact when the range grows" of DESIGN.md, and it lets
calibration read the data once instead of twice (a first pass for max|x|, then a histogram).

Two implementations with identical results: a compiled loop (numba, `trtopt.calib.kernels_numba`: one read
of each value, the GIL released so tensors are counted in parallel threads, the machine code cached on disk
for later processes) and a numpy fallback for where numba is missing.
Measured on EfficientNet-Lite0 activations (tools/bench_calibration.py): numpy's vectorised form needs
about seven passes over the data and `np.add.at` holds the GIL, so the compiled loop is the one that
makes single-pass calibration several times faster than ONNX Runtime's.

The same read also adds up each channel (axis 1) in float64, for bias correction's channel means.

Where the loop's time goes (issue #18; EfficientNet-Lite0's 60 calibrated tensors, 7.1 M values an
image, AVX2 EPYC, 1 thread): about 2.1 ns a value, of which the read and range check take 0.8, the
increment of the bin 0.7, the zero count 0.3, max|x| 0.1 and the channel sums 0.2. Tried and not kept,
as none saved more than 8%: raising E for the whole batch first (numpy max/min) and a branch-free loop;
zeros sent to spare bins, branch-free or not; two or four interleaved copies of the grid (ReLU outputs
put 20-90% of their values in bin 0, but the chain of increments there is not what bounds the loop);
a blocked loop whose bins, zero count and sums vectorise, with the increments in a second pass; zeros
left out of that pass by compaction. The increments alone cost 0.65 ns a value even without repeats.

State of a grid, kept by the caller in a float64 array of `STATE_SIZE`: [E, max|x|, exact zeros,
non-finite values]. A new grid starts at `EMPTY_EXPONENT`, below every non-zero float32 and float64
normal number, so the first non-zero value sets E.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np

log = logging.getLogger(__name__)

STATE_SIZE = 4
EXPONENT, AMAX, ZEROS, NONFINITE = range(STATE_SIZE)
# 2**-1000 is a normal float64 and 2**F / 2**-1000 stays finite for F < 24.
EMPTY_EXPONENT = -1000
# Values per numpy step: the float64 temporaries of a chunk (512 KiB) stay in a core's L2 cache.
CHUNK = 1 << 16

CountFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


def new_state() -> np.ndarray:
    state = np.zeros(STATE_SIZE, dtype=np.float64)
    state[EXPONENT] = EMPTY_EXPONENT
    return state


def exponent_above(value: float) -> int:
    """The smallest E with value < 2**E (value > 0 and finite)."""
    return math.frexp(value)[1]  # value = m * 2**e with 0.5 <= m < 1


def count_abs(values: np.ndarray, counts: np.ndarray, state: np.ndarray, channel_sums: np.ndarray) -> None:
    """Count |values| into `counts` (int64, 2**F bins) and add each channel's values to `channel_sums`.

    `values` is a contiguous float32 or float64 array of shape [N, C, K] (batch, channels, the rest;
    see `as_rows`), `channel_sums` a float64 array of C. Non-finite values are not counted;
    `state[NONFINITE]` says how many there were, and the caller decides what that means (calibration
    stops with the tensor's name).
    """
    _count_fn()(values, counts, state, channel_sums)


def as_rows(values: np.ndarray) -> np.ndarray:
    """`values` as the contiguous [N, C, K] array `count_abs` takes (a view when it is contiguous already);
    tensors of rank < 2 become one channel."""
    flat = np.ascontiguousarray(values, dtype=np.float64 if values.dtype == np.float64 else np.float32)
    if flat.ndim < 2:
        return flat.reshape(1, 1, -1)
    return flat.reshape(flat.shape[0], flat.shape[1], -1)


@lru_cache(maxsize=1)
def _count_fn() -> CountFn:
    try:
        import numba  # noqa: F401 - heavy (LLVM): imported on the first calibration, not with trtopt
    except ImportError:  # pragma: no cover - numba is a dependency; this keeps odd platforms working
        log.warning("numba is not installed: calibration counts with numpy, several times slower "
                    "(pip install numba)")
        return _count_abs_numpy
    from trtopt.calib.kernels_numba import count_abs as compiled_count_abs

    return compiled_count_abs  # type: ignore[no-any-return]


def _count_abs_numpy(values: np.ndarray, counts: np.ndarray, state: np.ndarray, channel_sums: np.ndarray) -> None:
    """The same grid with numpy: raise E once per call to cover the batch, then count chunk by chunk."""
    finite = np.isfinite(values)
    channel_sums += np.where(finite, values, 0).sum(axis=(0, 2), dtype=np.float64)
    values = values.reshape(-1)
    finite = finite.reshape(-1)
    if not finite.all():
        state[NONFINITE] += values.size - int(np.count_nonzero(finite))
        values = values[finite]
    if values.size == 0:
        return
    batch_max = max(float(values.max()), -float(values.min()))
    if batch_max >= math.ldexp(1.0, int(state[EXPONENT])):
        grown = exponent_above(batch_max)
        _merge_bins_numpy(counts, grown - int(state[EXPONENT]))
        state[EXPONENT] = grown
    scale = counts.size / math.ldexp(1.0, int(state[EXPONENT]))
    for start in range(0, values.size, CHUNK):
        chunk = values[start : start + CHUNK]
        np.add.at(counts, (np.abs(chunk, dtype=np.float64) * scale).astype(np.intp), 1)
        state[ZEROS] += int(np.count_nonzero(chunk == 0))
    state[AMAX] = max(state[AMAX], batch_max)


def _merge_bins_numpy(counts: np.ndarray, shift: int) -> None:
    """`kernels_numba.merge_bins` vectorised: bins j * 2**shift .. (j + 1) * 2**shift - 1 sum into bin j."""
    if shift <= 0:
        return
    if (1 << min(shift, 62)) >= counts.size:
        total = counts.sum()
        counts[:] = 0
        counts[0] = total
        return
    groups = counts.size >> shift
    merged = counts.reshape(groups, 1 << shift).sum(axis=1)
    counts[:] = 0
    counts[:groups] = merged
