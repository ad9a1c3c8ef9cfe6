"""`.npy` / `.npz` sample files: check their headers against the model inputs cheaply, load them later.

Batch rules, per array: rank equal to the input's rank means a batch ``[N, ...]``; one less means a single
sample. Static dimensions must match; dynamic ones accept any size. A `.npy` holds one array and so feeds
a single-input model; a `.npz` holds one array per input, named by input name (a single-input model also
accepts an `.npz` with exactly one array, whatever its name). Arrays that name no input are ignored with
a warning (labels are often saved beside the inputs); a missing input is an error.

Models whose inputs share no batch dimension (silero-vad: audio ``[1, 576]`` and LSTM state
``[2, 1, 128]``, the batch in the middle) take whole *feeds* instead of samples (`has_batch_axis` is
False): an array of the input's rank is one feed, one rank more a stack of feeds ``[N, *input shape]``,
and the model is called once per feed. So are models that take one image without a batch axis, ``[3, H, W]``
(torchvision's detection exports, `trtopt.data.inputs.unbatched_image`): a ``[3, H, W]`` array is one image,
``[N, 3, H, W]`` a stack of N, each run in a call of its own.

Dtypes must be of the same kind as the input's: floats are cast between widths (float64 data for a float32
input is common and harmless); integers are cast when every value fits; anything else is an error.
"""

from __future__ import annotations

import logging
import threading
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from trtopt.data.inputs import InputInfo, unbatched_image
from trtopt.errors import DataError, UnreadableFileError, format_shape

log = logging.getLogger(__name__)

ARRAY_EXTENSIONS = (".npy", ".npz")
_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError)


@dataclass(frozen=True)
class ArrayFile:
    """A validated array file: which key feeds which input, how many samples, batched or one sample."""

    path: Path
    keys: tuple[tuple[str, str, bool], ...]  # (input name, key in the file or "" for .npy, batched?)
    samples: int

    @property
    def batched(self) -> bool:
        """True when the file holds a batch (so its samples are named `path[i]`), not one sample."""
        return any(batched for _, _, batched in self.keys)


def has_batch_axis(inputs: Sequence[InputInfo]) -> bool:
    """True when every input's first dimension is one shared batch dimension: all dynamic, or all the same
    size, and no input is an image without a batch axis (``[3, H, W]``: its first dimension is the colours).
    Otherwise samples cannot be stacked along it, and each sample is one whole feed."""
    firsts = {info.shape[0] if info.shape else -1 for info in inputs}
    return len(firsts) == 1 and -1 not in firsts and not any(unbatched_image(info.shape) for info in inputs)


def samples_in(feeds: Mapping[str, Any], model: onnx.ModelProto) -> int:
    """How many samples one call's `feeds` for `model` hold: the first array's leading size where the model's
    inputs share a batch axis (`has_batch_axis`), else 1 (one whole feed, e.g. one ``[3, H, W]`` image)."""
    weights = {t.name for t in model.graph.initializer}
    infos = [InputInfo(t.name, [d.dim_value or None for d in t.type.tensor_type.shape.dim], "float32")
             for t in model.graph.input if t.name not in weights]  # fmt: skip
    first = next(iter(feeds.values()), None)
    return int(np.shape(first)[0]) if first is not None and np.ndim(first) and has_batch_axis(infos) else 1


def array_file_from_path(path: Path, inputs: Sequence[InputInfo]) -> ArrayFile:
    """Read the headers of `path` and check them against `inputs`.

    Raises `UnreadableFileError` for files that cannot be read (the data set skips those) and `DataError`
    for data that does not fit the model (a mistake the user must fix).
    """
    headers = _npz_headers(path) if path.suffix.lower() == ".npz" else {"": _npy_header(path)}
    keys = _match_keys(path, headers, inputs)
    stacks = has_batch_axis(inputs)
    batched = [
        _is_batched(path, key, headers[key][0], info, stacks) for info, key in zip(inputs, keys, strict=True)
    ]
    counts = {headers[key][0][0] if b else 1 for key, b in zip(keys, batched, strict=True)}
    if len(counts) > 1:
        found = {key: list(headers[key][0]) for key in keys}
        raise DataError(
            f"{path}: the arrays hold different numbers of samples (shapes {found}).",
            fix="Give every input the same batch size (or store single samples without a batch dimension).",
        )
    samples = counts.pop()
    if samples == 0:
        raise UnreadableFileError(f"Cannot use {path}: its arrays hold no samples (batch dimension 0).")
    for info, key in zip(inputs, keys, strict=True):
        _check_dtype(path, key, headers[key][1], info)
    keyed = tuple((i.name, k, b) for i, k, b in zip(inputs, keys, batched, strict=True))
    return ArrayFile(path, keyed, samples)


