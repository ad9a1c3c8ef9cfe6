"""Calibration file formats, one `CacheFormat` (detect, read, write) each, registered in `CACHE_FORMATS`.

The formats (see `trtopt.calib.cache` for the public functions):

- "trtopt": JSON ``{"format": "trtopt-calibration", "version": 1, "model_fingerprint", "method",
  "data": {"description", "count"}, "thresholds": {tensor: T}, "channel_means": {tensor: [mean, ...]},
  "methods": {tensor: method}}``; floats round-trip exactly. "channel_means" (for bias correction) is
  optional: readers that predate it ignore it, and a cache without it builds without bias correction.
  "methods" (which method `--method auto` kept per tensor) is optional too, and only informative.
  "equalization" (optional) records the activation-equalisation rewrite the thresholds belong to
  (`trtopt.calib.equalization`); a cache whose record rescales any tensor is written as version 2, so a
  trtopt that cannot redo the rewrite refuses it clearly instead of missing the renamed tensors' thresholds.
- "tensorrt": first line ``TRT-<version>-<algorithm>`` (EntropyCalibration2, EntropyCalibration,
  MinMaxCalibration or LegacyCalibration), then ``tensor: xxxxxxxx`` lines where the hex is the
  big-endian IEEE-754 float32 *scale* T/127 (DESIGN.md; TensorRT ≤ 10 writeCalibrationCache).
  T read back is float32(scale) * 127.
- "onnxruntime-json": ORT's calibration.json, ``json.dumps(TensorsData)`` as written by
  `onnxruntime.quantization.quant_utils.write_calibration_table` (ranges under "data", each a TensorData
  whose "lowest"/"highest" are numbers or {"data", "dtype", "CLS": "numpy.array"}), or the older plain
  ``{tensor: [lowest, highest]}``. T = max(|lowest|, |highest|).
- "onnxruntime-text": ORT's calibration.cache, ``tensor value`` lines, value = max(highest, lowest).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np

from trtopt._version import __version__
from trtopt.calib.calibration import Calibration
from trtopt.calib.equalization import EqualizationRecord
from trtopt.calib.thresholds import QMAX
from trtopt.errors import CalibrationError
from trtopt.registry import Registry

TRTOPT_FORMAT = "trtopt-calibration"
TRTOPT_VERSION = 2  # 2: an "equalization" record with gains (version 1: everything else, still written then)
TRT_ALGORITHMS = {
    "EntropyCalibration2": "entropy",
    "EntropyCalibration": "entropy",
    "MinMaxCalibration": "max",
    "LegacyCalibration": "legacy",
}
_TRT_HEADER = re.compile(r"^TRT-(\d+)-(" + "|".join(TRT_ALGORITHMS) + r")$")
# TensorRT refuses a cache whose header names another TensorRT version; without TensorRT installed,
# write 10.3.0's (TensorRT 10 numbers versions major*10000 + minor*100 + patch, TensorRT 8 major*1000 + ...).
DEFAULT_TRT_VERSION = "100300"
_ORT_METHODS = {"entropy": "Entropy", "max": "MinMax", "percentile": "Percentile"}


@dataclass(frozen=True)
class CacheFormat:
    """How to recognise, read and write one calibration file format."""

    name: str
    detect: Callable[[str], bool]
    read: Callable[[str, str], Calibration]  # (text, where) -> Calibration
    write: Callable[[Calibration, Mapping[str, Any]], str]  # (calibration, options) -> text


CACHE_FORMATS: Registry[CacheFormat] = Registry("calibration cache format")


# --- trtopt JSON ------------------------------------------------------------------------------------


def _is_trtopt(text: str) -> bool:
    return text.lstrip().startswith("{") and f'"{TRTOPT_FORMAT}"' in text


def _read_trtopt(text: str, where: str) -> Calibration:
    doc = _parse_json(text, where)
    version = doc.get("version")
    if not isinstance(version, int) or version > TRTOPT_VERSION:
        raise CalibrationError(
            f"{where!r} is trtopt calibration format version {version!r}; this trtopt reads up to "
            f"{TRTOPT_VERSION}.",
            fix="Upgrade trtopt, or recalibrate with this one.",
        )
    thresholds = doc.get("thresholds")
    if not isinstance(thresholds, dict):
        raise CalibrationError(f"{where!r} has no \"thresholds\" object.", fix="Recalibrate to rewrite it.")
    amax = {str(k): _number(v, where, k) for k, v in thresholds.items()}
    data = doc.get("data") or {}
    if not isinstance(data, dict) or not isinstance(data.get("count"), (int, type(None))) or isinstance(
        data.get("count"), bool
    ):
        raise CalibrationError(f"{where!r} has a \"data\" field trtopt did not write (an object with a count).",
                               fix="Recalibrate to rewrite it, or delete the field.")
    return Calibration(
        amax=amax,
        method=str(doc.get("method", "unknown")),
        num_samples=data.get("count"),
        channel_means=_read_channel_means(doc.get("channel_means"), where),
        fingerprint=_fingerprint(doc.get("model_fingerprint"), where),
        data_description=data.get("description"),
        source=f"{where} (trtopt)",
        choices=_read_choices(doc.get("methods"), where),
        equalization=EqualizationRecord.from_dict(doc["equalization"], where) if "equalization" in doc else None,
    )


def _write_trtopt(calibration: Calibration, options: Mapping[str, Any]) -> str:
    record = calibration.equalization
    doc = {
        "format": TRTOPT_FORMAT,
        "version": TRTOPT_VERSION if record is not None and record.applied and record.gains else 1,
        "written_by": f"trtopt {__version__}",
        "model_fingerprint": calibration.fingerprint,
        "method": calibration.method,
        "data": {"description": calibration.data_description, "count": calibration.num_samples},
        "thresholds": dict(calibration.amax),
    }
    if calibration.choices:
        doc["methods"] = dict(calibration.choices)
    if calibration.channel_means:
        doc["channel_means"] = {name: [float(v) for v in m] for name, m in calibration.channel_means.items()}
    if record is not None:
        doc["equalization"] = record.to_dict()
    return json.dumps(doc, indent=1) + "\n"


def _read_choices(raw: Any, where: str) -> dict[str, str] | None:
    """The method behind each threshold (`--method auto`); caches written before it have none."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise CalibrationError(
            f"{where!r}: \"methods\" must map tensor names to method names.",
            fix="Recalibrate to rewrite the cache (or delete the \"methods\" key: the thresholds do not need it).",
        )
    return {str(k): v for k, v in raw.items()}


