#!/usr/bin/env python3
"""INT8 fidelity on the real-model zoo: trtopt's default plan, its best --method, and ONNX Runtime's
quantize_static on the same calibration data, each against the FP32 model on held-out data, with the
task's own metric (trtopt.metrics) and every output's cosine, and latency against FP32.

    python tools/bench_zoo.py [--models NAME ...] [--methods max percentile mse] [--count 64]
        [--eval-count 32] [--iterations 20] [--quick] [--out FILE.md]
    python tools/bench_zoo.py --model det.onnx --task detect-yolov8 --preprocess "--scale 255" --quick

Models come from tools/zoo.py (`python tools/zoo.py fetch` fills its cache; uncached models get a row
saying so), or one ONNX file with --model. Per model:
- calibration: the catalog's data (`calib_data/` photos, the text sets of `calib_text/`, or an .npz), the
  first --count samples; held-out evaluation never uses a calibration file (checked by content hash):
  the photos of `tests/data/heldout*`, the text sets rendered again with another seed, or an .npz's last
  samples;
- trtopt: `build_plan(BuildConfig(backend="cpu", ...))` with the catalog's preprocessing flags and static
  shape, once with trtopt's default method and once per --methods entry (any name `--method` takes,
  `auto` included once it exists); "best" is the method with the best held-out task metric (so it is
  chosen on the evaluation data: an upper bound on what picking a method can give);
- ONNX Runtime: `quant_pre_process`, then `quantize_static(QuantFormat.QDQ, per_channel=True,
  activation_type=QUInt8, weight_type=QInt8)` with its default MinMax calibrator, reading the same
  samples through trtopt's loader (trtopt holds the last 8 of 64 or more back to verify its plan);
- fidelity: each variant as it runs on this CPU ("kernels") against FP32 on the held-out samples: the
  task metric (box F1 after decoding for detectors, binarised score-map IoU for text detectors, exact
  sequence match of greedy CTC decoding for recognizers, top-1 agreement for classifiers) and the worst
  per-output cosine; the detail table adds the Q/DQ reference (the same graph with ONNX Runtime's graph
  optimisations off, so Q/DQ run as float math);
- latency: batch 1, 1 intra-op thread, the median of --iterations interleaved rounds, as a ratio to FP32
  (below 1 is faster), for the kernels and for the Q/DQ reference.

`--float16` benchmarks float16 copies of the models instead, as an FP16 export would give them:
`trtopt.precision.convert_to_fp16(keep_io_fp32=False)` (float16 inputs, outputs and weights; the ops of
`DEFAULT_KEEP_OPS` stay float32 between Casts). Every variant starts from the copy and is scored against the copy
as ONNX Runtime runs it (trtopt calibrates a float32 copy of it: trtopt.frontend.float_types).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_setup import run_isolated  # noqa: E402
from benchlib import emit, header_lines, interleaved, load_average  # noqa: E402
from zoo_variants import (  # noqa: E402
    CALIB_DIR,
    Subject,
    Variant,
    built,
    eval_feeds,
    ort_build,
    score,
    session,
    split_data,
    trtopt_build,
)

from trtopt.errors import TrtoptError  # noqa: E402

GOAL_COSINE = 0.99  # issue #16's bar for every output, detector heads included
# The command a report names.
COMMAND = ["tools/bench_zoo.py"]


def subjects(args: argparse.Namespace) -> list[Subject]:
    if args.model:
        calib = Path(args.calib) if args.calib else CALIB_DIR
        return [Subject(args.model.stem, args.model, args.task, tuple(shlex.split(args.preprocess or "")), calib,
                        None, "", "given")]  # fmt: skip
    try:
        import zoo  # tools/zoo.py
    except ImportError:
        raise SystemExit("tools/zoo.py is missing: this branch has no model zoo; pass --model FILE.onnx") from None
    known = {m.name for m in zoo.catalog()}
    unknown = set(args.models or ()) - known
    if unknown:
        raise SystemExit(f"unknown zoo models {sorted(unknown)}; the zoo has: {', '.join(sorted(known))}")
    return [
        Subject(m.name, zoo.cached_path(m.name), m.task, tuple(m.preprocess), zoo.calib_path(m), m.input_shape,
                m.input_name, f"{m.package} {m.version}")
        for m in zoo.catalog() if not args.models or m.name in args.models
    ]  # fmt: skip


def float16_copy(subject: Subject, workdir: Path) -> Subject:
    """`subject` with its model converted to float16 (`--float16`), written under `workdir`."""
    import dataclasses

    import onnx

    from trtopt.frontend import load_model
    from trtopt.precision import convert_to_fp16

    assert subject.path is not None
    path = workdir / f"{subject.name}.float16.onnx"
    onnx.save(convert_to_fp16(load_model(subject.path).model, keep_io_fp32=False), path)
    return dataclasses.replace(subject, path=path)


def run_subject(subject: Subject, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Build, evaluate and time every variant of one model."""
    assert subject.path is not None
    if args.float16:
        subject = float16_copy(subject, workdir)
    data = split_data(subject, args.count, args.eval_count, workdir)
    batches = eval_feeds(subject, data)
    trtopt = [built("default", _run(args, trtopt_build, subject, data, None))]
    trtopt += [built(m, _run(args, trtopt_build, subject, data, m)) for m in args.methods]
    ort = built("ORT QDQ MinMax", _run(args, ort_build, subject, data, str(workdir)))
    fp32 = session(subject.path)
    for v in [*trtopt, ort]:
        try:
            if not v.error:
                v.scores = {"kernels": score(fp32, session(v.kernels, engine=v is not ort), batches, subject.task),
                            "reference": score(fp32, session(v.reference, reference=True), batches, subject.task)}
        except (TrtoptError, RuntimeError) as exc:  # ONNX Runtime refused the quantised model: a row, not a crash
            v.error = f"cannot run it: {str(exc).splitlines()[0][:200]}"
    timed = {"fp32": session(subject.path, threads=1)}
    for key, v in (("trtopt", trtopt[0]), ("ort", ort)):
        if not v.error:
            timed[f"{key} kernels"] = session(v.kernels, threads=1, engine=key == "trtopt")
            timed[f"{key} reference"] = session(v.reference, threads=1, reference=True)
    first = batches[0][0]
    rows = len(next(iter(first.values())))  # trim the batch axis only (a model's state input has none)
    feeds = {k: a[:1] if len(a) == rows else a for k, a in first.items()}
    calls = {name: (lambda s=s: s.run(feeds)) for name, s in timed.items()}
    timings = interleaved(calls, args.warmup, args.iterations)
    ms = {name: timings.p50(name) for name in timings.ms}
    return {"subject": subject, "data": data, "trtopt": trtopt, "ort": ort, "ms": ms,
            "samples": sum(rows for _, rows in batches)}  # fmt: skip


