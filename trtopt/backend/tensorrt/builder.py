"""ONNX (explicit Q/DQ, strongly typed) -> serialised TensorRT engine.

The flow is the one in NVIDIA's TensorRT 11 Python API reference and migration guide
("Migrating Python Code from TensorRT 10.x to 11.x", docs.nvidia.com/deeplearning/tensorrt/11.x/api/
migration/tensorrt-10x-to-11x-python-api.html)::

    builder = trt.Builder(logger); network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger); parser.parse(model_bytes)
    config = builder.create_builder_config(); ...; builder.build_serialized_network(network, config)

Facts it rests on (verified in the docs, not remembered):

- TensorRT 11 networks are always strongly typed; ``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` is
  "deprecated in TensorRT 11.0 ... retained for API compatibility but ignored" (11.0 Python API,
  Builder page). On 10.x strong typing is opt-in through that flag (``1 << int(flag)``), so we pass it
  there and pass 0 on 11. Precision is whatever the ONNX says: INT8 through Q/DQ, FP16 through FP16
  tensors (`trtopt.precision.convert_to_fp16`), never through builder flags.
- ``BuilderFlag.FP16/INT8/BF16``, ``int8_calibrator`` and ``OBEY_PRECISION_CONSTRAINTS`` are removed in 11
  ("Removed Python APIs and Replacements"); none is used here. ``BuilderFlag.SPARSE_WEIGHTS`` remains.
- ``IBuilderConfig``: ``set_memory_pool_limit(MemoryPoolType.WORKSPACE, bytes)``,
  ``builder_optimization_level`` (0-5, default 3), ``create_timing_cache(bytes)`` /
  ``set_timing_cache(cache, ignore_mismatch)`` / ``get_timing_cache().serialize()``,
  ``add_optimization_profile`` with ``IOptimizationProfile.set_shape(name, min, opt, max)``.
- ``OnnxParser``: ``num_errors``, ``get_error(i)`` -> ``ParserError`` with ``code()`` (an ``ErrorCode``
  enum member, not a string), ``desc()``, ``node()``, ``node_name()``, ``node_operator()``.
- Failures come back as values, not exceptions: ``set_timing_cache`` returns ``False``,
  ``add_optimization_profile`` returns -1, ``build_serialized_network`` returns ``None``; the ``max_threads``
  setter's ``bool`` is lost in a Python assignment, so the value is read back.

Every call below is checked against the real TensorRT 11 and 10 Python bindings (their pybind11 layer,
with stub native libraries) on each CI run: tests/test_tensorrt_real_bindings.py.

Everything that needs no TensorRT (profiles from --shapes/--batch, option validation, the network flags,
parser-error formatting) is a pure function below, tested on CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import onnx

from trtopt.backend.base import Profile, Shape
from trtopt.config_checks import check_int, check_threads
from trtopt.errors import ModelError, ShapeError, TrtoptError, format_dims
from trtopt.errors import format_shape as _fmt
from trtopt.frontend.shapes import DYNAMIC
from trtopt.frontend.weightless import serialized_size
from trtopt.frontend.writer import PROTOBUF_LIMIT, write_atomic

log = logging.getLogger(__name__)

OPTIMIZATION_LEVELS = range(0, 6)  # IBuilderConfig.builder_optimization_level: 0..5, default 3
MAX_WORKSPACE_MIB = 2**30  # 1 PiB: anything larger is a typo
STRONGLY_TYPED_IGNORED_FROM = 11  # the creation flag is a no-op from this major version on
# TensorRT logs, at the end of a build with SPARSE_WEIGHTS, "(Sparsity) Layers eligible for sparse math: ..." and
# "(Sparsity) TRT inference plan picked sparse implementation for layers: ..." (developer guide, "Structured
# Sparsity"): the only record of which layers run sparse, so they are logged at INFO rather than DEBUG.
SPARSITY_LOG_PREFIX = "(Sparsity)"


@dataclass(frozen=True)
class EngineOptions:
    """What one engine build is told (`TensorRTBackend.options` resolves it from the build config and the
    graph). None means TensorRT's default."""

    profiles: Mapping[str, Profile] | None = None
    workspace_mib: int | None = None
    timing_cache: Path | None = None
    optimization_level: int | None = None
    sparsity: bool = False
    fp16: bool = False
    threads: int | None = None


# --- pure helpers (no TensorRT) -------------------------------------------------------------------