def _read_channel_means(raw: Any, where: str) -> dict[str, np.ndarray] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not all(isinstance(v, list) for v in raw.values()):
        raise CalibrationError(
            f"{where!r}: \"channel_means\" must map tensor names to lists of numbers.",
            fix="Recalibrate to rewrite the cache (or delete the \"channel_means\" key to build without bias "
            "correction).",
        )
    return {str(name): np.array([_number(v, where, name) for v in values]) for name, values in raw.items()}


# --- TensorRT text cache ------------------------------------------------------------------------------


def trt_scale_to_hex(scale: float) -> str:
    """The 8 hex digits TensorRT writes for a scale: big-endian IEEE-754 float32 (0.0078125 -> 3c000000)."""
    return struct.pack(">f", scale).hex()


def trt_scale_from_hex(text: str) -> float:
    return float(struct.unpack(">f", int(text, 16).to_bytes(4, "big"))[0])


def _is_tensorrt(text: str) -> bool:
    lines = text.lstrip().splitlines()
    return bool(lines) and _TRT_HEADER.match(lines[0].strip()) is not None


def _read_tensorrt(text: str, where: str) -> Calibration:
    lines = text.strip().splitlines()
    header = _TRT_HEADER.match(lines[0].strip())
    if header is None:
        raise _line_error(where, 1, lines[0], "TRT-<version>-EntropyCalibration2")
    amax = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        name, sep, value = line.rpartition(":")  # tensor names may contain ':' (TensorFlow's "x:0")
        try:
            if not sep or not name.strip():
                raise ValueError
            amax[name.strip()] = trt_scale_from_hex(value.strip()) * QMAX
        except (ValueError, OverflowError, struct.error):
            raise _line_error(where, number, line, "tensor_name: 8 hex digits") from None
    return Calibration(
        amax=amax, method=TRT_ALGORITHMS[header.group(2)],
        source=f"{where} (TensorRT {header.group(1)} {header.group(2)})",
    )


