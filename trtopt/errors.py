"""Error types.

`TrtoptError` is the one base for *user* mistakes (a bad file, a wrong shape, a missing optional
dependency). Its message is a short paragraph that says what was wrong, where, what was received,
what was expected and how to fix it; the CLI prints it and exits non-zero without a traceback.
Anything else that escapes is an internal bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class TrtoptError(Exception):
    """A problem with the user's input or environment that the user can fix."""

    exit_code = 2

    def __init__(self, what: str, *, fix: str | None = None) -> None:
        self.what = what
        self.fix = fix
        super().__init__(what if fix is None else f"{what} {fix}")


class ModelError(TrtoptError):
    """The ONNX model cannot be read or is not something trtopt can work on."""


class ShapeError(TrtoptError):
    """An input shape is missing, dynamic where it must be concrete, or does not match."""


def format_shape(dims: Iterable[object] | None) -> str:
    """A shape as messages show it, e.g. `[batch, 3, ?, 224]`: sizes as numbers, a named dynamic
    dimension by its name, any other unknown size (None, -1, an empty name) as `?`."""
    if dims is None:
        return "unknown"
    return "[" + ", ".join(_dim_text(d) for d in dims) + "]"


def format_dims(dims: Iterable[object] | None, *, unknown: str | None = None) -> str:
    """A shape as tables and `--shapes` examples show it, e.g. `1x3xHxW`: the dimensions of `format_shape`
    joined by x; `unknown`, when given, replaces every dimension that is not a size (a name, None, -1)."""
    if dims is None:
        return "?"
    texts = [_dim_text(d) if unknown is None or _dim_text(d).isdigit() else unknown for d in dims]
    return "x".join(texts) or "scalar"


def _dim_text(dim: object) -> str:
    if isinstance(dim, int) or type(dim).__name__.startswith(("int", "uint")):  # numpy integers too
        return str(int(dim)) if int(dim) >= 0 else "?"  # type: ignore[call-overload]
    return dim if isinstance(dim, str) and dim else "?"


class DataError(TrtoptError):
    """Calibration or inference data cannot be read or does not fit the model."""


class UnreadableFileError(DataError):
    """A data file exists in the data set but cannot be decoded (or would cost too much to: `trtopt.data.limits`);
    data sets skip it and say why."""


class CalibrationError(TrtoptError):
    """Calibration failed or a calibration cache does not match the model."""


class PlanError(TrtoptError):
    """A plan file is corrupt, truncated, from another format version or for a missing backend."""


class BackendUnavailableError(TrtoptError):
    """An optional backend (TensorRT, CUDA) is not installed or has no device."""

    exit_code = 3


class InputsRejected(TrtoptError):
    """ONNX Runtime refused to run a model on the inputs it was given (values, not shapes or dtypes)."""


class UnknownNameError(TrtoptError):
    """A registry lookup (pass, method, backend, preset) named something that does not exist."""

    def __init__(self, kind: str, name: str, valid: list[str] | tuple[str, ...]) -> None:
        super().__init__(
            f"Unknown {kind} {name!r}.",
            fix=f"Valid {kind}{'es' if kind.endswith('s') else 's'}: {', '.join(sorted(valid))}.",
        )
        self.kind = kind
        self.name = name
        self.valid = tuple(valid)