def profiles_for(
    inputs: Sequence[Any], shapes: Mapping[str, Shape] | None, batch: int | None
) -> dict[str, Profile]:
    """One optimisation profile per input with a dynamic dimension.

    `inputs` are objects with ``.name`` and ``.shape`` (a dimension that is not a positive int is
    dynamic: -1, None or a symbolic name). `shapes` are concrete shapes from ``--shapes``; `batch` is
    ``--batch``. A dynamic *batch* (leading) dimension gets min 1 / opt B / max B, where B is `batch`,
    else the leading size given in `shapes`, else 1 - so the engine serves every batch up to B and is
    tuned for B. Other dynamic dimensions must be given in `shapes` and are fixed (min = opt = max).
    """
    shapes = dict(shapes or {})
    if batch is not None and batch < 1:
        raise ShapeError(f"--batch must be at least 1, got {batch}.", fix="Pass e.g. --batch 32.")
    profiles: dict[str, Profile] = {}
    for tensor in inputs:
        dims = list(tensor.shape or [])
        dynamic = [i for i, d in enumerate(dims) if not _is_static(d)]
        given = shapes.get(tensor.name)
        if given is not None:
            _check_given(tensor.name, dims, given)
        if not dynamic:
            continue
        missing = [i for i in dynamic if i > 0 and given is None]
        if missing:
            example = format_dims(dims, unknown="N")
            raise ShapeError(
                f"Input {tensor.name!r} has dynamic dimension(s) {missing} besides the batch "
                f"(shape {_fmt(dims)}); "
                f"TensorRT needs their sizes to build.",
                fix=f"Pass them with --shapes {tensor.name}:{example} (your real sizes).",
            )
        fixed = (
            [int(d) if _is_static(d) else int(given[i]) for i, d in enumerate(dims)] if given else list(dims)
        )
        if 0 in dynamic:
            top = batch if batch is not None else (int(given[0]) if given is not None and given[0] > 0 else 1)
            lo, hi = list(fixed), list(fixed)
            lo[0], hi[0] = 1, top
            profiles[tensor.name] = Profile(min=tuple(lo), opt=tuple(hi), max=tuple(hi))
        else:
            profiles[tensor.name] = Profile(min=tuple(fixed), opt=tuple(fixed), max=tuple(fixed))
    _check_batch_applies(inputs, batch)
    return profiles


def _check_batch_applies(inputs: Sequence[Any], batch: int | None) -> None:
    """--batch needs at least one input whose leading dimension is dynamic (or already equals it)."""
    if batch is None or any(t.shape and not _is_static(t.shape[0]) for t in inputs):
        return
    fixed = [t for t in inputs if t.shape and t.shape[0] != batch]
    if fixed:
        raise ShapeError(
            f"--batch {batch} asks for a dynamic batch, but the model fixes it: "
            + ", ".join(f"{t.name!r} {_fmt(list(t.shape))}" for t in fixed)
            + ".",
            fix="Re-export the model with a dynamic batch axis (torch.onnx.export(..., dynamic_axes=...)), "
            "or drop --batch.",
        )


def validate_options(options: EngineOptions) -> None:
    """Reject option values TensorRT would reject later, with a message that says how to fix them (the one
    home of these ranges: `TensorRTOptions` checks the user's settings here too)."""
    check_int(options.workspace_mib, "--workspace", 1, MAX_WORKSPACE_MIB, example="4096")
    low, high = OPTIMIZATION_LEVELS.start, OPTIMIZATION_LEVELS.stop - 1
    check_int(options.optimization_level, "--opt-level", low, high, example="3 (TensorRT's default)")
    check_threads(options.threads)
    if options.timing_cache is not None and Path(options.timing_cache).is_dir():
        raise TrtoptError(
            f"--timing-cache {str(options.timing_cache)!r} is a folder.",
            fix="Give a file path, e.g. --timing-cache build/timing.cache (created if missing).",
        )
    for name, profile in (options.profiles or {}).items():
        validate_profile(name, profile)


def validate_profile(name: str, profile: Profile) -> None:
    ranks = {len(profile.min), len(profile.opt), len(profile.max)}
    ordered = len(ranks) == 1 and all(
        1 <= a <= b <= c for a, b, c in zip(profile.min, profile.opt, profile.max, strict=True)
    )
    if len(ranks) != 1 or not ordered:
        raise ShapeError(
            f"The shape profile of input {name!r} is inconsistent: min {list(profile.min)}, opt "
            f"{list(profile.opt)}, max {list(profile.max)}.",
            fix="Every dimension needs 1 <= min <= opt <= max, with the same rank in all three.",
        )