def _run(args: argparse.Namespace, fn: Any, *fn_args: Any) -> Any:
    """A build in a fresh process (its memory returns after it), or in this one for --quick runs. A build
    process that dies (killed for memory on a shared machine) is a row saying so, not the end of the run."""
    if args.quick:
        return fn(*fn_args)
    try:
        return run_isolated(fn, *fn_args)[0]
    except BrokenProcessPool:
        return {"error": "the build process died (killed: out of memory?)"}


# --- report ------------------------------------------------------------------------------------------


def headline(v: Variant, side: str = "kernels") -> tuple[float | None, float]:
    """(task metric or None, worst per-output cosine) of a variant."""
    result = v.scores[side]
    value = result.task.headline()[1] if result.task is not None else None
    return value, result.worst_cosine


def rank(v: Variant) -> tuple[float, float]:
    value, cosine = headline(v)
    return (value if value is not None else cosine), cosine


def cell(v: Variant, side: str = "kernels") -> str:
    if v.error:
        return "build failed"
    value, cosine = headline(v, side)
    return ("" if value is None else f"{value * 100:.1f}% / ") + f"{cosine:.4f}"


def metric_name(result: dict[str, Any]) -> str:
    for v in [*result["trtopt"], result["ort"]]:
        if not v.error and v.scores["kernels"].task is not None:
            name = v.scores["kernels"].task.headline()[0]
            return name or "worst cosine only"
    return "–"


