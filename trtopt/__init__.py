"""trtopt: a TensorRT graph optimizer and faithful entropy INT8 calibrator.

ONNX in; fused, calibrated, Q/DQ-quantised plan out; run it on TensorRT 11 or ONNX Runtime's CPU INT8
kernels through one small API::

    engine = trtopt.Engine.load("plan.engine")
    outputs = engine(batch)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtopt._version import __version__
from trtopt.errors import TrtoptError

__all__ = ["Engine", "TrtoptError", "__version__"]

if TYPE_CHECKING:
    from trtopt.engine import Engine


def __getattr__(name: str) -> Any:
    # The runtime pulls in ONNX Runtime; keep `import trtopt` (and `trtopt --help`) light.
    if name == "Engine":
        from trtopt.engine import Engine

        return Engine
    raise AttributeError(f"module 'trtopt' has no attribute {name!r}")
