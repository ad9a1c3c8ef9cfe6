"""What the image benchmarks share besides tools/benchlib.py's header, timing and output: the model under test,
its image data preprocessed exactly as `trtopt build` does, and ONNX Runtime's own static quantizer.

Not a benchmark itself; imported by tools/bench_accuracy.py, tools/bench_latency.py and others.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODEL = ROOT / "models" / "efficientnet_lite0.onnx"
CALIB_DIR = ROOT / "calib_data"
HELDOUT_DIR = ROOT / "tests" / "data" / "heldout"
HELDOUT_MORE_DIR = ROOT / "tests" / "data" / "heldout_more"
T = TypeVar("T")


def rows_per_model(
    names: Sequence[str],
    locate: Callable[[str], tuple[str, list[str]] | None],
    measure: Callable[[str, list[str], Path], list[str]],
    *,
    columns: int,
    fetch_hint: str,
) -> list[str]:
    """One markdown row per model: `measure(path, build_flags, tmp)`'s cells after the name, each model in its own
    temporary folder; a model `locate` cannot find gets a "not cached" row saying how to fetch it (`columns`: the
    cells after the name)."""
    rows = []
    for name in names:
        found = locate(name)
        if found is None:
            rows.append(f"| {name} | not cached ({fetch_hint}) |" + " |" * (columns - 1))
            continue
        with tempfile.TemporaryDirectory() as tmp:
            rows.append("| " + " | ".join([name, *measure(found[0], found[1], Path(tmp))]) + " |")
    return rows


# --- the model and its data --------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelUnderTest:
    """An ONNX file on disk (a zoo model is written to a temporary folder) and how to feed it images."""

    path: Path
    name: str
    input_name: str
    static_batch: int | None  # the input's batch dimension when the model fixes it
    sample_shape: tuple[int, ...]  # one sample, without the batch dimension
    num_classes: int
    spec: Any  # trtopt.data.PreprocessSpec, the one `trtopt build` applies to this model


def resolve_model(model: str, workdir: Path) -> ModelUnderTest:
    """`model` is an ONNX path, a trtopt.zoo name (built with batch 1 into `workdir`) or light:NAME, a real
    topology from the onnx package with random weights and a dynamic batch (trtopt.zoo.light; timing only)."""
    from trtopt.data import PreprocessConfig
    from trtopt.data.samples import preprocess_spec_for
    from trtopt.passes.config import GraphConfig, load_graph
    from trtopt.zoo import NAMES, build_model
    from trtopt.zoo.light import LIGHT_NAMES, light_model

    path = Path(model)
    light = model.removeprefix("light:")
    if not path.exists():
        if model.startswith("light:") and light in LIGHT_NAMES:
            path = workdir / f"light_{light}.onnx"
            onnx.save_model(light_model(light, dynamic_batch=True), path)
        elif model in NAMES:
            path = workdir / f"{model}.onnx"
            onnx.save_model(build_model(model, batch=1, seed=0, opset=13), path)
        else:
            raise SystemExit(
                f"--model {model!r}: no such file, not a zoo model ({', '.join(NAMES)}) and not "
                f"light:NAME ({', '.join(LIGHT_NAMES)})"
            )
    graph = load_graph(path, GraphConfig(), int8=False, batch=8)
    tensor = graph.inputs[0]
    batch = tensor.shape[0] if isinstance(tensor.shape[0], int) and tensor.shape[0] > 0 else None
    return ModelUnderTest(
        path=path,
        name=path.stem,
        input_name=tensor.name,
        static_batch=batch,
        sample_shape=tuple(int(d) for d in tensor.shape[1:]),
        num_classes=int(graph.outputs[0].shape[-1]),
        spec=preprocess_spec_for(path, graph, PreprocessConfig()),
    )


def image_dataset(model: ModelUnderTest, source: str | Path, count: int | None = None) -> Any:
    """The images in `source`, read and preprocessed as `trtopt build` does for this model."""
    from trtopt.data import InputInfo, load_dataset

    info = InputInfo(model.input_name, (model.static_batch or -1, *model.sample_shape), "float32")
    return load_dataset(str(source), [info], model.spec, count=count)


def stacked(dataset: Any, batch: int = 8) -> tuple[np.ndarray, list[str]]:
    """All samples of `dataset` as one [n, ...] array, with the file each row came from."""
    arrays, sources = [], []
    for b in dataset.batches(batch):
        arrays.extend(next(iter(b.feeds.values())))
        sources.extend(b.sources)
    return np.stack(arrays), sources


# --- ONNX Runtime's own quantizer --------------------------------------------------------------------

ORT_METHODS = {"entropy": "Entropy", "minmax": "MinMax"}


class DatasetReader:
    """`onnxruntime.quantization.CalibrationDataReader` over a trtopt data set, `batch` images per call.

    ORT's histogram calibrators stack all collected outputs with `np.asarray`, which fails (ValueError:
    inhomogeneous shape) when the last batch is smaller than the others, so `batch` must divide the
    image count (`even_batch`). Images are read lazily, so the quantizer's wall time includes decoding
    and preprocessing, as trtopt's build time does.
    """

    def __init__(self, dataset: Any, batch: int) -> None:
        self.dataset = dataset
        self.batch = batch
        self._iter: Iterator[dict[str, np.ndarray]] = iter(())
        self.rewind()

    def rewind(self) -> None:
        self._iter = (b.feeds for b in self.dataset.batches(self.batch))

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iter, None)

    def __len__(self) -> int:
        return len(self.dataset)


def pre_process(source: Path, out: Path, **options: Any) -> None:
    """ONNX Runtime's `quant_pre_process` from `source` to `out`, run inside `out`'s folder: its symbolic shape
    inference writes `sym_shape_infer_temp.onnx` and an external-data file into the working directory when it
    gives up (onnxruntime/tools/symbolic_shape_infer.py), which otherwise litter the repository root."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source, out = Path(source).resolve(), Path(out).resolve()
    here = os.getcwd()
    os.chdir(out.parent)  # contextlib.chdir is Python 3.11+
    try:
        quant_pre_process(str(source), str(out), **options)
    finally:
        os.chdir(here)


