"""How every benchmark in tools/ measures and reports, written once: the section header (date, machine, CPU
class, versions, exact command), interleaved timing with paired speed-ups, and writing the markdown and plots.

Not a benchmark itself. tools/bench_setup.py holds what the image benchmarks share besides (the model under
test, its data, ONNX Runtime's quantizer).

Timing rule (BENCHMARKS.md): compared calls run side by side in one process, one call of each per round in
an order that rotates from round to round, so drift (thermal, other load) hits all of them alike; a latency
is the median over rounds, a speed-up the median over rounds of the baseline's time / the call's time in the
same round.
"""

from __future__ import annotations

import datetime
import gc
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import trtopt
from trtopt.bench import median, percentile

ROOT = Path(__file__).resolve().parents[1]


# --- the header of a section -------------------------------------------------------------------------


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> str:
    """The INT8-relevant instruction sets the CPU reports (what ONNX Runtime's kernels can use)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return "unknown"
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
    return ", ".join(f for f in wanted if f in flags) or "none of avx2/avx512/vnni/amx"


def cpu_class(isa: str | None = None) -> str:
    """The CPU class trtopt decides its INT8 encoding by (`isa`, default this machine's), and what it means for
    ONNX Runtime's kernels."""
    from trtopt.backend.cpu.isa import EXACT_U8S8, SATURATING_U8S8, cpu_isa

    isa = isa or cpu_isa()
    means = {True: "its u8s8 INT8 kernels are exact", False: "its u8s8 INT8 kernels saturate (no VNNI)"}
    known = means[isa in EXACT_U8S8] if isa in EXACT_U8S8 | SATURATING_U8S8 else "INT8 kernel exactness unknown"
    return f"**CPU class `{isa}`**: {known}"


def load_average() -> str:
    """The 1-minute load average: other jobs on the machine inflate wall times and latencies."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def source_revision() -> str:
    """The git commit the benchmarked trtopt code is at, and whether trtopt/ has uncommitted changes."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "trtopt"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"git {commit}" + (" + uncommitted changes in trtopt/" if dirty else "")


def header_lines(script: str, argv: Sequence[str], versions: Sequence[str] = ()) -> list[str]:
    """date, machine, versions (and `versions`: more, e.g. "onnx-graphsurgeon 0.5.8") and the exact command, as
    every benchmark section states them."""
    more = "".join(f", {v}" for v in versions)
    return [
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs ({cpu_flags()}), "
        f"{platform.system()} {platform.release()}; {cpu_class()}",
        f"- versions: Python {platform.python_version()}, numpy {np.__version__}, onnx {onnx.__version__}, "
        f"onnxruntime {ort.__version__}{more}, trtopt {trtopt.__version__} ({source_revision()})",
        f"- command: `python {shlex.join([script, *argv])}`",
    ]


def shown_path(path: Path) -> str:
    """A path relative to the repository when it is inside it, so recorded commands read cleanly."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# --- timing ------------------------------------------------------------------------------------------


@dataclass
class Timings:
    """Per-call latencies (ms) of one batch size, in round order; the first call timed is the baseline."""

    batch: int
    ms: dict[str, list[float]] = field(default_factory=dict)

    @property
    def baseline(self) -> str:
        return next(iter(self.ms))

    def p50(self, name: str) -> float:
        return median(sorted(self.ms[name]))

    def p90(self, name: str) -> float:
        return percentile(sorted(self.ms[name]), 90)

    def speedup(self, name: str) -> float:
        """Median over rounds of the baseline's ms / `name`'s ms, both measured in the same round."""
        return statistics.median(b / t for b, t in zip(self.ms[self.baseline], self.ms[name], strict=True))


def paired_interval(ours: Sequence[float], theirs: Sequence[float], confidence: float = 0.9,
                    resamples: int = 2000) -> tuple[float, float, float]:
    """The median over rounds of theirs[i] / ours[i] (above 1: ours was faster) with a bootstrap interval of that
    median at `confidence` (rounds resampled with replacement; a fixed seed, so a rerun of the same figures gives
    the same interval). Two calls timed in the same round share that round's drift, so the paired ratio is what
    tells a real difference from this machine's run-to-run noise."""
    ratios = np.asarray(theirs, np.float64) / np.asarray(ours, np.float64)
    picks = np.random.default_rng(0).integers(0, len(ratios), (resamples, len(ratios)))
    medians = np.median(ratios[picks], axis=1)
    tail = (1 - confidence) / 2
    return float(np.median(ratios)), float(np.quantile(medians, tail)), float(np.quantile(medians, 1 - tail))


def session_noise(ms: dict[str, list[float]], ours: str, twin: str | None) -> float:
    """How far apart two sessions of one model ran in these rounds (`twin`: a second session over `ours`'s
    bytes): the paired ratio's distance from parity, at the far end of its interval; 0.0 without a twin. Rounds
    share a machine's drift, not a session's own state (where its buffers landed in memory, its thread's cache):
    kernel-identical plans, each in its own session, measured 2-3% apart at batch 1 (Keras MobileNetV2, AVX-512
    VNNI), as far as trtopt's plan and ONNX Runtime's quantizer's, which the paired interval alone called a gap."""
    if twin is None or twin not in ms:
        return 0.0
    _, low, high = paired_interval(ms[ours], ms[twin])
    return max(abs(1.0 - low), abs(high - 1.0))


def behind(ms: dict[str, list[float]], ours: str, peer: str, twin: str | None = None) -> str:
    """"" where `ours` was at least as fast as `peer` in these interleaved rounds (median of the paired ratios),
    else how far behind and whether beyond noise (the interval of the paired ratio wholly below parity, and the
    gap wider than two sessions of `ours` differ: `session_noise`) or within it: "3.1% behind" or "1.2% behind,
    within noise"."""
    ratio, _, high = paired_interval(ms[ours], ms[peer])
    if ratio >= 1.0:
        return ""
    gap = f"{100 * (1 - ratio):.1f}%" if ratio <= 0.9995 else "<0.1%"
    within = high >= 1.0 or 1.0 - ratio <= session_noise(ms, ours, twin)
    return f"{gap} behind" + (", within noise" if within else "")


def interleaved(calls: dict[str, Callable[[], object]], warmup: int, iterations: int, batch: int = 1) -> Timings:
    """Time one call of each per round, rotating the order each round, after `warmup` untimed rounds; the
    first of `calls` is the baseline of the speed-ups."""
    names = list(calls)
    for _ in range(warmup):
        for name in names:
            calls[name]()
    timings = Timings(batch, {name: [] for name in names})
    for r in range(iterations):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            calls[name]()
            timings.ms[name].append((time.perf_counter() - start) * 1e3)
    return timings


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    """The median wall time of `repeat` calls of one thing (nothing to pair it with), each after a collection:
    one triggered mid-run by earlier garbage would be charged to that run."""
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# --- output ------------------------------------------------------------------------------------------


def emit(text: str, out: Path | None) -> None:
    """Print a benchmark's markdown section, and write it to `out` when given."""
    sys.stdout.write(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


def plt_or_none() -> Any:
    """matplotlib.pyplot with the file-only backend, or None (said on stderr) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed; no plot written (pip install matplotlib)", file=sys.stderr)
        return None
    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, write (creating the folder) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bar_chart(
    path: Path, names: list[str], series: dict[str, list[float]], baseline: float | None, title: str
) -> None:
    """Grouped bars of shares (0..1) in percent, one group per name, with an optional dashed baseline."""
    plt = plt_or_none()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(9, 4.8))
    width = 0.8 / len(series)
    x = np.arange(len(names))
    for i, (label, values) in enumerate(series.items()):
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, np.array(values) * 100, width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    if baseline is not None:
        ax.axhline(baseline * 100, color="grey", linestyle="--", linewidth=1)
    lowest = min(min(values) for values in series.values()) * 100
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("% (axis does not start at 0)")
    ax.set_ylim(max(0.0, np.floor(lowest / 10) * 10 - 10), 102)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(series))
    save_figure(fig, path)