def _write_tensorrt(calibration: Calibration, options: Mapping[str, Any]) -> str:
    algorithm = options.get("trt_algorithm") or "EntropyCalibration2"
    if algorithm not in TRT_ALGORITHMS:
        raise CalibrationError(
            f"Unknown TensorRT calibration algorithm {algorithm!r}.",
            fix=f"Use one of {sorted(TRT_ALGORITHMS)}.",
        )
    version = str(options.get("trt_version") or _installed_trt_version() or DEFAULT_TRT_VERSION)
    if not version.isdigit():
        raise CalibrationError(
            f"TensorRT cache version {version!r} is not a number.",
            fix='Give the number in the header TensorRT writes, e.g. "8601" (8.6.1) or "100300" (10.3.0).',
        )
    _check_names(calibration.amax, "TensorRT cache")
    lines = [f"TRT-{version}-{algorithm}"]
    lines += [f"{name}: {trt_scale_to_hex(t / QMAX)}" for name, t in calibration.amax.items()]
    return "\n".join(lines) + "\n"


def _installed_trt_version() -> str | None:
    """The installed TensorRT's header number, read from package metadata (TensorRT is not imported)."""
    for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt-cu11"):
        try:
            parts = [int(p) for p in metadata.version(dist).split(".")[:3]]
        except (metadata.PackageNotFoundError, ValueError):
            continue
        major, minor, patch = (parts + [0, 0])[:3]
        return str(major * (10000 if major >= 10 else 1000) + minor * 100 + patch)
    return None


# --- ONNX Runtime -----------------------------------------------------------------------------------


def _is_ort_json(text: str) -> bool:
    return text.lstrip().startswith("{")


def _read_ort_json(text: str, where: str) -> Calibration:
    doc = _parse_json(text, where)
    ranges = doc.get("data") if doc.get("CLS") == "TensorsData" else doc
    if not isinstance(ranges, dict) or not ranges:
        raise CalibrationError(
            f"{where!r} is JSON but neither a trtopt cache nor ONNX Runtime's calibration.json.",
            fix="Pass a cache written by trtopt, TensorRT or onnxruntime's write_calibration_table.",
        )
    amax = {str(name): _ort_amax(entry, where, name) for name, entry in ranges.items()}
    method = doc.get("calibration_method")
    label = str(method.get("value", "")).rpartition(".")[2] if isinstance(method, dict) else str(method or "")
    return Calibration(
        amax=amax, method=f"onnxruntime:{label.lower() or 'unknown'}", source=f"{where} (ONNX Runtime json)"
    )


def _ort_amax(entry: Any, where: str, name: str) -> float:
    if isinstance(entry, (list, tuple)) and len(entry) >= 2:
        low, high = entry[0], entry[1]
    elif isinstance(entry, dict) and "lowest" in entry and "highest" in entry:
        low, high = entry["lowest"], entry["highest"]
    else:
        raise CalibrationError(
            f"{where!r}: the entry for tensor {name!r} has no lowest/highest range: {str(entry)[:80]}.",
            fix="Pass ONNX Runtime's calibration.json as write_calibration_table wrote it.",
        )
    return max(abs(_ort_number(low, where, name)), abs(_ort_number(high, where, name)))


def _ort_number(value: Any, where: str, name: str) -> float:
    if isinstance(value, dict) and value.get("CLS") == "numpy.array":
        value = value.get("data")
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    return _number(value, where, name)


def _write_ort_json(calibration: Calibration, options: Mapping[str, Any]) -> str:
    def array(x: float) -> dict[str, Any]:  # a float32 0-d array, as ORT's CalibrationCacheEncoder writes
        value = float(struct.unpack("f", struct.pack("f", x))[0])
        return {"data": value, "dtype": "float32", "CLS": "numpy.array"}

    data = {
        name: {"lowest": array(-t), "highest": array(t), "CLS": "TensorData"}
        for name, t in calibration.amax.items()
    }
    method = _ORT_METHODS.get(calibration.method, "Entropy")
    doc = {"CLS": "TensorsData", "data": data,
           "calibration_method": {"CLS": "CalibrationMethod", "value": f"CalibrationMethod.{method}"}}
    return json.dumps(doc)