def network_flags(major: int, strongly_typed_bit: int) -> int:
    """``create_network`` flags: STRONGLY_TYPED on TensorRT 10 (opt-in there), 0 on 11 (always on there)."""
    return 0 if major >= STRONGLY_TYPED_IGNORED_FROM else 1 << strongly_typed_bit


class ParserErrorInfo(NamedTuple):
    """One ONNX parser error as plain data (what ``OnnxParser.get_error(i)`` reports)."""

    code: str
    desc: str
    node: int = -1
    node_name: str = ""
    node_operator: str = ""


def format_parser_errors(errors: Sequence[ParserErrorInfo | tuple[Any, ...]]) -> str:
    """One line per error, naming the node (index, name, op) TensorRT's parser stopped at."""
    lines = []
    for raw in errors:
        err = ParserErrorInfo(*raw)
        where = []
        if err.node_name:
            where.append(repr(err.node_name))
        if err.node_operator:
            where.append(f"({err.node_operator})")
        if err.node >= 0:
            where.append(f"#{err.node}")
        prefix = f"node {' '.join(where)}: " if where else ""
        lines.append(f"  - {prefix}{err.desc.strip()} [{err.code}]")
    return "\n".join(lines)


def enum_name(member: Any) -> str:
    """A TensorRT enum member's bare name: ``ErrorCode.UNSUPPORTED_NODE`` -> ``"UNSUPPORTED_NODE"``.

    pybind11 enum members print with their class (``str(trt.DataType.BF16) == "DataType.BF16"``), and
    ``.name`` is not reliable: in the TensorRT 10.13 bindings ``ErrorCode.name`` is a method. The class's
    ``__members__`` (name -> member) is there in every version."""
    members = getattr(type(member), "__members__", None) or {}
    return next((name for name, value in members.items() if value == member), str(member))


def _is_static(dim: Any) -> bool:
    return isinstance(dim, int) and dim > 0


def _check_given(name: str, dims: list[Any], given: Shape) -> None:
    if dims and len(dims) != len(given):
        raise ShapeError(
            f"--shapes gives input {name!r} rank {len(given)}, but the model's input has rank {len(dims)} "
            f"(shape {_fmt(dims)}).",
            fix="Give one size per dimension.",
        )
    for i, (want, have) in enumerate(zip(given, dims, strict=False)):  # dims may be unknown (empty)
        if _is_static(have) and have != want and not (i == 0 and want == DYNAMIC):  # N keeps the model's batch
            raise ShapeError(
                f"--shapes sets dimension {i} of input {name!r} to {want}, but the model fixes it at {have}.",
                fix=f"Only dynamic dimensions can be set; the model's shape is {_fmt(dims)}.",
            )


# --- the build (needs TensorRT) ------------------------------------------------------------------


