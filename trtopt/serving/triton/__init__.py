"""Triton Inference Server model repositories from plans (`trtopt export plan.engine --triton REPO/`).

- `export`: writes REPO/NAME (configuration, model files, labels), checked before it is put in place;
- `config`: what a plan becomes in `config.pbtxt`; `pbtxt`: protobuf text format, written and read back;
- `check`: the checks on a written model folder;
- `python_model`: the Python-backend model that runs the plan through `trtopt.Engine` inside the server.

Imports stay light (no ONNX Runtime, no tritonclient) so `trtopt export --help` works without them.
"""

from __future__ import annotations

from trtopt.serving.triton.config import TritonOptions
from trtopt.serving.triton.export import ExportReport, export_triton

__all__ = ["ExportReport", "TritonOptions", "export_triton"]
