#!/usr/bin/env python3
"""CPU INT8 runtimes side by side (issue #44): trtopt on ONNX Runtime and on OpenVINO, NNCF on OpenVINO, ONNX Runtime.

    python tools/bench_cpu_runtimes.py [--models demo open-nsfw keras-mobilenetv2 torch-resnet18-opset9]
        [--count 32] [--eval-count 16] [--iterations 10] [--warmup 2] [--out FILE.md]

Per model (the shipped demo, zoo models of tools/zoo.py, corpus models of tools/corpus.py), every variant
calibrated on the same first --count photos (`tools/zoo_variants.split_data`), each build in a fresh process:
- trtopt cpu: `build_plan(backend="cpu")`, trtopt's default CPU build; trtopt openvino: `backend="openvino"`;
  trtopt's default plan (`--backend auto`) is whichever of the two `trtopt.auto_backend` keeps, timed as a build
  does (`pick`: at batch 1 and the build's batch, chosen on those times and the two builds' INT8 errors): its
  column repeats that plan's figures, and the goal column says whether it is at least as fast as every peer at b1
  and b8 (issue #44) and at least as faithful, judged on the two plans' own per-round ratio (which can differ a
  little from the ratio of their speed-ups over FP32): "yes"; "tie" where a peer was ahead by less than this
  run's noise (the 90% bootstrap interval of the median per-round ratio, `benchlib.paired_interval`, reaches
  parity, or the gap is no wider than a second session of the default plan, timed in the same rounds, ran apart
  from the first: `benchlib.session_noise`); "no" where a peer was ahead beyond it or more faithful;
- NNCF: `nncf.quantize` of the FP32 model read by OpenVINO, default preset (performance: symmetric), default
  settings, compiled by OpenVINO;
- ORT: `quant_pre_process` + `quantize_static` (QDQ, per-channel, u8s8, MinMax; `tools/zoo_variants.ort_build`).
Speed: speed-up over FP32 on ONNX Runtime at batch 1 and 8, one intra-op thread and all (`os.cpu_count()`),
--iterations interleaved rounds (`tools/bench_latency.interleaved`), median of per-round ratios. Every ONNX Runtime
session here runs with its intra-op threads' spinning off (`Engine.load(spin=False)`): with it on, a session's
threads busy-wait after each call and slow the next session's call on the same cores, so that with 2 threads the
order of the calls, not the plans, decided the ratios (the 2-thread rows before this change). Fidelity on the
held-out photos: each output's mean per-sample cosine to FP32, the lowest of them (a detector's or a landmark
model's several heads: the first output alone hid the one a plan moved), and top-1 agreement on the first output
for classifiers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus  # noqa: E402
import zoo  # noqa: E402
from bench_exports import subject_of  # noqa: E402
from bench_latency import FP32  # noqa: E402
from bench_setup import run_isolated  # noqa: E402
from benchlib import behind, emit, header_lines, interleaved, load_average  # noqa: E402
from zoo_variants import CALIB_DIR, ROOT, Subject, build_config, eval_feeds, load, ort_build, split_data  # noqa: E402

VARIANTS = ("trtopt cpu", "trtopt openvino", "NNCF + OpenVINO", "ORT quantize_static")


def subject_named(name: str) -> Subject:
    if name == "demo":
        return Subject("demo", ROOT / "models" / "efficientnet_lite0.onnx", "classify", (), CALIB_DIR, None, "input",
                       "shipped")  # fmt: skip
    if name in {m.name for m in zoo.catalog()}:
        m = zoo.model_named(name)
        return Subject(m.name, zoo.cached_path(m.name), m.task, tuple(m.preprocess), zoo.calib_path(m), m.input_shape,
                       m.input_name, f"{m.package} {m.version}")  # fmt: skip
    return subject_of(corpus.model_named(name))


def trtopt_plan(subject: Subject, data: Any, backend: str, out: str, min_channels: int | None = None) -> dict[str, Any]:
    """trtopt's default build for `backend` (`min_channels`: that width rule instead of the backend's), written to
    `out`; its verification's figures."""
    from trtopt.build import build_plan
    from trtopt.plan import write_plan

    config = build_config(subject, data, None)
    config = replace(config, backend=backend, quant=replace(config.quant, min_channels=min_channels))
    result = build_plan(subject.path, config)
    write_plan(result.plan, out)
    v, quant = result.verification, result.plan.metadata.quant
    return {"error_to_fp32": v.reference_vs_fp32.rel_error if v else None, "variant": v.variant if v else "",
            "float_layers": len(quant.float_layers) if quant else None, "float_plan": quant is None}


