#!/usr/bin/env python3
"""Benchmark trtopt's calibrator against ONNX Runtime's and against plain FP32 inference, same inputs.

    python tools/bench_calibration.py [--model models/efficientnet_lite0.onnx | light:resnet50]
        [--images DIR | --photos 2880x1920 | --synthetic] [--counts 128 512] [--batch 8] [--methods ...]
        [--repeat 3] [--out docs/benchmarks/calibration.md]

Methods (each run in a fresh subprocess, so peak memory is its own):
  trtopt-entropy, trtopt-max       trtopt.calib.calibrate (one streaming pass, 2048-bin KL search); image
                                   files are decoded ahead by the data set's worker pool, JPEGs at reduced size
  trtopt-entropy-full-decode       the same with every JPEG decoded at full size (no draft), for comparison
  trtopt-calibrate                 what `trtopt calibrate MODEL --calib IMAGES` does (images only): load and
                                   optimise the model, then calibrate the tensors a build quantises (fewer
                                   than ORT's selection: no tensor is counted twice across a fused layer)
  ort-entropy, ort-minmax          onnxruntime.quantization.calibrate.create_calibrator defaults
  ort-entropy-2048                 ORT entropy with TensorRT's sizes (num_bins=2048), its Python-loop search
  fp32                             bare FP32 inference of the same inputs at the same batch: the inputs are
                                   decoded and preprocessed into memory first, untimed; only ORT runs are timed
  fp32-images                      FP32 inference reading the files as `trtopt run` does (decoding included)
Every calibrator calibrates the tensors ONNX Runtime selects by default (float inputs/outputs of every node).
Wall time covers calibrator setup, inference, counting and threshold search, and for image files their
decoding; the file list and preprocessing spec are made before the clock starts. CPU seconds are the
worker's user + system time over the same span. Peak memory is the worker's ru_maxrss. A worker whose RSS
passes --mem-limit-gb is killed and reported as such. With --repeat N the methods run round-robin N times
and the median is reported. --photos makes camera-sized JPEGs from calib_data/ in a temporary folder
(tools/realistic_photos.py); synthetic inputs are random-normal, regenerated per batch from a fixed seed.
--model takes an ONNX file or light:NAME (a real topology with random weights, trtopt.zoo.light).
Writes markdown tables (timing/memory, thresholds relative to ORT entropy) to stdout and --out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_calibration_report import Run, median_run, report  # noqa: E402
from realistic_photos import make_photos  # noqa: E402

METHODS = ("trtopt-entropy", "trtopt-max", "trtopt-entropy-full-decode", "trtopt-calibrate", "ort-entropy",
           "ort-minmax", "ort-entropy-2048", "fp32", "fp32-images")
DEFAULT_METHODS = ("trtopt-entropy", "trtopt-max", "ort-entropy", "ort-minmax")
Feeds = dict[str, np.ndarray]


# --- worker: one method, one count, in its own process ----------------------------------------------


def batch_source(args: argparse.Namespace) -> Callable[[], Iterator[Feeds]]:
    """A function returning a fresh iterator over the same `args.count` inputs, `args.batch` at a time."""
    if args.images:
        from trtopt.data import load_dataset
        from trtopt.frontend import graph_from_onnx

        dataset = load_dataset(args.images, model_inputs(graph_from_onnx(args.model)), model_spec(args.model),
                               count=args.count)  # fmt: skip
        return lambda: (batch.feeds for batch in dataset.batches(args.batch))
    name, shape = input_shape(args.model)

    def synthetic() -> Iterator[Feeds]:
        for index, start in enumerate(range(0, args.count, args.batch)):
            n = min(args.batch, args.count - start)
            rng = np.random.default_rng(1000 + index)
            yield {name: rng.standard_normal((n, *shape), dtype=np.float32)}

    return synthetic


def model_inputs(graph: object) -> list:
    """The model's inputs with a dynamic batch, so every method can run any batch size on it."""
    from trtopt.data import InputInfo, input_infos_from_graph

    return [InputInfo(i.name, (None, *i.shape[1:]), i.dtype) for i in input_infos_from_graph(graph)]


def model_spec(model_path: str) -> object:
    """The preprocessing `trtopt build` applies to this model (its sidecar preset, or the input's default)."""
    from trtopt.data import PreprocessConfig
    from trtopt.data.samples import preprocess_spec_for
    from trtopt.passes.config import GraphConfig, load_graph

    graph = load_graph(Path(model_path), GraphConfig(), int8=False, batch=8)
    return preprocess_spec_for(Path(model_path), graph, PreprocessConfig())


def input_shape(model_path: str) -> tuple[str, list[int]]:
    model = onnx.load(model_path, load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    first = next(i for i in model.graph.input if i.name not in initializers)
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in first.type.tensor_type.shape.dim][1:]
    if any(d <= 0 for d in dims):
        raise SystemExit(f"input {first.name!r} has dynamic non-batch dims {dims}; use --images")
    return first.name, dims