def _is_ort_text(text: str) -> bool:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return bool(lines) and all(_ort_text_line(line) is not None for line in lines[:8])


def _ort_text_line(line: str) -> tuple[str, float] | None:
    name, sep, value = line.strip().rpartition(" ")
    try:
        return (name, float(value)) if sep and name else None
    except ValueError:
        return None


def _read_ort_text(text: str, where: str) -> Calibration:
    amax = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parsed = _ort_text_line(line)
        if parsed is None:
            raise _line_error(where, number, line, "tensor_name value")
        amax[parsed[0]] = abs(parsed[1])
    return Calibration(amax=amax, method="onnxruntime", source=f"{where} (ONNX Runtime text)")


def _write_ort_text(calibration: Calibration, options: Mapping[str, Any]) -> str:
    _check_names(calibration.amax, "ONNX Runtime calibration.cache", forbid=" ")
    return "".join(f"{name} {t!r}\n" for name, t in sorted(calibration.amax.items()))


# Detection order matters: the trtopt JSON before ORT's JSON, and the header-less ORT text last.
for _format in (
    CacheFormat("trtopt", _is_trtopt, _read_trtopt, _write_trtopt),
    CacheFormat("tensorrt", _is_tensorrt, _read_tensorrt, _write_tensorrt),
    CacheFormat("onnxruntime-json", _is_ort_json, _read_ort_json, _write_ort_json),
    CacheFormat("onnxruntime-text", _is_ort_text, _read_ort_text, _write_ort_text),
):
    CACHE_FORMATS.add(_format.name, _format)


# --- helpers ----------------------------------------------------------------------------------------


def _parse_json(text: str, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(
            f"{where!r} is not valid JSON ({exc.msg} at line {exc.lineno}); the file may be truncated.",
            fix="Recalibrate, or restore the file from where it came.",
        ) from None
    except (ValueError, RecursionError) as exc:  # a number of over 4300 digits, nesting beyond the stack
        reason = "JSON nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise CalibrationError(f"{where!r} is not a calibration cache trtopt reads ({reason}).",
                               fix="Recalibrate, or restore the file from where it came.") from None
    if not isinstance(doc, dict):
        raise CalibrationError(f"{where!r} holds JSON of type {type(doc).__name__}, not an object.")
    return doc


def _fingerprint(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise CalibrationError(
        f"{where!r} has a model_fingerprint of type {type(value).__name__}; trtopt writes a string (a sha256).",
        fix="Recalibrate to rewrite the cache, or delete the model_fingerprint field to use it for any model.",
    )


def _number(value: Any, where: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CalibrationError(
            f"{where!r}: the threshold of tensor {name!r} is {value!r}, not a finite number.",
            fix="Recalibrate to rewrite the cache.",
        )
    return float(value)


def check_values(amax: Mapping[str, float], names: Iterable[str], *, where: str) -> None:
    bad = [n for n in names if not (math.isfinite(amax[n]) and amax[n] > 0)]
    if bad:
        raise CalibrationError(
            f"{len(bad)} thresholds in {where} are zero, negative or not finite: {sample_names(bad)}.",
            fix="Every threshold must be positive; recalibrate (all-zero tensors get a small positive T).",
        )


def _check_names(amax: Mapping[str, float], what: str, forbid: str = "") -> None:
    bad = [n for n in amax if "\n" in n or (forbid and forbid in n)]
    if bad:
        raise CalibrationError(
            f"Tensor names {sample_names(bad)} cannot be written to a {what}: they contain a newline"
            f"{' or a space' if forbid else ''}.",
            fix="Save in the trtopt JSON format instead.",
        )


def _line_error(where: str, number: int, line: str, expected: str) -> CalibrationError:
    return CalibrationError(
        f"{where!r} line {number} is {line.strip()[:80]!r}; expected `{expected}`.",
        fix="The cache is damaged or not a calibration cache; recalibrate or restore it.",
    )


def sample_names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