def nncf_model(subject: Subject, data: Any, out: str) -> dict[str, Any]:
    """NNCF's post-training quantisation, default preset, of the FP32 model in OpenVINO, on the calibration photos."""
    import nncf
    import openvino as ov

    dataset = load(subject, data.calib_sources, data.calib_count)
    feeds = [batch.feeds for batch in dataset.batches(1)]
    model = ov.Core().read_model(str(subject.path))
    quantized = nncf.quantize(model, nncf.Dataset(feeds), subset_size=len(feeds))
    ov.save_model(quantized, out)
    return {}


def _auto_error(result: dict[str, Any]) -> float | None:
    """A build's error as `auto` reads it (`auto_backend._error`): None for a float plan, which sets no bar."""
    return None if result.get("float_plan") else (result["error_to_fp32"] or 0.0)


def default_backend(work: Path, subject: Subject, data: Any, errors: dict[str, float | None],
                    notes: dict[str, str]) -> str:  # fmt: skip
    """The plan `--backend auto` keeps of those built in `work` (`trtopt.auto_backend.pick`: timed as a build times
    them, chosen on those times and each plan's INT8 error to FP32): "cpu" or "openvino", or "openvino-narrow" where
    auto built OpenVINO's plan again with the CPU backend's width rule (`auto_backend.build_fastest`: a faster plan
    that was not as faithful), written beside the others; "" where neither was built."""
    from trtopt import auto_backend as auto
    from trtopt.plan import read_plan
    from trtopt.quant.config import DEFAULT_MIN_CHANNELS

    names = [name for name in ("cpu", "openvino") if (work / f"{name}.engine").exists()]
    if len(names) < 2:
        return next(iter(names), "")
    batch = build_config(subject, data, None).data.batch
    plans = {name: read_plan(work / f"{name}.engine") for name in names}
    kept, _, refused = auto.pick(plans, errors, batch)
    for name in refused:
        file = work / f"{name}-narrow.engine"
        result = run_isolated(trtopt_plan, subject, data, name, str(file), DEFAULT_MIN_CHANNELS)[0]
        errors[name] = _auto_error(result)
        notes[f"trtopt {name}-narrow"] = (f"{result['variant']}, INT8 error to FP32 {errors[name] or 0.0:.3f}: auto's "
                                          f"second {name} build, layers narrower than {DEFAULT_MIN_CHANNELS} channels "
                                          "float")  # fmt: skip
        plans[name] = read_plan(file)
    if refused:
        kept = auto.pick(plans, errors, batch)[0]
        kept = f"{kept}-narrow" if kept in refused else kept
    return kept


def runners(subject: Subject, work: Path, threads: int, twin: str = "") -> dict[str, Any]:
    """name -> feeds -> every output in the model's order, for FP32 and each variant that was built; `twin` (a
    trtopt variant): that plan once more, in a session of its own (`benchlib.session_noise`)."""
    import openvino as ov
    from zoo_variants import session

    from trtopt.engine import Engine

    calls: dict[str, Any] = {}
    fp32 = session(subject.path, threads=threads, spin=False)
    calls[FP32] = lambda f, s=fp32: list(s.run(f).values())
    for name, file in (("trtopt cpu", "cpu.engine"), ("trtopt openvino", "openvino.engine"),
                       ("trtopt openvino-narrow", "openvino-narrow.engine")):  # fmt: skip
        if not (work / file).exists():
            continue
        for label in (name, *([twin_of(name)] if name == twin else [])):
            engine = Engine.load(work / file, threads=threads, spin=False)
            calls[label] = lambda f, e=engine: list(e.infer(f).values())
    if (work / "nncf.xml").exists():
        compiled = ov.Core().compile_model(str(work / "nncf.xml"), "CPU", {"INFERENCE_NUM_THREADS": threads,
                                           "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"})  # fmt: skip
        calls["NNCF + OpenVINO"] = lambda f, c=compiled: list(c(f).to_tuple())
    if (work / "ort.onnx").exists():
        ort_session = session(work / "ort.onnx", threads=threads, spin=False)
        calls["ORT quantize_static"] = lambda f, s=ort_session: list(s.run(f).values())
    return calls