def ort_tensors(model_path: str) -> list[str]:
    """The tensors ONNX Runtime's calibrators pick by default (CalibraterBase.select_tensors_to_calibrate)."""
    from onnxruntime.quantization.calibrate import CalibraterBase
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    model = load_model_with_shape_infer(Path(model_path))
    defaults = types.SimpleNamespace(op_types_to_calibrate=None)
    selected, _ = CalibraterBase.select_tensors_to_calibrate(defaults, model)
    return sorted(selected)


def run_trtopt(args: argparse.Namespace, tensors: list[str], source: Callable[[], Iterator[Feeds]]) -> dict:
    from trtopt.calib import CalibConfig, calibrate

    method = args.worker.removeprefix("trtopt-").removesuffix("-full-decode")
    result = calibrate(args.model, source, tensors, CalibConfig(method=method))
    return dict(result.amax)


def run_trtopt_calibrate(args: argparse.Namespace) -> dict:
    """`trtopt calibrate`'s work: load, optimise, calibrate the tensors a build quantises (the clock runs
    from the model load on)."""
    from trtopt.backend import quantizable_tensors
    from trtopt.calib import CalibConfig
    from trtopt.calib.stage import calibrate_graph
    from trtopt.data import DataConfig, PreprocessConfig
    from trtopt.data.samples import load_samples, preprocess_spec_for
    from trtopt.frontend import onnx_from_graph
    from trtopt.passes import optimize
    from trtopt.passes.config import GraphConfig, load_graph

    data = DataConfig(sources=(args.images,), count=args.count, batch=args.batch)
    graph = optimize(load_graph(Path(args.model), GraphConfig(), int8=True, batch=data.batch)).graph
    dataset = load_samples(graph, preprocess_spec_for(Path(args.model), graph, PreprocessConfig()), data)
    calibration = calibrate_graph(graph, onnx_from_graph(graph), quantizable_tensors(graph), CalibConfig(),
                                  dataset=dataset, data=data)  # fmt: skip
    return dict(calibration.amax)


def run_ort(args: argparse.Namespace, tensors: list[str], source: Callable[[], Iterator[Feeds]]) -> dict:
    from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = source()

        def get_next(self) -> Feeds | None:
            return next(self.batches, None)

    method = CalibrationMethod.MinMax if args.worker == "ort-minmax" else CalibrationMethod.Entropy
    options = {"num_bins": 2048, "num_quantized_bins": 128} if args.worker == "ort-entropy-2048" else {}
    with tempfile.TemporaryDirectory(prefix="bench-calib-") as tmp:
        calibrator = create_calibrator(
            args.model, augmented_model_path=os.path.join(tmp, "augmented.onnx"), calibrate_method=method,
            extra_options=options,
        )
        calibrator.collect_data(Reader())
        ranges = calibrator.compute_data()
    return {name: float(np.max(np.abs(np.asarray(ranges[name].range_value, dtype=np.float64))))
            for name in ranges}


def run_fp32(args: argparse.Namespace, source: Callable[[], Iterator[Feeds]]) -> None:
    """FP32 inference of every batch (outputs dropped), as a user runs the model."""
    from trtopt.execution import OrtSession

    session = OrtSession(onnx.load(args.model))
    for feeds in source():
        session.run(feeds)


def full_decode() -> None:
    """Make data sets decode every JPEG at full size (what trtopt did before draft decoding)."""
    import trtopt.data.dataset as dataset_module
    from trtopt.data import preprocess_image, read_image

    dataset_module.preprocess_file = lambda path, spec: preprocess_image(read_image(path), spec)  # type: ignore


def worker(args: argparse.Namespace) -> None:
    tensors = json.loads(Path(args.tensors_file).read_text())
    baseline_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.worker.endswith("-full-decode"):
        full_decode()
    source = batch_source(args)
    if args.worker == "fp32":  # bare inference: the inputs in memory first, untimed
        held = list(source())
        source = lambda: iter(held)  # noqa: E731
    cpu, start = cpu_seconds(), time.perf_counter()
    amax: dict = {}
    if args.worker.startswith("fp32"):
        run_fp32(args, source)
    elif args.worker == "trtopt-calibrate":
        amax = run_trtopt_calibrate(args)
    elif args.worker.startswith("trtopt"):
        amax = run_trtopt(args, tensors, source)
    else:
        amax = run_ort(args, tensors, source)
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"wall_s": wall, "cpu_s": cpu, "peak_mb": peak_mb, "baseline_mb": baseline_mb, "amax": amax}
    Path(args.result).write_text(json.dumps(result))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- driver -------------------------------------------------------------------------------------------


