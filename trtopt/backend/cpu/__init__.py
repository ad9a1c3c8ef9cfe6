"""CPU backend: ONNX Runtime's INT8 kernels (QLinearConv / MatMulInteger) on the lowered Q/DQ graph."""