def fidelity(calls: dict[str, Any], batches: list) -> dict[str, tuple[float, float | None]]:
    """name -> (the lowest over outputs of the mean per-sample cosine to FP32, top-1 agreement on the first output
    or None) on the held-out batches."""
    outputs: dict[str, list[list[np.ndarray]]] = {name: [] for name in calls}
    for feeds, rows in batches:
        for name, call in calls.items():
            outputs[name].append([np.asarray(o)[:rows].reshape(rows, -1).astype(np.float64) for o in call(feeds)])
    refs = [np.concatenate(parts) for parts in zip(*outputs[FP32], strict=True)]
    result = {}
    for name in calls:
        outs = [np.concatenate(parts) for parts in zip(*outputs[name], strict=True)]
        cosines = [float(np.mean(np.sum(out * ref, 1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(ref, axis=1)
                                                          + 1e-30))) for out, ref in zip(outs, refs, strict=True)]
        first, ref = outs[0], refs[0]
        top1 = float(np.mean(first.argmax(1) == ref.argmax(1))) if ref.shape[1] > 1 else None
        result[name] = (min(cosines), top1)
    return result


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    subject = subject_named(name)
    with tempfile.TemporaryDirectory(prefix="bench-cpu-runtimes-") as tmp:
        work = Path(tmp)
        data = split_data(subject, args.count, args.eval_count, work)
        batches = eval_feeds(subject, data)
        notes: dict[str, str] = {}
        errors: dict[str, float | None] = {}  # backend -> its INT8 reference's error to FP32, as auto reads it
        builds = {"trtopt cpu": (trtopt_plan, subject, data, "cpu", str(work / "cpu.engine")),
                  "trtopt openvino": (trtopt_plan, subject, data, "openvino", str(work / "openvino.engine")),
                  "NNCF + OpenVINO": (nncf_model, subject, data, str(work / "nncf.xml")),
                  "ORT quantize_static": (ort_build, subject, data, str(work))}  # fmt: skip
        for variant, (fn, *rest) in builds.items():
            try:
                result = run_isolated(fn, *rest)[0]
            except Exception as exc:  # a build that fails is a cell, not the end of the run
                notes[variant] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
                continue
            if "kernels" in result:
                (work / "ort.onnx").write_bytes(result["kernels"])
            notes[variant] = str(result.get("variant") or result.get("error") or "")
            if result.get("error_to_fp32") is not None:
                notes[variant] += f", INT8 error to FP32 {result['error_to_fp32']:.3f}"
                notes[variant] += f", {result['float_layers']} layer(s) kept float" if result["float_layers"] else ""
                errors[variant.removeprefix("trtopt ")] = _auto_error(result)
        default = default_backend(work, subject, data, errors, notes)
        scores = fidelity(runners(subject, work, 1), batches)
        twin = f"trtopt {default}" if default else ""
        speed = {(threads, batch): _speedups(runners(subject, work, threads, twin), batches, batch, args)
                 for threads in (1, os.cpu_count() or 1) for batch in (1, 8)}  # fmt: skip
    return {"name": name, "source": subject.source, "scores": scores, "speed": speed, "notes": notes,
            "default": default}  # fmt: skip


def twin_of(variant: str) -> str:
    return f"{variant}, second session"


