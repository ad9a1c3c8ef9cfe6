"""Serving a plan beyond one Python process.

`trtopt.serving.triton` exports a plan as a Triton Inference Server model repository (TensorRT plans as
`tensorrt_plan` models; CPU plans as `onnxruntime_onnx` models or as Python-backend models that run the
plan through `trtopt.Engine`). `docs/serving.md` explains how such repositories scale out.
"""