def run_worker(args: argparse.Namespace, method: str, count: int, tensors_file: str, limit_mb: float) -> dict:
    """Run one method in a fresh process, watching its RSS; kill it above `limit_mb`."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    command = [sys.executable, __file__, "--worker", method, "--count", str(count),
               "--batch", str(args.batch), "--model", args.model, "--tensors-file", tensors_file,
               "--result", result_path]
    if args.images:
        command += ["--images", args.images]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak_seen, killed = 0.0, False
    while child.poll() is None:
        peak_seen = max(peak_seen, rss_mb(child.pid))
        if peak_seen > limit_mb:
            child.kill()
            killed = True
            break
        if time.perf_counter() - started > args.timeout:
            child.kill()
            break
        time.sleep(0.1)
    child.wait()
    stderr = child.stderr.read() if child.stderr else ""
    try:
        if killed or child.returncode != 0:
            return {"failed": "killed above the memory limit" if killed else f"exit {child.returncode}",
                    "peak_mb": peak_seen, "wall_s": time.perf_counter() - started,
                    "stderr": stderr.strip().splitlines()[-1:] if stderr else []}
        return json.loads(Path(result_path).read_text())
    finally:
        os.unlink(result_path)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def jit_compile_seconds() -> float:
    """Seconds the first calibration on a machine spends compiling the counting loop (empty numba cache)."""
    code = ("import time, numpy as np; from trtopt.calib import kernels; t = time.perf_counter(); "
            "kernels.count_abs(kernels.as_rows(np.ones(8, np.float32)), np.zeros(64, np.int64), kernels.new_state(), "
            "np.zeros(1)); "
            "print(time.perf_counter() - t)")
    with tempfile.TemporaryDirectory(prefix="bench-numba-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def resolve_model_path(model: str, workdir: Path) -> Path:
    """An ONNX path, or light:NAME written with a dynamic batch into `workdir`."""
    if not model.startswith("light:"):
        return Path(model)
    from trtopt.zoo.light import light_model

    path = workdir / f"{model.removeprefix('light:')}.onnx"
    onnx.save_model(light_model(model.removeprefix("light:"), dynamic_batch=True), path)
    return path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "efficientnet_lite0.onnx"))
    parser.add_argument("--images", help="folder of calibration images (default: synthetic random-normal)")
    parser.add_argument("--synthetic", action="store_true", help="random-normal inputs (the default)")
    parser.add_argument("--photos", metavar="WxH", help="camera-sized JPEGs made from calib_data/ (e.g. 2880x1920)")
    parser.add_argument("--counts", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(DEFAULT_METHODS))
    parser.add_argument("--mem-limit-gb", type=float, help="kill a worker above this RSS (default 70%% free)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per worker")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row, round-robin; the median is reported")
    parser.add_argument("--out", help="also write the report here (markdown)")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tensors-file", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if sum(map(bool, (args.images, args.synthetic, args.photos))) > 1:
        parser.error("--images, --photos and --synthetic exclude each other")
    return args


def run_methods(args: argparse.Namespace, tensors_file: str, limit_mb: float) -> dict[tuple[str, int], dict]:
    """Every method on every count, `args.repeat` times round-robin; the median run of each."""
    results: dict[tuple[str, int], dict] = {}
    for count in args.counts:
        runs: dict[str, list[dict]] = {method: [] for method in args.methods}
        for _ in range(args.repeat):  # round-robin, so load drifting on the machine hits every method alike
            for method in args.methods:
                if runs[method] and "failed" in runs[method][-1]:
                    continue  # killed once (memory): it will be killed again
                print(f"running {method} on {count} inputs ...", file=sys.stderr, flush=True)
                r = run_worker(args, method, count, tensors_file, limit_mb)
                runs[method].append(r)
                detail = f"{r['wall_s']:.1f} s, {r['peak_mb']:.0f} MB {r.get('stderr', '')}"
                print(f"  {r.get('failed', 'ok')} {detail}", file=sys.stderr)
        for method, done in runs.items():
            results[(method, count)] = median_run(done)
    return results


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    compile_s = jit_compile_seconds()  # first: a broken kernel fails here, not after the long runs
    limit_mb = args.mem_limit_gb * 1024 if args.mem_limit_gb else 0.7 * available_mb()
    workdir = tempfile.TemporaryDirectory(prefix="bench-calib-")
    shown_model = args.model if args.model.startswith("light:") else Path(args.model).name
    args.model = str(resolve_model_path(args.model, Path(workdir.name)))
    if args.photos:
        width, height = (int(v) for v in args.photos.lower().split("x"))
        print(f"making {max(args.counts)} photos of {args.photos} ...", file=sys.stderr, flush=True)
        make_photos(Path(workdir.name) / "photos", max(args.counts), (width, height))
        args.images = str(Path(workdir.name) / "photos")
    tensors = ort_tensors(args.model)
    tensors_file = str(Path(workdir.name) / "tensors.json")
    Path(tensors_file).write_text(json.dumps(tensors))
    load_before = os.getloadavg()[0]
    try:
        results = run_methods(args, tensors_file, limit_mb)
    finally:
        workdir.cleanup()
    run = Run(shown_model, len(tensors), limit_mb, load_before, compile_s)
    text = "\n".join(report(args, run, results)) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