def _speedups(calls: dict[str, Any], batches: list, batch: int, args: argparse.Namespace) -> dict[str, float] | str:
    feeds = {k: v[:batch] for k, v in batches[0][0].items()}
    if len(next(iter(feeds.values()))) < batch:
        return "static batch 1"
    timings = interleaved({n: (lambda c=c: c(feeds)) for n, c in calls.items()}, args.warmup, args.iterations, batch)
    return {n: timings.speedup(n) for n in calls if n != FP32} | {"fp32 ms": timings.p50(FP32), "ms": timings.ms}


def rows(results: list[dict[str, Any]]) -> list[str]:
    head = ["model", "threads", "trtopt default (auto): b1 / b8", *(f"{v}: b1 / b8" for v in VARIANTS),
            "goal: default ≥ every peer at b1 and b8, ≥ their cosine", *(f"{v}: cosine / top-1" for v in VARIANTS)]
    numbers = "---:|" * len(VARIANTS)
    lines = ["| " + " | ".join(head) + " |", f"|---|---:|---|{numbers}---|{numbers}"]
    for r in results:
        default = f"trtopt {r['default']}"
        for threads in sorted({t for t, _ in r["speed"]}):
            pair = [r["speed"][(threads, b)] for b in (1, 8)]
            cells = [_speed_cell(pair, v) for v in (default, *VARIANTS)]
            cells[0] += f" ({r['default']})" if r["default"] else ""
            fids = [f"{r['scores'][v][0]:.4f}" + (f" / {r['scores'][v][1]:.0%}" if r["scores"][v][1] is not None
                                                  else "") if v in r["scores"] else "—" for v in VARIANTS]  # fmt: skip
            cells += [_goal(pair, r["scores"], default), *(fids if threads == 1 else [""] * len(VARIANTS))]
            lines.append(f"| {r['name']} | {threads} | " + " | ".join(cells) + " |")
    return lines


def _speed_cell(pair: list[Any], variant: str) -> str:
    return " / ".join(f"{p[variant]:.2f}x" if isinstance(p, dict) and variant in p else
                      (p if isinstance(p, str) else "—") for p in pair)  # fmt: skip


def _goal(pair: list[Any], scores: dict[str, tuple[float, float | None]], default: str) -> str:
    """Whether the default plan is at least as fast as every peer (other tools, not trtopt's other backend) at b1
    and b8 in this row, and at least as faithful (held-out cosine); else who is ahead where."""
    if default not in scores:
        return "no: trtopt's build failed"
    peers = [v for v in VARIANTS if not v.startswith("trtopt") and v in scores]
    gaps = [(f"{v} at b{b} ({p[v]:.2f}x: {gap})", gap.endswith("noise"))
            for b, p in zip((1, 8), pair, strict=True) if isinstance(p, dict)
            for v in peers if v in p and (gap := behind(p["ms"], default, v, twin_of(default)))]  # fmt: skip
    gaps += [(f"{v}'s cosine", False) for v in peers if scores[v][0] > scores[default][0] + 1e-4]
    misses = [text for text, noise in gaps if not noise]
    if misses:
        return "no: " + ", ".join(misses)
    return "tie: " + ", ".join(text for text, _ in gaps) if gaps else "yes"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=["demo", "open-nsfw", "keras-mobilenetv2",
                                                         "torch-resnet18-opset9"])  # fmt: skip
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--eval-count", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    before, results = load_average(), []
    for name in args.models:
        print(f"{name} ...", file=sys.stderr, flush=True)
        results.append(measure(name, args))
    import nncf
    import openvino

    from trtopt.backend.cpu.isa import cpu_isa

    lines = [f"## CPU INT8 runtimes on an `{cpu_isa()}` CPU: trtopt on ONNX Runtime and OpenVINO, NNCF, ONNX Runtime's "
             "quantizer", "",
             *header_lines("tools/bench_cpu_runtimes.py", list(argv if argv is not None else sys.argv[1:])),
             f"- OpenVINO {openvino.__version__}, NNCF {nncf.__version__}; load average {before} before, "
             f"{load_average()} after", "", *rows(results), ""]  # fmt: skip
    lines += [f"- {r['name']}: {v}: {n}" for r in results for v, n in r["notes"].items() if n]
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
