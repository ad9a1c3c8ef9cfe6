"""Load a user's detection decoder, `path/to/file.py:function`, for detectors trtopt cannot decode itself.

The function receives one batch's outputs as ``{output name: array}`` (the same dict for the FP32 model and
the plan) and returns, per image of the batch, a tuple ``(boxes, scores, classes)``: boxes [K, 4] as
x1, y1, x2, y2 in any fixed unit, scores [K], integer classes [K], after its own thresholding and NMS.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from trtopt.errors import TrtoptError
from trtopt.metrics.task import Decoder

_FIX = (
    "Pass --decoder path/to/file.py:function, where function(outputs) returns one (boxes, scores, classes) per image."
)


def load_decoder(spec: str) -> tuple[Decoder, str]:
    """(the function, a display name) for `file.py:function`; a TrtoptError says what is wrong."""
    path_text, sep, function = spec.rpartition(":")
    if not sep or not path_text or not function:
        raise TrtoptError(f"--decoder {spec!r} names no function.", fix=_FIX)
    path = Path(path_text)
    if not path.is_file():
        raise TrtoptError(f"--decoder: no such file {str(path)!r}.", fix=_FIX)
    module_name = f"trtopt_user_decoder_{abs(hash(path.resolve()))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise TrtoptError(f"--decoder: {str(path)!r} is not a Python file.", fix=_FIX)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # the user's module: report its error (or its exit) in one paragraph
        sys.modules.pop(module_name, None)
        raise TrtoptError(f"--decoder: importing {str(path)!r} failed: {_described(exc)}", fix=_FIX) from None
    decoder = getattr(module, function, None)
    if not callable(decoder):
        raise TrtoptError(f"--decoder: {str(path)!r} has no function {function!r}.", fix=_FIX)
    name = f"{path.name}:{function}"
    return _guarded(decoder, name), name


def _guarded(decoder: Decoder, name: str) -> Decoder:
    """`decoder`, with a `sys.exit` inside it turned into an error: a decoder that exits must not end `compare`
    with status 0 and no report (issue #46)."""

    def call(outputs):  # type: ignore[no-untyped-def]
        try:
            return decoder(outputs)
        except SystemExit as exc:
            raise TrtoptError(f"--decoder {name} called {_described(exc)} instead of returning its boxes; "
                              "compare wrote no report.", fix=_FIX) from None

    return call


def _described(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"
