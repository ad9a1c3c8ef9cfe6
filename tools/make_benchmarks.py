#!/usr/bin/env python3
"""Regenerate BENCHMARKS.md from the benchmark scripts, with their plots under docs/benchmarks/.

    python tools/make_benchmarks.py            # full run, ~10-15 minutes on 2 cores
    python tools/make_benchmarks.py --quick --out /tmp/b/BENCHMARKS.md   # smoke run, about a minute

Each script runs in its own process and writes its section (markdown, with date, machine, versions and
its exact command) to docs/benchmarks/<name>.md beside the output; this script only concatenates those
sections, adds the plots and a header. Numbers come from the scripts alone: never edit BENCHMARKS.md.
--quick runs every script with few images and iterations (numbers meaningless, for tests and CI).
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLOTS = Path("docs") / "benchmarks"
sys.path.insert(0, str(ROOT / "tools"))

from benchlib import shown_path, source_revision  # noqa: E402


@dataclass(frozen=True)
class Section:
    name: str
    script: str
    args: tuple[str, ...]
    quick_args: tuple[str, ...]
    plot: bool  # the script takes --plot FILE.png


# (args, quick args) of the sections run on each CPU class (avx2, and AVX-512 VNNI: the "-vnni" sections)
EXPORTS_ARGS = (("--count", "32", "--eval-count", "32", "--iterations", "10"),
                ("--models", "fer-emotion", "--count", "8", "--eval-count", "8", "--iterations", "2", "--warmup", "1"))
RUNTIMES_ARGS = (("--count", "16", "--eval-count", "16", "--iterations", "6"),
                 ("--models", "demo", "--count", "8", "--eval-count", "8", "--iterations", "2", "--warmup", "1"))
PHOTO_METHODS = ("--methods", "fp32", "fp32-images", "trtopt-calibrate", "trtopt-entropy", "ort-entropy")
SECTIONS = (
    Section("optimizer", "tools/bench_optimizer.py", ("--repeat", "30"), ("--repeat", "3"), False),
    Section(
        "calibration",
        "tools/bench_calibration.py",
        ("--counts", "128", "512", "--repeat", "3"),
        ("--counts", "16", "--methods", "trtopt-entropy", "ort-entropy"),
        False,
    ),
    # Issue #18: calibration on camera-sized photos (decoding included) against FP32 inference and ORT.
    Section(
        "calibration-photos",
        "tools/bench_calibration.py",
        ("--photos", "2880x1920", "--counts", "128", "512", "--repeat", "3", *PHOTO_METHODS),
        ("--photos", "640x480", "--counts", "16", "--methods", "fp32", "trtopt-calibrate", "trtopt-entropy"),
        False,
    ),
    Section(
        "calibration-photos-resnet50",
        "tools/bench_calibration.py",
        ("--model", "light:resnet50", "--photos", "2880x1920", "--counts", "128", "512", "--repeat", "3",
         *PHOTO_METHODS),  # fmt: skip
        ("--model", "light:resnet50", "--photos", "640x480", "--counts", "8", "--methods", "fp32", "trtopt-entropy"),
        False,
    ),
    Section(
        "calibration-profile", "tools/bench_calibration_profile.py", (), ("--count", "8", "--size", "640x480"), False
    ),
    Section(
        "calibration-profile-resnet50",
        "tools/bench_calibration_profile.py",
        ("--model", "light:resnet50"),
        ("--model", "light:resnet50", "--count", "8", "--size", "640x480"),
        False,
    ),
    Section(
        "accuracy",
        "tools/bench_accuracy.py",
        (),
        ("--count", "8", "--eval-count", "8", "--methods", "entropy", "--ort", "minmax", "--ort-raw",
         "--ort-reduce-range", "--u8u8", "--u8s8"),  # fmt: skip
        True,
    ),
    # Cross-validated method choice and the weights/activations split behind the accuracy goal's status.
    Section(
        "accuracy-analysis",
        "tools/bench_accuracy_analysis.py",
        (),
        ("--count", "8", "--eval-count", "4", "--folds", "2", "--methods", "entropy", "max"),
        False,
    ),
    Section(
        "latency",
        "tools/bench_latency.py",
        ("--batches", "1", "8", "32", "--iterations", "100"),
        ("--model", "tiny_cnn", "--batches", "1", "--iterations", "3", "--warmup", "1", "--count", "4"),
        True,
    ),
    # A dense-conv topology (random weights: latency only), to show what the INT8 kernels give where
    # depthwise convs do not dominate.
    Section(
        "latency-resnet50",
        "tools/bench_latency.py",
        ("--model", "light:resnet50", "--batches", "1", "8", "--iterations", "30", "--count", "16"),
        ("--model", "light:resnet50", "--batches", "1", "--iterations", "2", "--warmup", "1", "--count", "2",
         "--no-ort"),  # fmt: skip
        True,
    ),
    # What `trtopt.Engine` adds per call to the session it wraps (the CPU runtime benchmarks time plans through it).
    Section(
        "engine",
        "tools/bench_engine.py",
        ("--batches", "1", "8", "--iterations", "100"),
        ("--model", "tiny_cnn", "--batches", "1", "--iterations", "2", "--warmup", "1", "--count", "4"),
        False,
    ),
    # Issue #16: every zoo model (tools/zoo.py; fetch the cache first), trtopt default / best method vs ORT.
    # 32 calibration samples and two forced methods keep it about an hour; 64 held-out samples, as 16 moved the
    # worst cosines by about +-0.005 (docs/zoo.md).
    Section(
        "zoo",
        "tools/bench_zoo.py",
        ("--count", "32", "--eval-count", "64", "--methods", "entropy", "max", "--iterations", "10"),
        ("--quick",),
        False,
    ),
    # The zoo's models as FP16 exports (trtopt.precision.convert_to_fp16): INT8 of float16 models, against them;
    # held out on 64 samples as the zoo section is.
    Section(
        "zoo-float16",
        "tools/bench_zoo.py",
        ("--float16", "--count", "32", "--eval-count", "64", "--methods", "--iterations", "5"),
        ("--float16", "--quick"),
        False,
    ),
    # Issue #45: the export corpus (tools/corpus.py; fetch it first): what trtopt optimize, ORT's basic level and
    # onnxslim leave of real exports, and trtopt INT8 against ORT quantize_static (also reduce_range) at b1 and b8.
    Section(
        "exports",
        "tools/bench_exports.py",
        *EXPORTS_ARGS,
        False,
    ),
    # The same on a CPU with AVX-512 VNNI, where ONNX Runtime's u8s8 kernels are exact (`--only exports-vnni` on
    # such a machine; the section's heading and header name the CPU class it ran on).
    Section(
        "exports-vnni",
        "tools/bench_exports.py",
        *EXPORTS_ARGS,
        False,
    ),
    # Issue #44: trtopt's plans on ONNX Runtime and OpenVINO, NNCF on OpenVINO and ORT's quantizer, b1 and b8, 1 thread
    # and all (needs the openvino extra, and nncf beside it).
    Section(
        "cpu-runtimes",
        "tools/bench_cpu_runtimes.py",
        *RUNTIMES_ARGS,
        False,
    ),
    Section(  # on an AVX-512 VNNI CPU, as exports-vnni
        "cpu-runtimes-vnni",
        "tools/bench_cpu_runtimes.py",
        *RUNTIMES_ARGS,
        False,
    ),
    # Issue #21: --method auto against entropy and ORT's quantize_static on real OCR models, the demo and two
    # light classifiers, with task metrics, and what auto's scoring costs.
    Section(
        "auto-calibration",
        "tools/bench_autocalib.py",
        (),
        ("--models", "light:squeezenet", "--variants", "default", "entropy", "--calib-count", "16",
         "--eval-count", "4"),  # fmt: skip
        False,
    ),
    # Issue #45: trtopt's CPU placement against ORT's quantizer on a Keras-style ResNet-50, one change at a time.
    Section("cpu-placement", "tools/bench_cpu_placement.py", ("--inception",),
            ("--count", "8", "--batches", "1", "--rounds", "2"), False),  # fmt: skip
    # The per-conv measurement behind the CPU backend's GEMM routing threshold.
    Section("conv-kernels", "tools/bench_conv_kernels.py", ("--iterations", "30"), ("--iterations", "2"), False),
    # Issue #20: what 2:4 magnitude pruning costs per layer and within a budget, FP32 and INT8, and the MAC share.
    Section(
        "sparsity",
        "tools/bench_sparsity.py",
        ("--sens-count", "32", "--int8-count", "64"),
        ("--sens-count", "2", "--eval-count", "2", "--budgets", "0.01", "--top", "1", "--int8-count", "8",
         "--no-int8-layers"),  # fmt: skip
        False,
    ),
    # The same on a trained ResNet-50 (open-nsfw from the zoo cache; a section saying "skipped" without it).
    # INT8 builds for the budget rows, the least and most sensitive layers and the largest ones by MACs only.
    Section(
        "sparsity-resnet50",
        "tools/bench_sparsity.py",
        ("--model", "zoo:open-nsfw", "--sens-count", "16", "--int8-count", "64", "--budgets", "0.001", "0.01",
         "--top", "3", "--int8-layers-by-macs", "6"),  # fmt: skip
        ("--model", "zoo:open-nsfw", "--sens-count", "1", "--eval-count", "1", "--budgets", "0.01", "--top", "1",
         "--no-int8"),  # fmt: skip
        False,
    ),
    # Issue #19: the plan served in-process, by the stdlib example and by Triton (needs tools/triton_env.py and
    # the serving extra); docs/serving.md sizes a fleet from it.
    Section(
        "serving",
        "tools/bench_serving.py",
        (),
        ("--seconds", "0.5", "--warmup", "0.2", "--concurrency", "1", "--photos", "4"),
        False,
    ),
)


def run_section(section: Section, out_dir: Path, quick: bool) -> tuple[str, float]:
    """Run one script with --out (and --plot) under `out_dir`; returns (its markdown, seconds)."""
    md = out_dir / f"{section.name}.md"
    args = [section.script, *(section.quick_args if quick else section.args), "--out", shown_path(md)]
    if section.plot:
        args += ["--plot", shown_path(md.with_suffix(".png"))]
    print(f"== {section.name}: python {' '.join(args)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise SystemExit(f"{section.script} failed (exit {done.returncode}); no BENCHMARKS.md written:\n{tail}")
    return md.read_text(), seconds


def with_plot(markdown: str, section: Section, out: Path, out_dir: Path) -> str:
    png = out_dir / f"{section.name}.png"
    if not section.plot or not png.is_file():
        return markdown
    rel = os.path.relpath(png, out.parent)
    return markdown.rstrip("\n") + f"\n\n![{section.name} plot]({rel})\n"


def document(parts: list[tuple[Section, str, float | None]], quick: bool, argv: list[str], total: float) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `tools/make_benchmarks.py` from the benchmark scripts in `tools/`; every number "
        "below comes from their output, unedited. Each section states its machine, versions, date and the "
        "exact command that produced it, so any one section can be re-run on its own. To regenerate all of it:",
        "",
        "    python tools/make_benchmarks.py",
        "",
        f"Last generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} with "
        f"`python {' '.join(['tools/make_benchmarks.py', *argv])}` in {total / 60:.1f} min "
        f"({', '.join(_took(s.name, sec) for s, _, sec in parts)}). "
        f"Code: {source_revision()}. Raw sections and plots: `{PLOTS}/`.",
        "",
    ]
    if quick:
        lines += ["> **--quick smoke run**: few images and iterations; the numbers mean nothing.", ""]
    anchors = _anchors([md for _, md, _ in parts])
    lines += [f"- [{s.name}](#{anchor})" for (s, _, _), anchor in zip(parts, anchors, strict=True)] + [""]
    return "\n".join(lines) + "\n" + "\n".join(md.rstrip("\n") + "\n" for _, md, _ in parts)


def _took(name: str, seconds: float | None) -> str:
    return f"{name} kept from an earlier run" if seconds is None else f"{name} {seconds:.0f} s"


def _anchors(sections: list[str]) -> list[str]:
    """GitHub's anchors for the sections' first headings: a repeated heading gets -1, -2, ... appended."""
    seen: dict[str, int] = {}
    anchors = []
    for markdown in sections:
        anchor = _anchor(markdown)
        anchors.append(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


def _anchor(markdown: str) -> str:
    """GitHub's anchor for the section's first heading."""
    title = next(line.lstrip("#").strip() for line in markdown.splitlines() if line.startswith("#"))
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: few images and iterations")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md",
                        help="the markdown to write; sections and plots go to docs/benchmarks/ beside it")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in SECTIONS],
                        help="re-run only these sections; the others keep their last output in docs/benchmarks/")
    parser.add_argument("--assemble", action="store_true",
                        help="re-run nothing: rebuild the document from the sections kept in docs/benchmarks/")
    args = parser.parse_args(argv)
    out_dir = args.out.parent / PLOTS
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    parts = []
    for section in SECTIONS:
        kept = out_dir / f"{section.name}.md"
        if args.assemble or (args.only and section.name not in args.only):
            if kept.is_file():  # keep the section's last output, with its own date and command
                parts.append((section, with_plot(kept.read_text(), section, args.out, out_dir), None))
            continue
        markdown, seconds = run_section(section, out_dir, args.quick)
        parts.append((section, with_plot(markdown, section, args.out, out_dir), seconds))
    text = document(parts, args.quick, sys.argv[1:] if argv is None else argv, time.perf_counter() - start)
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(parts)} sections)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
