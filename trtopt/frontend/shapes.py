"""Input shapes: parse `--shapes name:1x3x224x224`, apply them, and insist on concrete shapes where needed."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import onnx_graphsurgeon as gs

from trtopt.errors import ShapeError, format_shape

Shape = tuple[int, ...]

# Largest size of one dimension (ONNX Runtime and TensorRT index with 32-bit sizes) and highest rank.
MAX_DIM = 2**31 - 1
MAX_RANK = 8
_UNKNOWN = {"none", "unknown", "dynamic", "unk"}  # dim_param spellings of "any size", not of a shared one
# `--shapes x:Nx108x144x3`: the first (batch) dimension stays as the model has it, dynamic or fixed, and only the
# others are set (MTCNN's PNet, [N, M1, M2, 3]: with every size given it could never take a batch; round 13).
DYNAMIC = -1


def example_shape(dims: object) -> str:
    """A `--shapes` value the parser accepts for `dims`: dynamic sizes become 1 (the first, or one named like a
    batch: silero-vad's state is [2, batch, 128]) or 224."""
    sizes = list(dims) if dims is not None else []  # type: ignore[call-overload]
    return "x".join(_example_size(i, d) for i, d in enumerate(sizes))


def _example_size(index: int, dim: object) -> str:
    if isinstance(dim, int) and dim > 0:
        return str(dim)
    batch = isinstance(dim, str) and ("batch" in dim.lower() or dim in ("N", "n"))
    return "1" if index == 0 or batch else "224"


def parse_shapes(specs: list[str] | tuple[str, ...] | None) -> dict[str, Shape]:
    """Parse `["input:1x3x224x224", ...]` into `{"input": (1, 3, 224, 224)}`."""
    shapes: dict[str, Shape] = {}
    for spec in specs or ():
        for item in spec.split(","):
            name, sep, dims = item.strip().rpartition(":")
            sizes = dims.lower().split("x")
            try:
                shape = tuple(DYNAMIC if i == 0 and d in ("n", "-1") else int(d) for i, d in enumerate(sizes))
            except ValueError:
                shape = ()
            sized = shape and (shape[0] > 0 or shape[0] == DYNAMIC) and all(d > 0 for d in shape[1:])
            if not sep or not name or not sized:
                raise ShapeError(
                    f"Cannot read shape spec {item!r}.",
                    fix="Write it as NAME:DxDxD with positive integers, e.g. --shapes input:1x3x224x224; the first "
                    "(batch) dimension may be N, to keep the model's (a dynamic batch stays dynamic).",
                )
            if len(shape) > MAX_RANK or any(d > MAX_DIM for d in shape):
                raise ShapeError(
                    f"Shape spec {item!r} is out of range: at most {MAX_RANK} dimensions of at most {MAX_DIM:,} "
                    "each.",
                    fix="Give the model's real input sizes, e.g. --shapes input:1x3x224x224.",
                )
            shapes[name] = shape
    return shapes


def apply_shapes(graph: gs.Graph, shapes: dict[str, Shape]) -> None:
    """Set the given graph inputs' shapes; every named input must exist and keep its rank. A named dynamic size
    (ONNX's dim_param) set here is set in the other inputs that name it too: the same name is the same size
    (silero-vad: `--shapes input:1x576` sets the `batch` of its [2, batch, 128] state)."""
    inputs = {t.name: t for t in graph.inputs}
    named: dict[str, tuple[int, str]] = {}  # a named size -> (its size, the input that set it)
    for name, shape in shapes.items():
        if name not in inputs:
            raise ShapeError(
                f"--shapes names input {name!r}, but the model has no such input.",
                fix=f"Model inputs: {', '.join(inputs) or '(none)'}.",
            )
        tensor = inputs[name]
        old = tensor.shape
        if old is not None and len(old) != len(shape):
            raise ShapeError(
                f"--shapes gives input {name!r} rank {len(shape)} ({format_shape(shape)}), but the model's input has "
                f"rank {len(old)} ({format_shape(old)}).",
                fix="Give one size per dimension.",
            )
        # N: the model's batch (fixed, or dynamic: a name or None), or a dynamic one where it declares no shape
        sizes: list[Any] = [(old[0] if old else "N") if (i, d) == (0, DYNAMIC) else d for i, d in enumerate(shape)]
        for i, (want, have) in enumerate(zip(sizes, old or sizes, strict=True)):
            if isinstance(have, int) and have > 0 and have != want:
                raise ShapeError(
                    f"--shapes sets dimension {i} of input {name!r} to {want}, "
                    f"but the model fixes it at {have}.",
                    fix=f"Only dynamic dimensions can be set; the model's shape is {format_shape(old)}.",
                )
        for dim, size in _named_sizes(old or (), sizes):
            if named.setdefault(dim, (size, name))[0] != size:
                raise ShapeError(
                    f"The input sizes given (--shapes, or read from the --calib arrays) set the size the model names "
                    f"{dim!r} to {named[dim][0]} in input {named[dim][1]!r} and to {size} in input {name!r}; the "
                    "model uses one size for both.",
                    fix=f"Give {dim!r} the same size in every input (or set it in one input only), and save arrays "
                    "that agree.",
                )
        tensor.shape = sizes
    for tensor in graph.inputs:
        if tensor.name not in shapes and tensor.shape is not None and any(d in named for d in tensor.shape):
            tensor.shape = [named[d][0] if d in named else d for d in tensor.shape]


def _named_sizes(dims: Sequence[object], sizes: Sequence[object]) -> list[tuple[str, int]]:
    """(name, size) for each dimension the model names and `sizes` sets to a number. A name that stands for "unknown"
    (paddle2onnx writes '?' for every dynamic size: PP-OCR's [?, 3, ?, ?]) or that one input repeats with two sizes
    names no shared size, and is left out."""
    pairs = [(d, z) for d, z in zip(dims, sizes, strict=True) if isinstance(d, str) and isinstance(z, int)]
    pairs = [(d, z) for d, z in pairs if re.fullmatch(r"[A-Za-z_][\w.]*", d) and d.lower() not in _UNKNOWN]
    repeated = {d for d, z in pairs if any(d == e and z != y for e, y in pairs)}
    return [(d, z) for d, z in pairs if d not in repeated]


def require_static_shapes(graph: gs.Graph, *, allow_dynamic_batch: bool = True) -> None:
    """Raise if any input dimension is unknown (the leading batch dimension may stay dynamic), naming every
    such input at once, with one `--shapes` value that sets them all."""
    start = 1 if allow_dynamic_batch else 0
    problems, examples = [], []
    for tensor in graph.inputs:
        dims = list(tensor.shape or [])
        dynamic = [i for i, d in enumerate(dims) if i >= start and not (isinstance(d, int) and d > 0)]
        if tensor.shape is None:
            problems.append(f"input {tensor.name!r} has no shape in the model")
            examples.append(f"{tensor.name}:1x3x224x224")
        elif dynamic:
            problems.append(f"input {tensor.name!r} has dynamic dimension(s) {dynamic} (shape {format_shape(dims)})")
            examples.append(f"{tensor.name}:{example_shape(dims)}")
    if problems:
        text = "; ".join(problems)
        named = any(isinstance(d, str) for t in graph.inputs for d in t.shape or ())
        shared = "; inputs that name a size alike share it: setting it in one sets it in all" if named else ""
        raise ShapeError(
            f"{text[0].upper()}{text[1:]}: trtopt needs concrete sizes there to preprocess data and build the plan.",
            fix=f"Pass them with --shapes, e.g. --shapes {','.join(examples)} (with your real sizes in place of the "
            f"dynamic ones{shared}).",
        )