# Dataset readers load files in a pool of threads, and numpy parses every .npy header with ast.literal_eval.
# On CPython 3.11 building ASTs in two threads at once can fail with a spurious "SystemError: AST constructor
# recursion depth mismatch" (python/cpython#106905; seen here on a test that read two .npz files at once), so
# array files are read one at a time. Images, the costly case, still decode in parallel.
_READ_LOCK = threading.Lock()


def shapes_from_arrays(
    path: Path, inputs: dict[str, list[int | str | None]], *, feeds: bool = False
) -> dict[str, tuple[int | str, ...]]:
    """Full shapes for the inputs with dynamic dimensions, read from the headers of the array file at `path`
    (`inputs`: each model input's dimensions, a name or None where dynamic). An array feeds an input as the
    module doc says (by name, or the only array of a single-input model). Where the inputs share a batch
    dimension, an array of the input's rank is a batch and one of one less is one sample; the first dimension
    stays the model's (a dynamic batch stays dynamic; 1 where it has no name), and only dynamic dimensions past
    it are read. `feeds` (the inputs share no batch dimension, `has_batch_axis`): an array of the input's rank
    is one whole feed and one of one more a stack of feeds, and every dynamic dimension is read, the first too
    (silero-vad's [batch, sequence] audio beside its [2, batch, 128] state). An input with no array is left
    out (loading the data reports it); an array that does not fit its input is an error, since no size would
    make it fit."""
    headers = _npz_headers(path) if path.suffix.lower() == ".npz" else {"": _npy_header(path)}
    shapes: dict[str, tuple[int | str, ...]] = {}
    for name, dims in inputs.items():
        if not dims or all(isinstance(d, int) for d in (dims if feeds else dims[1:])):
            continue
        header = headers.get(name) or (next(iter(headers.values())) if len(inputs) == len(headers) == 1 else None)
        if header is None:
            continue
        shape = header[0]
        if feeds:
            unit = shape[1:] if len(shape) == len(dims) + 1 else shape if len(shape) == len(dims) else None
            fixed = dims
        else:
            unit = shape[1:] if len(shape) == len(dims) else shape if len(shape) == len(dims) - 1 else None
            fixed = dims[1:]
        if unit is None or any(isinstance(d, int) and d != s for d, s in zip(fixed, unit, strict=True)):
            sample = [d if d is not None else "?" for d in (dims if feeds else dims[1:])]
            what = (f"one feed {format_shape(sample)} or a stack of feeds {format_shape(['N', *sample])}" if feeds
                    else f"a stack of samples {format_shape(['N', *sample])} (each fed as {format_shape(dims)}) or "
                    f"one sample {format_shape(sample)}")
            raise DataError(
                f"{path}: the array for input {name!r} has shape {format_shape(shape)}, but the input "
                f"{format_shape(dims)} takes {what}{'; ? is any size' if None in dims else ''}.",
                fix="Save the arrays in one of those shapes, or check the model.",
            )
        shapes[name] = tuple(unit) if feeds else (1 if dims[0] is None else dims[0], *unit)
    return shapes


def _read(item: ArrayFile) -> dict[str, np.ndarray]:
    if item.path.suffix.lower() == ".npz":
        with np.load(item.path, allow_pickle=False) as archive:
            return {name: archive[key] for name, key, _ in item.keys}
    return {item.keys[0][0]: np.load(item.path, mmap_mode="r", allow_pickle=False)}


def load_arrays(item: ArrayFile, inputs: Sequence[InputInfo]) -> dict[str, np.ndarray]:
    """Arrays per input name, each with a leading sample dimension and the input's dtype."""
    dtypes = {info.name: info.dtype for info in inputs}
    try:
        with _READ_LOCK:  # numpy parses .npy headers with ast.literal_eval: not thread-safe on CPython 3.11
            raw = _read(item)
    except _READ_ERRORS as exc:
        raise UnreadableFileError(f"Cannot read {item.path}: {_why(exc)}.") from exc
    out = {}
    for name, _, batched in item.keys:
        array = raw[name] if batched else raw[name][None]
        out[name] = _cast(item.path, name, array, dtypes[name])
    return out


Header = tuple[tuple[int, ...], np.dtype[Any]]


def _npy_header(path: Path) -> Header:
    try:
        with open(path, "rb") as f:
            shape, dtype = _read_header(f)
            expected = f.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if path.stat().st_size < expected:
            raise ValueError(f"the file is truncated ({path.stat().st_size} of {expected} bytes)")
    except _READ_ERRORS as exc:
        raise UnreadableFileError(f"Cannot read {path}: {_why(exc)}.") from exc
    return shape, dtype


