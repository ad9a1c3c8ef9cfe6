#!/usr/bin/env python3
"""Does JPEG draft decoding change calibration? Pixels, thresholds and the demo plan, draft vs full decoding.

    python tools/bench_draft_decoding.py [--count 128] [--size 2880x1920] [--out docs/benchmarks/draft-decoding.md]

`trtopt.data.preprocess_file` decodes a JPEG at the smallest DCT scale that keeps the resize target
(issue #18). This script makes --count + 1 camera-sized photos from calib_data/ (tools/realistic_photos.py,
in a temporary folder) and builds the demo model's CPU INT8 plan three times:

  draft        photos 0..count-1, decoded as trtopt does (draft)
  full decode  the same photos, every JPEG decoded at full size
  draft, +1    photos 1..count: one photo swapped, decoded with draft; the noise floor that any change
               of the calibration data sets, for scale

and reports the preprocessed pixels' difference, each plan's entropy thresholds against the draft plan's,
and each plan's top-1 agreement with FP32 on the held-out photos (tests/data/heldout*; 256 px photos,
which every plan reads the same way), plus the held-out photos on which two plans disagree.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_setup import (  # noqa: E402
    DEMO_MODEL,
    HELDOUT_DIR,
    HELDOUT_MORE_DIR,
    emit,
    header_lines,
    image_dataset,
    load_average,
    resolve_model,
    stacked,
)
from realistic_photos import make_photos  # noqa: E402


@contextlib.contextmanager
def full_decoding() -> Iterator[None]:
    """Data sets decode every JPEG at full size while this is active."""
    import trtopt.data.dataset as dataset_module
    from trtopt.data import preprocess_image, read_image

    saved = dataset_module.preprocess_file
    dataset_module.preprocess_file = lambda path, spec: preprocess_image(read_image(path), spec)  # type: ignore
    try:
        yield
    finally:
        dataset_module.preprocess_file = saved


def build(model_path: Path, photos: list[Path]) -> tuple[dict[str, float], bytes]:
    """(entropy thresholds, the plan's ONNX as this CPU runs it) of a CPU INT8 build on `photos`."""
    from trtopt.backend.cpu.runner import model_for_this_cpu
    from trtopt.build import BuildConfig, build_plan
    from trtopt.data import DataConfig

    result = build_plan(model_path, BuildConfig(backend="cpu", data=DataConfig(sources=tuple(str(p) for p in photos))))
    return dict(result.calibration.amax), model_for_this_cpu(result.plan)


def top1(model_bytes: bytes, images: np.ndarray, batch: int = 8) -> np.ndarray:
    from trtopt.execution import OrtSession

    session = OrtSession(onnx.load_from_string(model_bytes))
    name = session.input_names[0]
    out = [session.run({name: images[i : i + batch]})[session.output_names[0]] for i in range(0, len(images), batch)]
    return np.concatenate(out).reshape(len(images), -1).argmax(1)


def pixel_difference(model: object, photos: list[Path]) -> tuple[float, float]:
    """Mean and max |draft - full| of the preprocessed samples, in 0..255 levels (before mean/std)."""
    import dataclasses

    from trtopt.data import preprocess_image, read_image
    from trtopt.data.preprocess import preprocess_file

    spec = dataclasses.replace(model.spec, scale=1.0, mean=(0.0,), std=(1.0,))  # type: ignore[attr-defined]
    diffs = [np.abs(preprocess_file(p, spec) - preprocess_image(read_image(p), spec)) for p in photos]
    return float(np.mean([d.mean() for d in diffs])), float(max(d.max() for d in diffs))


def deviation_row(name: str, amax: dict[str, float], reference: dict[str, float]) -> str:
    dev = sorted(abs(amax[t] / reference[t] - 1) for t in reference if reference[t] > 0)
    p90 = dev[int(0.9 * (len(dev) - 1))]
    same = sum(d == 0 for d in dev)
    return f"| {name} | {len(dev)} | {same} | {statistics.median(dev):.4f} | {p90:.4f} | {dev[-1]:.4f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=128)
    parser.add_argument("--size", default="2880x1920")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-draft-") as tmp:
        model = resolve_model(str(DEMO_MODEL), Path(tmp))
        photos = make_photos(Path(tmp) / "photos", args.count + 1, (width, height))
        mean_diff, max_diff = pixel_difference(model, photos[: min(32, args.count)])
        draft = build(model.path, photos[:-1])
        with full_decoding():
            full = build(model.path, photos[:-1])
        shifted = build(model.path, photos[1:])
    heldout = [stacked(image_dataset(model, folder))[0] for folder in (HELDOUT_DIR, HELDOUT_MORE_DIR)]
    images = np.concatenate(heldout)
    fp32 = top1(model.path.read_bytes(), images)
    plans = {"draft": draft, "full decode": full, "draft, one photo swapped": shifted}
    answers = {name: top1(plan, images) for name, (_, plan) in plans.items()}
    lines = [
        "## JPEG draft decoding: effect on calibration and on the demo plan",
        "",
        *header_lines("tools/bench_draft_decoding.py", sys.argv[1:]),
        f"- data: {args.count} (+1) photos of {args.size} made at run time from calib_data/ by "
        "tools/realistic_photos.py (upscaled, sensor-like grain, JPEG quality 90); held-out: "
        f"{len(images)} photos of tests/data/heldout and heldout_more; 1-minute load average {load}",
        "",
        f"Preprocessed samples, draft vs full decoding (first {min(32, args.count)} photos, 0..255 levels): "
        f"mean |difference| {mean_diff:.3f}, max {max_diff:.1f}.",
        "",
        "| calibration | tensors | identical T | median \\|T / T_draft - 1\\| | 90th pct | max |",
        "|---|---:|---:|---:|---:|---:|",
        deviation_row("full decode", full[0], draft[0]),
        deviation_row("draft, one photo swapped", shifted[0], draft[0]),
        "",
        "| plan | top-1 agreement with FP32 | held-out photos whose top-1 differs from the draft plan's |",
        "|---|---:|---:|",
    ]
    for name, answer in answers.items():
        agree = float(np.mean(answer == fp32))
        flips = int(np.sum(answer != answers["draft"]))
        lines.append(f"| {name} | {agree * 100:.1f}% ({int(np.sum(answer == fp32))}/{len(images)}) | {flips} |")
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