def summary_row(result: dict[str, Any]) -> str:
    s: Subject = result["subject"]
    trtopt, ort, ms = result["trtopt"], result["ort"], result["ms"]
    default, fine = trtopt[0], [v for v in trtopt if not v.error]
    best = max(fine, key=rank) if fine else default
    build = "yes" if not default.error else f"no: {default.error[:120]}"
    ratio = {k: f"{ms[k] / ms['fp32']:.2f}" if k in ms else "–" for k in
             ("trtopt kernels", "trtopt reference", "ort kernels", "ort reference")}  # fmt: skip
    goal = "–"
    if not default.error and not ort.error:
        goal = f"{_goal(default, ort, 'kernels')} (ref: {_goal(default, ort, 'reference')})"
    best_name = best.note.removeprefix("method ") if not best.error else "–"
    kept = str(len(default.excluded.get("layers", {}))) if default.excluded else "–"
    return (f"| {s.name} | {s.task}: {metric_name(result)} | {build} | {cell(default)} | {kept} "
            f"| {best_name}: {cell(best)} | {cell(ort)} (ref {cell(ort, 'reference')}) | {goal} "
            f"| {ratio['trtopt kernels']} / {ratio['trtopt reference']} "
            f"| {ratio['ort kernels']} / {ratio['ort reference']} | {ms['fp32']:.1f} |")  # fmt: skip


def _goal(default: Variant, ort: Variant, ort_side: str) -> str:
    """Issue #16's goal for trtopt's default plan as it runs, against ORT's kernels or ORT's Q/DQ reference."""
    d, o = headline(default), headline(ort, ort_side)
    as_faithful = d[0] >= o[0] if d[0] is not None and o[0] is not None else d[1] >= o[1]
    return "yes" if as_faithful and d[1] >= GOAL_COSINE else "no"


def detail_rows(result: dict[str, Any]) -> list[str]:
    rows = []
    for v in [*result["trtopt"], result["ort"]]:
        label = f"trtopt {v.name}" if v.name != "ORT QDQ MinMax" else v.name
        if v.error:
            rows.append(f"| {result['subject'].name} | {label} | – | failed: {v.error[:160]} | – | – | – | – |")
            continue
        task = v.scores["kernels"].task
        counts = _counts(task.to_dict()) if task is not None else ""
        rows.append(f"| {result['subject'].name} | {label} ({v.note}) | {v.build_s:.1f} s | {cell(v)} {counts} "
                    f"| {cell(v, 'reference')} | {worst_input(v)} | {_outputs(v)} | {excluded(v)} |")  # fmt: skip
    return rows


def excluded(v: Variant) -> str:
    """The layers trtopt's sensitivity analysis kept float, with the calibration-sample cosine before/after."""
    record = v.excluded
    if not record:
        return "–"
    layers, wider = list(record.get("layers", {})), record.get("thresholds", {})
    cosines = f"cos {record['before']:.4f} → {record['after']:.4f} on calibration samples"
    widened = ", ".join(f"{tensor} {move['from']:.3g} → {move['to']:.3g}" for tensor, move in wider.items())
    moves = f"; {len(wider)} thresholds widened (trtopt.search._widen): {widened}" if wider else ""
    if not layers:
        return "none" if record["before"] >= GOAL_COSINE else f"none{moves or ' helped'} ({cosines})"
    shown = ", ".join(layers[:6]) + (f" (+{len(layers) - 6} more)" if len(layers) > 6 else "")
    return f"{len(layers)}: {shown}{moves} ({cosines})"