def _npz_headers(path: Path) -> dict[str, Header]:
    try:
        with zipfile.ZipFile(path) as archive:
            headers = {}
            for member in archive.namelist():
                if member.endswith(".npy"):
                    with archive.open(member) as f:
                        headers[member[: -len(".npy")]] = _read_header(f)
    except _READ_ERRORS as exc:
        raise UnreadableFileError(f"Cannot read {path}: {_why(exc)}.") from exc
    if not headers:
        raise UnreadableFileError(f"Cannot read {path}: the .npz archive holds no arrays.")
    return headers


def _read_header(f: Any) -> Header:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    if dtype.hasobject:
        raise ValueError("it stores Python objects (pickles), which trtopt does not load")
    return tuple(shape), dtype


def _match_keys(path: Path, headers: dict[str, Header], inputs: Sequence[InputInfo]) -> list[str]:
    names = [info.name for info in inputs]
    if "" in headers and len(inputs) > 1:
        raise DataError(
            f"{path} is a .npy file (one array), but the model has {len(inputs)} inputs "
            f"({', '.join(names)}).",
            fix=f"Save the samples as .npz with one array per input: np.savez(file, {_kwargs(names)}).",
        )
    if len(inputs) == 1 and len(headers) == 1:
        return list(headers)
    missing = [n for n in names if n not in headers]
    if missing:
        raise DataError(
            f"{path} has arrays {sorted(headers)}, but the model's input(s) {missing} are not among them.",
            fix=f"Name the arrays after the model inputs: np.savez(file, {_kwargs(names)}).",
        )
    extra = sorted(set(headers) - set(names))
    if extra:  # kept lenient (labels saved beside the inputs are common), but said once per file
        log.warning("%s: ignoring arrays %s, which name no model input (the inputs are %s)", path, extra, names)
    return names


def _is_batched(path: Path, key: str, shape: tuple[int, ...], info: InputInfo, stacks: bool) -> bool:
    """Whether the array holds several samples along a leading axis (`stacks`: see `has_batch_axis`)."""
    unit = info.sample_shape if stacks else info.shape  # one sample, or one whole feed
    sample: tuple[int, ...] | None
    if len(shape) == len(unit) + 1:
        batched, sample = True, shape[1:]
    elif len(shape) == len(unit):
        batched, sample = False, shape
    else:
        batched, sample = False, None
    if sample is None or any(w is not None and g != w for g, w in zip(sample, unit, strict=True)):
        what = f"array {key!r}" if key else "the array"
        if stacks:
            # any number N of samples stacks on the batch axis, whatever size the model's batch has
            expected = (f"a stack of samples {format_shape(['N', *info.sample_shape])} or one sample "
                        f"{format_shape(info.sample_shape)}")  # fmt: skip
        else:
            expected = (f"one feed {format_shape(info.shape)} or a stack of feeds [N, {format_shape(unit)[1:]} (the "
                        "model's inputs share no batch dimension, so each sample is one whole feed)")
        raise DataError(
            f"{path}: {what} has shape {list(shape)}, but input {info.name!r} expects {expected}.",
            fix="Save data in the model's input shape (dynamic sizes can be set with --shapes).",
        )
    return batched


def _check_dtype(path: Path, key: str, dtype: np.dtype[Any], info: InputInfo) -> None:
    want = info.dtype
    same_kind = dtype.kind == want.kind or (dtype.kind in "iu" and want.kind in "iu")
    if dtype == want or (same_kind and dtype.kind in "fiu"):
        return
    what = f"array {key!r}" if key else "the array"
    raise DataError(
        f"{path}: {what} has dtype {dtype}, but input {info.name!r} is {want}.",
        fix=f"Convert it before saving, e.g. array.astype(np.{want.name}).",
    )


def _cast(path: Path, name: str, array: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    if array.dtype == dtype:
        return array
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        low, high = int(array.min()), int(array.max())
        if low < info.min or high > info.max:
            raise DataError(
                f"{path}: values for input {name!r} range over [{low}, {high}], outside {dtype}'s "
                f"[{info.min}, {info.max}].",
                fix=f"Store the data as {dtype.name} with values in range.",
            )
    return array.astype(dtype)


def _kwargs(names: Sequence[str]) -> str:
    return ", ".join(f"{name}=..." for name in names)


def _why(exc: BaseException) -> str:
    if isinstance(exc, zipfile.BadZipFile):
        return "not a valid .npz (zip) archive"
    return (str(exc).strip() or type(exc).__name__).rstrip(".")
