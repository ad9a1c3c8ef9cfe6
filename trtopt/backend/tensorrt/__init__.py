"""The TensorRT backend: ONNX (Q/DQ, strongly typed) -> serialised engine, and a runner for it.

File roles as in every backend: ``backend.py`` (the registered object: status, quantisation defaults,
options and profiles, lenient verification, profile report), ``options.py`` (`TensorRTOptions`: --batch,
--workspace, --timing-cache, --opt-level, --sparsity), ``detect.py`` (is TensorRT usable here, and why
not), ``builder.py`` (ONNX -> plan sections), ``runner.py`` (plan -> outputs), plus ``cuda.py`` (checked
cuda-bindings calls); device pointers come from the backend-neutral ``trtopt/execution/device_arrays.py``.
Nothing here imports `tensorrt` or `cuda` at module import time; each entry point does, behind
`detect.require()`.

Written against the TensorRT 11 Python API reference and the "Migrating from TensorRT 10.x to 11.x"
guide (docs.nvidia.com/deeplearning/tensorrt/11.x/api/migration/...); TensorRT 10 is also accepted.
"""