def _counts(task: dict[str, Any]) -> str:
    m = task["metrics"]
    if task["task"] == "detect":
        return f"(boxes FP32 {m['reference_boxes']}, INT8 {m['test_boxes']}, matched {m['matched']})"
    if task["task"] == "text-detect":
        return f"(pixels > {m['threshold']:g}: FP32 {m['reference_pixels']}, INT8 {m['test_pixels']})"
    if task["task"] == "segment":
        return f"(pixels with FP32's label {m['pixel_agreement']:.2%})"
    if task["task"] == "ctc":
        return f"(edit distance {m['mean_normalized_edit_distance']:.3f}; {m['empty_reference']} FP32 empty)"
    return ""


def worst_input(v: Variant) -> str:
    """The lowest one-input cosine over the outputs with one row per input (`trtopt.metrics.compare.ErrorStats`),
    and its output: what the per-output cosine, a figure over every input at once, can hide."""
    found = min(((s.worst_sample[0], s.name) for s in v.scores["kernels"].outputs if s.worst_sample), default=None)
    return f"{found[0]:.4f} ({found[1][:24]})" if found else "–"


def _outputs(v: Variant) -> str:
    stats = v.scores["kernels"].outputs
    return ", ".join(f"{s.name[:24]} {s.cosine:.4f} / {s.rel_error:.3f}" for s in stats[:4]) + (
        f" (+{len(stats) - 4} more)" if len(stats) > 4 else "")


def report(results: list[dict[str, Any]], missing: list[Subject | tuple[Subject, str]], args: argparse.Namespace,
           argv: list[str], minutes: float, load_before: str) -> str:  # fmt: skip
    title = "Real-model zoo" + (", float16 copies" if args.float16 else "")
    copies = ("- **float16 copies**: each model converted by `trtopt.precision.convert_to_fp16(keep_io_fp32=False)`, "
              "as an FP16 export would be; every variant starts from the copy, and \"FP32\" below means the float16 "
              "copy as ONNX Runtime runs it") if args.float16 else ""  # fmt: skip
    lines = [
        f"## {title}: task fidelity of trtopt INT8 vs ONNX Runtime quantize_static (CPU)",
        "",
        *header_lines(COMMAND[0], [*COMMAND[1:], *argv]),
        *([copies] if copies else []),
        f"- took {minutes:.1f} min; 1-minute load average {load_before} before, {load_average()} after (more than "
        "~2 on 2 cores means other jobs ran and the latencies are noisy)",
        f"- per model: up to {args.count} calibration samples, {args.eval_count} held-out samples (never calibration "
        f"files), trtopt default (`--method auto` and the sensitivity search) + methods "
        f"{', '.join(args.methods) or 'none'} (each alone: `--no-auto-exclude`), ORT QDQ MinMax; latency: batch 1, "
        f"1 thread, median of {args.iterations} interleaved rounds",
        "",
        "| model | task: metric | trtopt builds | trtopt default: metric / worst cos | default: layers kept float "
        "by sensitivity | best method: metric / worst "
        "cos | ORT QDQ: metric / worst cos (its Q/DQ reference) | goal: default ≥ ORT, cos ≥ 0.99 (vs ORT's "
        "reference) | latency / FP32: trtopt kernels / reference | ORT kernels / reference | FP32 ms |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|",
        *[summary_row(r) for r in results],
        *[_missing_row(s) for s in missing],
        "",
        "Metric: box F1 (FP32's boxes matched at IoU ≥ 0.5 within a class, after YOLO decoding, score ≥ 0.25, "
        "NMS 0.45; the layout model's PicoDet heads decoded by tools/zoo_decoders.py), map IoU (score maps "
        "binarised at 0.3, DB's threshold), exact match (greedy CTC decoding, blank 0), top-1 agreement; worst "
        "cos: the lowest cosine with FP32 over the model's outputs. For the layout model the task metric, not "
        "the cosine alone, says whether the boxes a user gets are the same; the cosine measures the scores that "
        "make them: in its class-score maps the values of 0.05 or more (under 9% of them) carry 79-98% of the "
        "energy and 75-91% of the INT8 error (64 held-out pages, avx2, docs/zoo.md). "
        "Kernels: as ONNX Runtime runs the model on this CPU (trtopt: as `trtopt.Engine` runs the plan). Goal "
        "(issue #16): trtopt's default plan has a task metric at least ORT's (the worst cosine where the task "
        "has no metric) and a worst output cosine of at least 0.99. Best method: chosen on the held-out data "
        "itself, so an upper bound of what choosing a method can give. ORT's reference is its Q/DQ graph run as "
        "float math: what its calibration means, apart from this CPU's kernels (on CPUs without VNNI its u8s8 "
        "kernels saturate, so its kernels fall below its reference; trtopt's plans verify theirs at build time).",
        "",
        "### Every variant: kernels and Q/DQ reference",
        "",
        "| model | variant | build | kernels: metric / worst cos (counts) | reference: metric / worst cos "
        "| worst input: cosine (kernels) | per output: cosine / rel. error (kernels) "
        "| kept float by sensitivity analysis |",
        "|---|---|---:|---|---:|---:|---|---|",
        *[row for r in results for row in detail_rows(r)],
        "",
        "Data per model: " + "; ".join(f"{r['subject'].name}: {r['data'].description}" for r in results) + ".",
    ]
    return "\n".join(lines) + "\n"