def build(model: onnx.ModelProto, options: EngineOptions) -> tuple[dict[str, bytes], dict[str, str]]:
    """Build a serialised engine. Returns sections {"engine", "onnx"} and the library versions used."""
    from trtopt.backend.tensorrt.detect import require, tensorrt_major

    trt = require()
    validate_options(options)
    if options.fp16:
        from trtopt.precision import convert_to_fp16

        model = convert_to_fp16(model)
    model_bytes = _model_bytes(model)
    logger = _make_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(
        network_flags(tensorrt_major(trt), int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    )
    parser = trt.OnnxParser(network, logger)
    _parse(parser, model_bytes)
    config = builder.create_builder_config()
    _configure(trt, builder, network, config, options)
    cache_path = Path(options.timing_cache) if options.timing_cache is not None else None
    if cache_path is not None:
        _load_timing_cache(config, cache_path)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TrtoptError(
            "TensorRT could not build an engine for this model:\n" + logger.errors_text(),
            fix="Read TensorRT's messages above; rerun with -vv for its full log.",
        )
    if cache_path is not None:
        write_atomic(cache_path, bytes(config.get_timing_cache().serialize()))
    sections = {"engine": bytes(serialized), "onnx": model_bytes}
    return sections, {"tensorrt": str(trt.__version__), "onnx": onnx.__version__}


def _parse(parser: Any, model_bytes: bytes) -> None:
    if not parser.parse(model_bytes):
        errors = [
            ParserErrorInfo(
                code=enum_name(err.code()),
                desc=str(err.desc()),
                node=int(err.node()),
                node_name=str(err.node_name()),
                node_operator=str(err.node_operator()),
            )
            for err in (parser.get_error(i) for i in range(parser.num_errors))
        ]
        raise ModelError(
            f"TensorRT's ONNX parser rejected the model ({len(errors)} error(s)):\n"
            + format_parser_errors(errors),
            fix="Check the named node's op and opset against TensorRT's ONNX operator support matrix, or run "
            "`trtopt build --backend cpu` to use ONNX Runtime instead.",
        )


def _configure(trt: Any, builder: Any, network: Any, config: Any, options: EngineOptions) -> None:
    if options.workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level
    if options.sparsity:
        config.set_flag(trt.BuilderFlag.SPARSE_WEIGHTS)
    if options.threads is not None:
        builder.max_threads = options.threads
        if builder.max_threads != options.threads:  # the setter's bool is lost in an assignment
            raise TrtoptError(
                f"TensorRT refused --threads {options.threads} (it keeps {builder.max_threads}).",
                fix="Pass a smaller --threads, or leave it out to let TensorRT choose.",
            )
    profiles = dict(options.profiles or {})
    dynamic = [t for t in (network.get_input(i) for i in range(network.num_inputs)) if -1 in tuple(t.shape)]
    missing = [t.name for t in dynamic if t.name not in profiles]
    if missing:
        raise ShapeError(
            f"Input(s) {missing} have dynamic dimensions but no shape profile.",
            fix="Pass --batch N for a dynamic batch, and --shapes NAME:DxDxD for other dynamic dimensions.",
        )
    if dynamic:
        _add_profile(builder, config, {t.name: (tuple(t.shape), profiles[t.name]) for t in dynamic})


def _add_profile(builder: Any, config: Any, dynamic: Mapping[str, tuple[tuple[int, ...], Profile]]) -> None:
    """One optimisation profile for the dynamic inputs ({name: (model shape, profile)})."""
    profile = builder.create_optimization_profile()
    for name, (_, p) in dynamic.items():
        profile.set_shape(name, p.min, p.opt, p.max)
    if config.add_optimization_profile(profile) < 0:  # -1: TensorRT found the profile invalid
        refused = "; ".join(
            f"{name!r} (model {list(shape)}): min {list(p.min)}, opt {list(p.opt)}, max {list(p.max)}"
            for name, (shape, p) in dynamic.items()
        )
        raise ShapeError(
            f"TensorRT refused the shape profile: {refused}.",
            fix="Every fixed dimension must equal the model's; check --shapes and --batch against it.",
        )


def _load_timing_cache(config: Any, path: Path) -> None:
    data = path.read_bytes() if path.is_file() else b""
    cache = config.create_timing_cache(data)
    # ignore_mismatch=True: a cache from another GPU or TensorRT version is dropped, not fatal.
    if not config.set_timing_cache(cache, ignore_mismatch=True):
        raise TrtoptError(
            f"TensorRT refused the timing cache {str(path)!r} ({len(data)} bytes).",
            fix="Delete the file (the build writes a fresh one) or pass another --timing-cache path.",
        )
    log.info("timing cache %s (%d bytes)", path, len(data))


def _model_bytes(model: onnx.ModelProto) -> bytes:
    if serialized_size(model) < PROTOBUF_LIMIT:
        return model.SerializeToString()
    raise ModelError(
        "The model is over 2 GiB, which TensorRT's parser and a plan cannot take as one protobuf.",
        fix="Quantise it first (INT8 weights are a quarter of the size) or split it into smaller models.",
    )


def _make_logger(trt: Any) -> Any:
    """An ILogger that forwards to `logging` and keeps errors for the failure message."""

    class _Logger(trt.ILogger):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR):
                self.errors.append(msg)
                log.error("TensorRT: %s", msg)
            elif severity == trt.ILogger.WARNING:
                log.warning("TensorRT: %s", msg)
            elif msg.startswith(SPARSITY_LOG_PREFIX):  # which layers ran sparse: shown with -v
                log.info("TensorRT: %s", msg)
            else:
                log.debug("TensorRT: %s", msg)

        def errors_text(self) -> str:
            return "\n".join(f"  - {m}" for m in self.errors) or "  (TensorRT logged no error)"

    return _Logger()