def even_batch(count: int, limit: int = 8) -> int:
    """The largest batch size <= `limit` that divides `count` (no ragged last batch)."""
    return max(b for b in range(1, limit + 1) if count % b == 0)


def ort_quantize(
    model: ModelUnderTest, dataset: Any, method: str, out_path: Path, preprocess: bool, reduce_range: bool = False
) -> float:
    """quantize_static: QDQ, per-channel QInt8 weights, QUInt8 activations; returns wall seconds.
    `reduce_range`: 7-bit weights, ONNX Runtime's remedy for CPUs whose u8s8 kernels saturate.

    `preprocess`: first run `quant_pre_process` (shape inference and ORT's graph optimisations, which fold
    the Pads into the Convs), the step ORT's quantization guide and quantize_static's own warning recommend.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    start = time.perf_counter()
    source = model.path
    if preprocess:
        source = out_path.with_name(out_path.stem + "_preprocessed.onnx")
        pre_process(model.path, source)
    quantize_static(  # its augmented calibration model goes to a TemporaryDirectory of its own
        str(source),
        str(out_path),
        DatasetReader(dataset, even_batch(len(dataset)) if model.static_batch is None else model.static_batch),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, ORT_METHODS[method]),
        reduce_range=reduce_range,
    )
    return time.perf_counter() - start


def trtopt_build(
    model: ModelUnderTest, calib: str | Sequence[str], count: int | None, method: str, encoding: str = "auto"
) -> tuple[float, bytes]:
    """trtopt's whole CPU INT8 build (load, optimise, calibrate, quantise, lower, verify) on a folder or a
    list of image files: (wall seconds, the plan's ONNX bytes as stored). The INT8 plan even where it runs slower
    than FP32 here (`--cpu-fallback off`): the benchmarks time and score INT8."""
    from trtopt.backend.cpu.options import CpuOptions
    from trtopt.build import BuildConfig, build_plan
    from trtopt.calib import CalibConfig
    from trtopt.data import DataConfig

    sources = (str(calib),) if isinstance(calib, (str, Path)) else tuple(calib)
    config = BuildConfig(backend="cpu", data=DataConfig(sources=sources, count=count), calib=CalibConfig(method=method),
                         backend_options=(CpuOptions(encoding=encoding, fallback="off"),))  # fmt: skip
    start = time.perf_counter()
    result = build_plan(model.path, config)
    return time.perf_counter() - start, result.plan.sections["onnx"]


def ort_build(
    model: ModelUnderTest, calib: str, count: int | None, method: str, preprocess: bool = True,
    reduce_range: bool = False,
) -> tuple[float, bytes]:
    """ORT's (quant_pre_process +) quantize_static on the same images: (wall seconds, QDQ ONNX bytes)."""
    with tempfile.TemporaryDirectory(prefix="bench-ortq-") as tmp:
        out = Path(tmp, "quantized.onnx")
        seconds = ort_quantize(model, image_dataset(model, calib, count), method, out, preprocess, reduce_range)
        return seconds, out.read_bytes()


def run_isolated(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    """`fn(*args)` in a fresh (spawned) process: (its result, the process's peak RSS in GiB).

    A fresh process per build makes each peak memory its own, not the high-water mark of the ones before.
    """
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_with_peak_rss, fn, *args).result()


def _with_peak_rss(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    result = fn(*args)
    return result, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


@dataclass(frozen=True)
class Kernels:
    """What ONNX Runtime made of a quantised model (trtopt.backend.cpu.builder.kernel_report)."""

    int8_convs: int
    float_convs: int
    conversions: int  # QuantizeLinear / DequantizeLinear left to run: float <-> int8 round trips
    float_pads: int
    int8_matmuls: int = 0  # QLinearMatMul, QGemm, MatMulInteger: a transformer's INT8 layers


def kernel_counts(model_bytes: bytes) -> Kernels:
    from trtopt.backend.cpu.builder import kernel_report

    report = kernel_report(model_bytes)
    ops = report.ops
    conversions = ops.get("QuantizeLinear", 0) + ops.get("DequantizeLinear", 0)
    return Kernels(report.int8_convs, report.float_convs, conversions, ops.get("Pad", 0), report.int8_matmuls)