def _missing_row(entry: Subject | tuple[Subject, str]) -> str:
    s, why = entry if isinstance(entry, tuple) else (entry, f"not cached (`python tools/zoo.py fetch {entry.name}`)")
    return f"| {s.name} | {s.task} | {why} | – | – | – | – | – | – | – | – |"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from trtopt.build import BuildConfig
    from trtopt.calib import METHODS

    default = BuildConfig().calib.method
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", metavar="NAME", help="zoo models (default: every cached one)")
    parser.add_argument("--model", type=Path, help="one ONNX file instead of the zoo (with --task, --preprocess)")
    parser.add_argument("--task", default="raw", help="with --model: a zoo task (classify, detect-yolov8, ctc...)")
    parser.add_argument("--preprocess", help="with --model: trtopt preprocessing flags, quoted")
    parser.add_argument("--calib", help="with --model: calibration folder or .npz (default calib_data/)")
    parser.add_argument("--methods", nargs="*", default=[m for m in METHODS.names() if m != default],
                        help=f"trtopt --method values besides the default ({default}); e.g. auto")
    parser.add_argument("--count", type=int, default=64, help="calibration samples per model (default 64)")
    parser.add_argument("--eval-count", type=int, default=32, help="held-out samples per model (default 32)")
    parser.add_argument("--iterations", type=int, default=20, help="timed rounds (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 8 + 4 samples, one method, 3 rounds, builds in this process")
    parser.add_argument("--float16", action="store_true",
                        help="benchmark float16 copies of the models (trtopt.precision.convert_to_fp16)")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    if args.quick:
        args.count, args.eval_count, args.iterations, args.warmup = 8, 4, 3, 1
        args.methods = args.methods[:1]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before, start = load_average(), time.perf_counter()
    everything = subjects(args)
    cached = [s for s in everything if s.path is not None]
    if args.quick and not args.model:
        cached = cached[:1]
    missing = [s for s in everything if s.path is None]
    argv_used = sys.argv[1:] if argv is None else argv
    results: list[dict[str, Any]] = []
    failed: list[tuple[Subject, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-zoo-") as tmp:
        for done, subject in enumerate(cached):
            print(f"== {subject.name} ({done + 1} of {len(cached)})", file=sys.stderr, flush=True)
            try:
                results.append(run_subject(subject, args, Path(tmp)))
            except TrtoptError as exc:  # its data or model cannot be used: a row saying why, then the next model
                failed.append((subject, str(exc).splitlines()[0][:200]))
            if args.out and done + 1 < len(cached):  # a long run leaves what it has measured so far
                minutes = (time.perf_counter() - start) / 60
                partial = report(results, [*missing, *failed], args, argv_used, minutes, load_before)
                args.out.write_text(partial + f"\n(partial: {done + 1} of {len(cached)} models so far)\n")
    text = report(results, [*missing, *failed], args, argv_used, (time.perf_counter() - start) / 60, load_before)
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

