"""Direct build vs `trtopt calibrate` + `trtopt build --calib-cache` on one zoo model: the worst held-out output
cosine of each plan (as tools/bench_zoo.py measures it: 32 calibration, 16 held-out samples, CPU backend), and
whether the plan from the cache is byte for byte the direct one. The cache build runs twice: with the same
--calib (so the sensitivity search runs as in the direct build) and alone (no data: no search).

    PYTHONPATH=. python tools/measure_calib_cache.py --model ppocr-v4-rec
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import zoo_variants as zv  # noqa: E402
from bench_zoo import parse_args, subjects  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ppocr-v4-rec")
    name = parser.parse_args().model
    from trtopt.backend.cpu.runner import model_for_this_cpu
    from trtopt.build import build_plan
    from trtopt.calib.config import CalibConfig

    subject = subjects(parse_args(["--models", name, "--methods", "--count", "32", "--eval-count", "16"]))[0]
    assert subject.path is not None and subject.input_shape is not None
    work = Path(tempfile.mkdtemp(prefix="calcache-"))
    data = zv.split_data(subject, 32, 16, work)
    batches, fp32 = zv.eval_feeds(subject, data), zv.session(subject.path)

    def worst(plan: object) -> float:
        return float(zv.score(fp32, zv.session(model_for_this_cpu(plan)), batches, subject.task).worst_cosine)

    config = zv.build_config(subject, data, None)
    start = time.perf_counter()
    direct = build_plan(subject.path, config)
    print(f"direct build: worst cosine {worst(direct.plan):.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    cache, shape = work / "cache.json", "x".join(map(str, subject.input_shape))
    command = [sys.executable, "-m", "trtopt", "calibrate", str(subject.path), "--calib", *data.calib_sources,
               "--calib-count", str(data.calib_count), "--shapes", f"{subject.input_name}:{shape}",
               *subject.preprocess, "-o", str(cache)]  # fmt: skip
    subprocess.run(command, check=True, cwd=ROOT)
    for with_data in (True, False):
        given = config.data if with_data else replace(config.data, sources=())
        start = time.perf_counter()
        result = build_plan(subject.path, replace(config, calib=CalibConfig(cache=cache), data=given))
        same = result.plan.sections["onnx"] == direct.plan.sections["onnx"]
        print(f"calibrate + build --calib-cache {'with --calib' if with_data else 'alone'}: worst cosine "
              f"{worst(result.plan):.4f} ({time.perf_counter() - start:.0f} s), plan identical to direct: {same}; "
              f"equalisation: {result.equalization}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
