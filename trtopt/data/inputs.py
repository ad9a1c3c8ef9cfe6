"""What a data set must fill: each model input's name, shape (None for a dynamic dimension) and dtype; and
`random_array`, the made-up input every check and timing that has no data uses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from trtopt.errors import DataError, ModelError, ShapeError


@dataclass(frozen=True)
class InputInfo:
    """One model input. Dimensions that are not positive ints (symbolic names, -1, None) become None."""

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype[Any]

    def __init__(self, name: str, shape: Sequence[int | str | None], dtype: npt.DTypeLike) -> None:
        dims = tuple(
            int(d) if isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 else None
            for d in shape
        )
        try:
            resolved = np.dtype(dtype)
        except TypeError as exc:
            raise DataError(
                f"Input {name!r} has dtype {dtype!r}, which numpy cannot represent.",
                fix="Use a model whose inputs are float, integer or bool tensors.",
            ) from exc
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "dtype", resolved)

    @property
    def sample_shape(self) -> tuple[int | None, ...]:
        """The shape of one sample: everything after the batch dimension."""
        return self.shape[1:]


def unbatched_image(shape: Sequence[int | str | None]) -> bool:
    """Whether an input of `shape` is one image without a batch axis, ``[3, H, W]``: rank 3, its first dimension
    3 (the colour channels) and its height and width dynamic or larger than 3. torchvision's detection models
    (Faster R-CNN, RetinaNet, SSD, FCOS, Mask R-CNN) export so, from a list of images; they take one image per
    call. A grey ``[1, H, W]`` is left a batch of one (a ``[1, T, F]`` spectrogram reads the same)."""
    dims = list(shape)
    sizes = [d if isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 else None for d in dims]
    return len(sizes) == 3 and sizes[0] == 3 and all(d is None or d > 3 for d in sizes[1:])


def image_dims(shape: Sequence[int | str | None]) -> list[int | str | None]:
    """The 4-D ``[N, C, H, W]`` / ``[N, H, W, C]`` view of an image input: `shape` itself, or ``[1, 3, H, W]`` for
    one image without a batch axis (`unbatched_image`)."""
    return [1, *shape] if unbatched_image(shape) else list(shape)


def input_infos_from_graph(graph: Any) -> list[InputInfo]:
    """`InputInfo` for each input of an onnx-graphsurgeon graph, in the graph's order."""
    infos = []
    for tensor in graph.inputs:
        if tensor.shape is None:
            raise ShapeError(
                f"Input {tensor.name!r} has no shape in the model, so data cannot be checked against it.",
                fix=f"Pass it with --shapes {tensor.name}:1x3x224x224 (your real sizes).",
            )
        infos.append(InputInfo(tensor.name, list(tensor.shape), _numpy_dtype(tensor)))
    return infos


def _numpy_dtype(tensor: Any) -> np.dtype[Any]:
    dtype = tensor.dtype
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        # onnx-graphsurgeon keeps the ONNX enum for types numpy lacks (e.g. bfloat16).
        import onnx

        name = onnx.TensorProto.DataType.Name(dtype)
        raise ModelError(
            f"Input {tensor.name!r} has ONNX type {name}, which numpy (and so trtopt's data loader) "
            "cannot represent.",
            fix="Export the model with float32, float16 or integer inputs.",
        )
    if dtype is None:
        raise ModelError(
            f"Input {tensor.name!r} has no element type in the model.",
            fix="Re-export the model with typed inputs.",
        )
    return np.dtype(dtype)


def random_array(rng: np.random.Generator, shape: Sequence[int], dtype: npt.DTypeLike) -> np.ndarray:
    """Made-up input of `shape`: normal noise for a float dtype, zeros for integers and booleans (token ids,
    sizes, masks: zeros are what a model accepts most often). For checks and timings that have no data; the
    values barely move a CPU's time."""
    kind = np.dtype(dtype)
    value = rng.standard_normal(list(shape)) if np.issubdtype(kind, np.floating) else np.zeros(list(shape))
    return value.astype(kind)
