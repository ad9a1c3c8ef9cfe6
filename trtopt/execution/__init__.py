"""Model execution on ONNX Runtime: drives calibration, the CPU backend and every numeric test."""

from trtopt.execution.ort_session import OrtSession, run_model

__all__ = ["OrtSession", "run_model"]
