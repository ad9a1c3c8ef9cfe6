"""CPU backend: ONNX Runtime's INT8 kernels (QLinearConv / MatMulInteger) on the lowered Q/DQ graph.

File roles as in every backend: ``backend.py`` (the registered object: status, quantisation defaults,
options, encodings to try, kernel report), ``options.py`` (`CpuOptions`: --cpu-gemm, --cpu-encoding),
``builder.py`` (Q/DQ ONNX -> lowered plan section, kernel counts), ``runner.py`` (plan -> outputs), plus
``isa.py`` (which dot-product instructions this CPU has) and ``lowering.py`` (the encodings).
"""
