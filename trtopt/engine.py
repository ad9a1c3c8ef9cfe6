"""The runtime API: load a plan once, call it many times, from many threads.

    engine = trtopt.Engine.load("plan.engine")
    logits = engine(engine.preprocess(["cat.jpg"]))

`Engine` validates inputs (names, shapes, dtypes) once, here, then hands them to the backend's runner,
which was created once with its session and buffers. Thread safety: one Engine may be shared by all
threads of a service. The CPU runner shares one ONNX Runtime session (whose `run` is thread-safe);
the TensorRT runner keeps one execution context, stream and buffer set per thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from trtopt.backend import Runner, RunOptions, check_runner_section, create_runner
from trtopt.config_checks import check_threads
from trtopt.errors import DataError, PlanError, ShapeError, TrtoptError, format_shape
from trtopt.execution.device_arrays import array_shape_and_dtype
from trtopt.frontend.model_errors import plan_errors
from trtopt.plan import Plan, TensorSpec, read_plan
from trtopt.plan.verification import Verification

log = logging.getLogger(__name__)


class Engine:
    """A deserialised plan ready to run."""

    def __init__(
        self, plan: Plan, *, threads: int | None = None, cuda_graph: bool = False, device: int = 0, spin: bool = True
    ) -> None:
        check_threads(threads)
        self.plan = plan
        self._closed = False
        self._one_per_call = False  # the plan's model runs one sample per call (`infer` finds out)
        check_runner_section(plan)
        self._specs = {t.name: t for t in plan.inputs}
        # each input's dtype as numpy's: a numpy array of exactly that dtype (native byte order) is checked by one
        # comparison, not by asking it what it is (`array_shape_and_dtype` probes for device arrays first)
        self._dtypes = {t.name: _numpy_dtype(t.dtype) for t in plan.inputs}
        try:
            self._runner: Runner = create_runner(
                plan, RunOptions(threads=threads, cuda_graph=cuda_graph, device=device, spin=spin)
            )
        except plan_errors() as exc:  # a plan whose model the runtime refuses (crafted or corrupt section)
            raise PlanError(
                f"The plan's {plan.backend} model cannot be loaded: {_first_line(exc)}",
                fix="Rebuild the plan with `trtopt build`; a plan edited by hand or by another tool is refused.",
            ) from None

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        threads: int | None = None,
        cuda_graph: bool = False,
        device: int = 0,
        spin: bool = True,
    ) -> Engine:
        """Read, verify and deserialise a plan file (see `trtopt.plan.format` for what is checked).

        A plan whose build found its INT8 math far from FP32 (`Verification.far_from_fp32`) says so again here,
        in one warning line with what to do: the build's own warning is long gone when a service loads it.

        `spin=False` (CPU plans) stops ONNX Runtime's intra-op threads from busy-waiting after each call. Its
        default (spinning) suits one engine alone on its cores; a process that runs several engines, or does
        CPU work between calls, is faster without it: with several 2-thread sessions alive in one process on a
        2-core machine, a session's spinning threads slowed the next session's call (BENCHMARKS.md, *CPU INT8
        runtimes*: its 2-thread rows measured the order of the calls until every session ran without spinning)."""
        engine = cls(read_plan(path), threads=threads, cuda_graph=cuda_graph, device=device, spin=spin)
        verification = engine.verification
        if verification is not None and verification.warning is not None:
            log.warning("%s: %s (recorded when it was built; rebuild the plan to fix it)", os.fspath(path),
                        verification.warning)  # fmt: skip
        return engine

    @property
    def backend(self) -> str:
        return self.plan.backend

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.plan.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.plan.outputs

    @property
    def labels(self) -> list[str] | None:
        return self.plan.labels

    @property
    def verification(self) -> Verification | None:
        """What the build measured on this plan: INT8 reference vs FP32 and kernels vs reference, the CPU
        class and the backend variant (see `trtopt.verify`); None for plans built before trtopt verified."""
        return self.plan.metadata.verification

    def __call__(self, inputs: Any) -> Any:
        """`engine(array)` for a single-input plan returns the single output (or a dict if several);
        `engine({name: array})` is `engine.infer(...)`.

        A plan whose input is one image without a batch axis, ``[3, H, W]`` (torchvision's detection exports),
        takes one image, ``engine(image)``, or a batch ``[N, 3, H, W]`` such as `preprocess` makes, which runs one
        call per image and returns a list of N results (each what one image gives: its outputs' lengths may
        differ, a detector's boxes). `infer` takes one image only."""
        if isinstance(inputs, Mapping):
            return self.infer(inputs)
        if len(self.inputs) != 1:
            names = [t.name for t in self.inputs]
            raise ShapeError(
                f"This plan takes {len(names)} inputs {names}; a single array is ambiguous.",
                fix="Pass a dict: engine({name: array, ...}).",
            )
        if self._one_image_per_call and len(array_shape_and_dtype(inputs)[0]) == 4:
            return [self(image) for image in inputs]  # one call per image: a [3, H, W] plan has no batch axis
        outputs = self.infer({self.inputs[0].name: inputs})
        return next(iter(outputs.values())) if len(outputs) == 1 else outputs

    def infer(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run once. Arrays may be numpy, or device arrays (`__cuda_array_interface__` / DLPack) for
        the TensorRT backend. Returns numpy arrays keyed by output name."""
        feeds = self._validate(feeds)
        if not self._one_per_call:
            try:
                with _runtime_errors_as_user_errors(lambda: self._first_sample_runs(feeds)):
                    return self._runner.infer(feeds)
            except OneSamplePerCallError:
                self._one_per_call = True  # found once: every later batch goes the same way
                log.warning("this plan's model runs one sample per call (its export wrote a batch of 1 into the "
                            "graph): running batches one sample at a time")  # fmt: skip
        return self._sample_by_sample(feeds)

    def _sample_by_sample(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """`feeds` run one sample per call, the outputs joined along their batch axis."""
        rows = _batch_rows(feeds)
        parts = []
        if len(rows) == 1:
            with _runtime_errors_as_user_errors():
                parts = [self._runner.infer({k: v[i : i + 1] for k, v in feeds.items()}) for i in range(rows.pop())]
        if not parts or any(np.ndim(v) == 0 or len(v) != 1 for part in parts for v in part.values()):
            raise OneSamplePerCallError("The plan runs one sample per call, and these inputs cannot be split into "
                                        "samples, or its outputs joined back into a batch.",
                                        fix="Call it with one sample at a time (engine(x[i:i + 1])).")  # fmt: skip
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def _first_sample_runs(self, feeds: Mapping[str, Any]) -> bool:
        """Whether `feeds` are a batch of several samples on the plan's dynamic batch axis whose first sample runs
        alone (asked only once the batch has failed)."""
        rows = _batch_rows(feeds)
        if len(rows) != 1 or rows.pop() < 2 or not all(t.shape and t.shape[0] == -1 for t in self.inputs):
            return False
        try:
            self._runner.infer({name: value[:1] for name, value in feeds.items()})
        except Exception:  # noqa: BLE001 - any failure: the batch is not the cause
            return False
        return True

    @property
    def _one_image_per_call(self) -> bool:
        """Whether the plan's single input is one image without a batch axis, ``[3, H, W]``."""
        if len(self.inputs) != 1 or len(self.inputs[0].shape) != 3:  # `trtopt.data` loads Pillow: not for others
            return False
        from trtopt.data.inputs import unbatched_image

        return unbatched_image(self.inputs[0].shape)

    @property
    def timing(self) -> str:
        """How the backend's runner times a call: "host" (it has no device clock: `timed_infer` returns None
        and callers time the call themselves) or the device clock it reads (e.g. "cuda-events")."""
        return getattr(self._runner, "timing", "host")

    def timed_infer(self, feeds: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], float | None]:
        """`infer` plus the device time in milliseconds where the backend measures it (`timing` is not
        "host": e.g. CUDA events around the GPU work); None where it does not."""
        feeds = self._validate(feeds)
        timed = getattr(self._runner, "timed_infer", None)
        with _runtime_errors_as_user_errors():
            if timed is None:
                return self._runner.infer(feeds), None
            outputs, device_ms = timed(feeds)
        return outputs, float(device_ms)

    def preprocess(self, images: Sequence[Any]) -> np.ndarray:
        """Apply the plan's stored preprocessing to images (paths, encoded file bytes, PIL images or HWC uint8
        arrays)."""
        from trtopt.data import PreprocessSpec, preprocess_images

        if isinstance(images, (str, bytes, os.PathLike)) or not isinstance(images, Sequence):
            raise DataError(
                f"Engine.preprocess takes a list of images, received {type(images).__name__}.",
                fix="Pass a list: engine.preprocess(['cat.jpg']) (paths, PIL images or HWC uint8 arrays).",
            )
        if not self.plan.preprocess:
            raise ShapeError(
                "This plan stores no preprocessing (it was built from tensors, not images).",
                fix="Preprocess the data yourself and call engine(array).",
            )
        return preprocess_images(images, PreprocessSpec.from_dict(self.plan.preprocess))

    def close(self) -> None:
        """Release the session and buffers; later calls raise a `TrtoptError`. Closing twice is harmless."""
        if not self._closed:
            self._closed = True
            self._runner.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _validate(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Check names, dtypes and shapes; returns the feeds with numpy arrays in native byte order."""
        if self._closed:
            raise TrtoptError("This Engine is closed.", fix="Load the plan again: trtopt.Engine.load(path).")
        if not isinstance(feeds, Mapping):
            raise ShapeError(
                f"Engine.infer takes a dict of input name -> array, received {type(feeds).__name__}.",
                fix=f"Pass {{{self.inputs[0].name!r}: array}}." if self.inputs else "Pass a dict.",
            )
        expected = self._specs
        if feeds.keys() != expected.keys():
            unknown = sorted(str(k) for k in set(feeds) - set(expected))
            raise ShapeError(
                f"Input names do not match the plan: missing {sorted(set(expected) - set(feeds))}, unknown {unknown}.",
                fix=f"The plan takes {sorted(expected)}.",
            )
        checked = dict(feeds)
        for name, spec in expected.items():
            value = feeds[name]
            known = self._dtypes[name]  # (None == dtype("float64") in numpy: hence the `is not None`)
            if known is not None and type(value) is np.ndarray and value.dtype == known:  # most calls: no probing
                shape, dtype = value.shape, spec.dtype
            else:
                shape, dtype = array_shape_and_dtype(value)  # DataError if the producer refuses (torch: grad)
            if dtype != spec.dtype:
                raise ShapeError(
                    f"Input {name!r} has dtype {dtype}; the plan expects {spec.dtype}.",
                    fix=f"Convert it first, e.g. array.astype(np.{spec.dtype}).",
                )
            if len(shape) != len(spec.shape) or any(e not in (-1, s) for e, s in zip(spec.shape, shape, strict=True)):
                one_image = self._one_image_per_call and len(shape) == 4  # a batch for a [3, H, W] plan
                raise ShapeError(
                    f"Input {name!r} has shape {list(shape)}; the plan expects {format_shape(spec.shape)} "
                    f"(-1 = any size){': one image per call, no batch axis' if one_image else ''}.",
                    fix="Call engine(images) for a list of results, one per image, or pass one image at a time "
                    "(images[i])." if one_image else
                    "Resize or batch the data to match; `trtopt inspect` on the source model shows its shapes.",
                )  # fmt: skip
            if 0 in shape:
                raise ShapeError(
                    f"Input {name!r} is empty (shape {list(shape)}): there is nothing to run.",
                    fix="Pass at least one sample.",
                )
            checked[name] = _checked_array(name, value)
        return checked


def _checked_array(name: str, value: Any) -> Any:
    """Numpy arrays in another byte order (`>f4`) are converted: the runtimes read the raw buffer, which
    would give a silently wrong answer. Non-finite floats are computed, with a warning."""
    if not isinstance(value, np.ndarray):
        return value
    if not value.dtype.isnative:
        value = value.astype(value.dtype.newbyteorder("="))
    # the least and greatest values: NaN carries through both, an infinity shows in one; unlike np.isfinite(value)
    # they write no array as large as the input on every call (which cost 1-2% of a MobileNetV2's call at batch 1),
    # and they read it faster than a sum (236 vs 414 us on a 4.8 MB batch, avx2, timeit; tools/bench_engine.py
    # measures what all of Engine's checks cost per call)
    if value.dtype.kind == "f" and not _finite_extremes(value):
        bad = int(value.size - np.count_nonzero(np.isfinite(value)))
        log.warning("input %r holds %d NaN or infinite values: the outputs for those samples are meaningless",
                    name, bad)  # fmt: skip
    return value


@contextmanager
def _runtime_errors_as_user_errors(one_sample: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """What the runtime raises for an input it cannot run (ONNX Runtime's own types) as a `TrtoptError`; where
    `one_sample()` says the batch's first sample runs alone, `OneSamplePerCallError`, which `Engine.infer` takes
    as its cue to run the batch one sample at a time."""
    try:
        yield
    except plan_errors() as exc:
        if one_sample():  # a batch of 1 written into the model (khmersm, round 8)
            raise OneSamplePerCallError(f"The runtime runs these inputs one sample at a time only: {_first_line(exc)}",
                                        fix="Call the plan with one sample at a time.") from None  # fmt: skip
        raise TrtoptError(
            f"The runtime could not run these inputs: {_first_line(exc)}",
            fix="Check the inputs' shapes, dtypes and values against `engine.inputs`.",
        ) from None


class OneSamplePerCallError(TrtoptError):
    """The plan fails on a batch whose first sample runs alone: its model takes one sample per call."""


def _finite_extremes(value: np.ndarray) -> bool:
    if value.dtype == np.float16:
        # numpy reduces float16 without SIMD (min and max: 20 ms on a batch of 8 224x224 images, avx2), so read the
        # bits: a float16 is NaN or infinite exactly when its exponent bits are all ones, |bits| >= 0x7C00 (0.4 ms)
        return bool(np.bitwise_and(value.view(np.uint16), 0x7FFF).max() < 0x7C00)
    if value.dtype in (np.float32, np.float64) and value.flags.c_contiguous:
        # one pass instead of two: a NaN or an infinity makes the sum of squares NaN or infinite (BLAS dot: 11 us
        # against min and max's 17 on a [1, 3, 224, 224] image, 75 against 117 on 8, AVX-512 VNNI, 300 calls; right
        # after an inference, when the input is no longer in cache, the second pass cost most). A finite sum settles
        # it; one that overflows (values beyond ~1e19) is asked again below.
        flat = value.reshape(-1)
        if np.isfinite(np.vdot(flat, flat)):
            return True
    return bool(np.isfinite(value.min()) and np.isfinite(value.max()))


def _numpy_dtype(name: str) -> np.dtype[Any] | None:
    """numpy's dtype of that name, or None for one numpy does not know (such inputs take the probing path)."""
    try:
        return np.dtype(name)
    except TypeError:
        return None


def _batch_rows(feeds: Mapping[str, Any]) -> set[int]:
    """The leading sizes of `feeds`' arrays (one value: a batch they share)."""
    return {int(np.shape(v)[0]) for v in feeds.values() if np.ndim(v)}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
