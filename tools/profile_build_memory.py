#!/usr/bin/env python3
"""Peak memory of a default `trtopt build --int8` of zoo models, per build phase (Linux only).

    python tools/profile_build_memory.py [--models ppocr-v4-det layout-cdla] [--count 32] [--plans DIR]

Each model is built in this process as tools/bench_zoo.py's default row builds it (its catalog's
preprocessing, `--count` calibration samples, method auto, automatic exclusion). The process's peak RSS
(VmHWM) is reset (`/proc/self/clear_refs`, 5) where a phase starts and read where it ends, so each figure
is that phase's own peak: the histograms, auto's scoring (its cache runs included), the sensitivity
search, and the backend build with its verification. Run one model per process (`--models` one name) for
figures that no earlier build's freed-but-kept memory can touch. The plan's SHA-256 is printed so that
two versions of trtopt can be compared for identical plans.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GIB = 2**20  # /proc/self/status counts KiB


def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / GIB
    raise SystemExit(f"/proc/self/status has no {key}: this tool needs Linux")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


class Phases:
    """Peak RSS (GiB) per phase, a phase being a call of a wrapped function; nested calls end the outer
    phase's segment, whose peak so far is kept under its name."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}

    def end(self, name: str) -> None:
        """Close `name`'s segment: its peak so far, then a fresh peak for what follows."""
        self.peaks[name] = max(self.peaks.get(name, 0.0), _status("VmHWM"))
        _reset_peak()

    @contextmanager
    def phase(self, name: str, outer: list[str]) -> Iterator[None]:
        self.end(outer[-1])
        outer.append(name)
        try:
            yield
        finally:
            self.end(outer.pop())

    def wrap(self, module: Any, attribute: str, name: str, outer: list[str]) -> None:
        function: Callable[..., Any] = getattr(module, attribute)

        @functools.wraps(function)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name, outer):
                return function(*args, **kwargs)

        setattr(module, attribute, wrapped)


def profile(name: str, count: int, plans: Path | None) -> None:
    import zoo
    import zoo_variants

    import trtopt.build as build
    import trtopt.calib.auto as auto
    import trtopt.calib.collect as collect
    from trtopt.build import build_plan

    phases, outer = Phases(), ["the rest (load, data, Q/DQ)"]
    phases.wrap(collect, "collect_histograms", "histograms", outer)
    phases.wrap(auto, "choose_thresholds", "auto scoring", outer)
    phases.wrap(build, "float_sensitive_layers", "sensitivity", outer)
    phases.wrap(build, "build_verified", "build + verify", outer)
    models = {m.name: m for m in zoo.catalog()}
    if name not in models or zoo.cached_path(name) is None:
        raise SystemExit(f"{name} is not in the zoo cache: run python tools/zoo.py fetch {name}")
    m = models[name]
    subject = zoo_variants.Subject(m.name, zoo.cached_path(m.name), m.task, tuple(m.preprocess), zoo.calib_path(m),
                                   m.input_shape, m.input_name, "")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="memprof-") as work:
        data = zoo_variants.split_data(subject, count, 8, Path(work))
        _reset_peak()
        start = time.perf_counter()
        result = build_plan(zoo.cached_path(name) or name, zoo_variants.build_config(subject, data, None))
        phases.end(outer[-1])
    plan = result.plan.sections["onnx"]
    print(f"{name}: {time.perf_counter() - start:.0f} s, plan sha256 {hashlib.sha256(plan).hexdigest()[:16]}")
    for phase, peak in phases.peaks.items():
        print(f"  {phase:<22} peak RSS {peak:5.2f} GiB")
    if plans is not None:
        plans.mkdir(parents=True, exist_ok=True)
        (plans / f"{name}.onnx").write_bytes(plan)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["ppocr-v4-det", "layout-cdla"])
    parser.add_argument("--count", type=int, default=32, help="calibration samples (default 32, as bench_zoo)")
    parser.add_argument("--plans", type=Path, help="write each plan's ONNX section here, to compare bytes")
    args = parser.parse_args(argv)
    for name in args.models:
        profile(name, args.count, args.plans)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
