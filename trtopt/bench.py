"""Latency and throughput per batch size: pure measurement, no engine knowledge.

Percentiles are computed exactly as trtexec reports them (NVIDIA/TensorRT samples/common/
sampleReporting.cpp, ``findPercentile`` / ``findMedian``): timings sorted ascending,
``exclude = int((1 - p/100) * n)`` in float32 arithmetic, value ``t[max(n - 1 - exclude, 0)]``; the
median averages the two middle values of an even count. Float32 matters: for n = 100, p = 99 it gives
the maximum, where float64 arithmetic would give the second largest.

Latency per call comes from the injectable `timer` (host wall clock by default) unless the measured
function returns a float: that is taken as the call's latency in milliseconds, measured by the callee
(e.g. CUDA events around the GPU work, `TensorRTRunner.timed_infer`). Throughput is always samples per
second of host wall time over the timed iterations, as trtexec's "Throughput" is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

Inputs = Mapping[str, Any]


@dataclass(frozen=True)
class BenchResult:
    batch: int
    iterations: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    throughput: float  # samples per second

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def percentile(sorted_ms: Sequence[float], p: float) -> float:
    """trtexec's percentile of an ascending sequence (see the module docstring)."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    n = len(sorted_ms)
    if n == 0:
        return float("inf")
    exclude = int(np.float32(np.float32(1) - np.float32(p) / np.float32(100)) * np.float32(n))
    return float(sorted_ms[max(n - 1 - exclude, 0)])


def median(sorted_ms: Sequence[float]) -> float:
    n = len(sorted_ms)
    if n == 0:
        return float("inf")
    m = n // 2
    return float(sorted_ms[m]) if n % 2 else (float(sorted_ms[m - 1]) + float(sorted_ms[m])) / 2


def summarize(batch: int, latencies_ms: Sequence[float], wall_s: float) -> BenchResult:
    ordered = sorted(latencies_ms)
    return BenchResult(
        batch=batch,
        iterations=len(ordered),
        p50_ms=median(ordered),
        p90_ms=percentile(ordered, 90),
        p99_ms=percentile(ordered, 99),
        mean_ms=float(np.mean(ordered)) if ordered else float("inf"),
        min_ms=float(ordered[0]) if ordered else float("inf"),
        max_ms=float(ordered[-1]) if ordered else float("inf"),
        throughput=batch * len(ordered) / wall_s if wall_s > 0 else float("inf"),
    )


def measure(
    fn: Callable[[Inputs], Any],
    make_inputs: Callable[[int], Inputs],
    batch_sizes: Iterable[int],
    *,
    warmup: int = 10,
    iterations: int = 100,
    min_seconds: float = 0.0,
    timer: Callable[[], float] = time.perf_counter,
) -> list[BenchResult]:
    """Time `fn(make_inputs(b))` for each batch size `b`: `warmup` untimed calls, then at least
    `iterations` timed calls and at least `min_seconds` of them. Inputs are made once per batch size."""
    if iterations < 1 or warmup < 0 or min_seconds < 0:
        raise ValueError("iterations must be >= 1, warmup and min_seconds >= 0")
    results = []
    for batch in batch_sizes:
        inputs = make_inputs(batch)
        for _ in range(warmup):
            fn(inputs)
        latencies: list[float] = []
        start = timer()
        now = start
        while len(latencies) < iterations or now - start < min_seconds:
            before = timer()
            reported = fn(inputs)
            now = timer()
            latencies.append(float(reported) if isinstance(reported, float) else (now - before) * 1e3)
        results.append(summarize(batch, latencies, now - start))
    return results
