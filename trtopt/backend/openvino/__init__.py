"""OpenVINO backend: OpenVINO's CPU plugin running trtopt's Q/DQ graph (``pip install "trtopt[openvino]"``).

File roles as in every backend: ``backend.py`` (the registered object), ``options.py`` (`OpenvinoOptions`:
--ov-form, --ov-streams), ``builder.py`` (Q/DQ ONNX -> plan sections, the compiled model's layer precisions),
``runner.py`` (plan -> outputs, one infer request per thread), ``biases.py`` (the graph the runner compiles: each
conv's bias in the quantiser after it).

Design notes (measured on an AMD EPYC with AVX2 only, no VNNI/AMX, OpenVINO 2026.4.1, 1 thread, EfficientNet-Lite0
demo calibrated on calib_data/; figures from one build each on a shared machine, so +-10% on times):

- **How OpenVINO reads a Q/DQ graph.** Its ONNX frontend turns QuantizeLinear -> DequantizeLinear into
  FakeQuantize, and its low-precision transformations (LPT) move each dequantisation below the next layer so the
  layer reads int8/uint8 and the plugin fuses the requantisation (OpenVINO's "Quantization Scheme" guide). NNCF,
  OpenVINO's own quantizer, marks convolutions, matmuls and elementwise Add/Multiply as taking quantised inputs on
  the CPU (nncf/common/hardware/setups/cpu.py), per-channel symmetric weights, and by default (performance
  preset) symmetric activations. trtopt's CPU placement (`quant_config`: layer outputs quantised after Relu/Clip,
  both inputs of a residual Add quantised) already puts a pair on every such input, so the backend keeps it.
- **Which form runs INT8.** The runtime model (`CompiledModel.get_runtime_model()`, rt_info runtimePrecision)
  says per layer. The CPU backend's lowering with int8 weights (u8s8: uint8 activations, "lowered") ran 48 of 50
  weighted layers in INT8 and the symmetric int8-activation form ("qdq", TensorRT's) 48 too, but slower (0.72x
  FP32's time at batch 8 against 0.61x); the u8u8 encoding (uint8 weights with zero point 128, what the CPU backend
  writes for AVX2) is exact there but 34 of 50 layers fell back to f32 (0.86-0.96x FP32's speed): OpenVINO takes
  weights as int8 only. Layers the summary lists as float: any layer trtopt kept float (the sensitivity search,
  --exclude, --min-channels), plus INT8 layers of the plan OpenVINO runs in f32 on dequantised weights. Those
  were the stride-2 1x1 convs at a ResNet-50 v1 stage's entry (open-nsfw: 6 of 53, branch2a and the projection
  shortcut, `brgconv_avx2_1x1_f32`): OpenVINO's StridesOptimization moves a 1x1 conv's stride up into a max
  pool, and through a DequantizeLinear (by then elementwise Subtract / Multiply) it lands between the Convert
  and the dequantisation, so LPT no longer sees one on the convs' input; NNCF's FakeQuantize stops the move.
  The plan subsamples such a tensor itself after the DequantizeLinear, the convs at stride 1
  (`strides.subsample_strided_pointwise`): 53 of 53 convs u8, the pool u8.
- **Saturation without VNNI.** On AVX2, OpenVINO's u8 x s8 kernels add product pairs into a saturating int16
  (as ONNX Runtime's do: trtopt.backend.cpu.isa): the lowered form's kernels were 0.23-0.35 (relative error)
  from its Q/DQ reference, the qdq form's 0.77, far beyond the build's tolerance. NNCF meets this with its
  overflow fix (7-bit weights, by default on the first layer only). 7-bit dense weights ("lowered-w7": kernels
  0.03 from the reference, exact) cost fidelity: the demo's INT8 reference moved from 0.054 to 0.15 relative
  error to FP32 and the sensitivity search kept 6 layers float (28% of the time at batch 8). A pair only
  saturates when both its weights are large and of one sign (|q0| + |q1| > 128), so where the CPU kind saturates
  the backend writes "lowered-pairs" (`pairs.bound_weight_pairs`): 8-bit weights, an output channel rescaled
  only as far as its largest same-sign neighbouring pair needs (demo: 33 of 49 dense layers touched; all layers
  INT8, reference 0.10 from FP32 against 0.16 with 7-bit weights, kernels 0.041 from it against 0.040), then
  "lowered-w7" should the kernels differ. Depthwise weights stay 8-bit (no pairs: exact on OpenVINO). The demo
  plan now keeps no layer float and is the more faithful (held-out cosine 0.9950 against 0.9932). On VNNI and
  AMX CPUs the lowered form with 8-bit weights is exact, and its grids are the CPU backend's u8s8 plan's.
- **Placement against NNCF's, one difference at a time** (torch-resnet18-opset9 of the corpus, 16 calibration
  photos; each row the plan with that one change, all compiled by OpenVINO and called directly, timed
  interleaved with FP32 on ONNX Runtime and NNCF's model, 15 rounds, medians, three runs on a shared 2-core EPYC
  at load 1.3-2.5). The runtime models (`get_runtime_model()`) of trtopt's plan and NNCF's were the same but
  for the stem: both run every other conv u8 x i8 with the residual Add, Relu and requantisation fused into the
  conv (both quantise the conv output that enters the Add, and its identity input); trtopt's conv carries its
  int32 bias as a separate f32 input (20 tiny f32 Reshape nodes beside the convs), NNCF's folds it.

  | trtopt's plan, one change                    | OpenVINO's runtime model                  | b1 / b8 speed-up  |
  |----------------------------------------------|-------------------------------------------|-------------------|
  | before: 3-channel stem float (min_channels 16) | stem conv + max pool f32, 19 convs u8   | 1.88-1.89x / 1.89-1.94x |
  | **stem conv INT8** (min_channels 1, default) | 20 convs u8, max pool u8 (as NNCF's) | **2.07-2.09x / 2.07-2.14x** |
  | NNCF's model, default preset, same photos    | 20 convs u8                               | 2.07-2.10x / 2.09-2.17x |
  | float bias, not an int32 DequantizeLinear    | the same (the Reshapes stay)              | 1.88x / 1.89x     |
  | Q/DQ on layer inputs only (quantize_outputs off) | the same layer counts                 | 1.88x / 1.95x     |
  | stem INT8 and layer inputs only              | as the stem row                           | 2.07x / 2.16x     |
  | one residual Add input quantised             | +5 f32 Eltwise, +4 FakeQuantize, +4 Reorder | 1.86x / 1.88x   |
  | global pool on the quantised tensor, FC input float | Reduce u8, FullyConnected f32 (i8 weights) | 1.89x / 1.88x |

  So the whole gap was the float stem conv (with the max pool after it): 9-10% of the time. The asymmetric
  uint8 grid of the Add's conv input (zero point 128; NNCF's is symmetric) costs nothing measurable: it is
  folded into the conv's post-ops like NNCF's; the symmetric int8-activation form was slower on the demo
  (above) and is not exact on AVX2. Quantising the stem kept the fidelity (INT8 reference 0.039 relative error
  to FP32 against 0.038, kernels 0.009 from it). On the demo the sensitivity search keeps the 3-channel stem
  float anyway (it lifts the worst output score), but its first depthwise conv now runs INT8: speed the same
  (1.40x / 1.51x against 1.39x / 1.51x), INT8 error to FP32 0.119 instead of 0.140. Trtopt's `Engine` adds
  the copies of its outputs to the compiled model's call: 1.84x against 1.89x at b1, nothing at b8.
- **open-nsfw, the demo and keras-mobilenetv2, one difference at a time** (AMD EPYC, **avx2**, no VNNI, 2 cores
  shared, load 3.8-7.6; OpenVINO 2026.4.1, NNCF 3.4.0, onnxruntime 1.32.0; 16 calibration photos; each plan's
  Q/DQ graph compiled by OpenVINO and called directly, interleaved with FP32 on ONNX Runtime, NNCF's model and
  ORT's quantize_static, 25-40 rounds, medians; speed-up over FP32 at b1 / b8, 1 thread; the rows of one model
  from one run unless marked):

  | model, trtopt's plan                            | OpenVINO's runtime model            | b1 / b8        |
  |-------------------------------------------------|-------------------------------------|----------------|
  | open-nsfw, before                               | 47 convs u8, 6 f32 (stride-2 1x1)   | 1.50x / 1.66x  |
  | open-nsfw, strided 1x1 convs subsampled         | 53 convs u8, 3 max pools u8          | 1.72x / 1.88x  |
  | open-nsfw, NNCF                                 | 53 convs u8                         | 1.71x / 1.91x  |
  | demo, before (7-bit weights, 6 layers float)    | 43 convs u8, 6 f32                  | 1.18x / 1.40x  |
  | demo, pair-bounded 8-bit weights (none float)   | 49 convs u8                         | 1.46x / 1.71x  |
  | demo, ORT quantize_static (cosine 0.93)         |                                     | 1.56x / 1.60x  |
  | demo (2nd run), pair-bounded                    | FullyConnected u8 (jit_gemm_I8)     | 1.31x / 1.67x  |
  | demo (2nd run), and the FC as a 1x1 conv        | 50 convs u8                         | 1.39x / 1.66x  |
  | demo (2nd run), ORT quantize_static             |                                     | 1.35x / 1.63x  |
  | keras-mobilenetv2, pair-bounded                 | 52 convs u8, FullyConnected u8      | 1.34x / 1.68x  |
  | keras-mobilenetv2, and the FC as a 1x1 conv     | 53 convs u8                         | 1.41x / 1.66x  |
  | keras-mobilenetv2, ORT quantize_static          |                                     | 1.32x / 1.48x  |

  Fidelity on 16 held-out photos (demo, first output against FP32): trtopt's plan cosine 0.9950, top-1 100%
  (before: 0.9932, 100%), ORT quantize_static 0.9318 / 88%, NNCF 0.9062 / 100%. What did not matter: the FC in
  f32 instead (slower than its INT8 kernel: 951 against 851 us at b1), CPU pinning, the latency hint, denormals
  (within 2-5%, the noise here); the engine's call costs nothing measurable over the compiled model's. ORT's
  kernels remain the faster at b1 on some runs: what is left is kernel against kernel at one image.
- **The later 5-9% gap to NNCF on ResNet-18** (docs/benchmarks/cpu-runtimes.md: 1.86x / 2.02x against NNCF's
  1.95x / 2.17x, 10 rounds). AMD EPYC, **avx2**, 2 shared cores, OpenVINO 2026.4.1, NNCF 3.4.0, onnxruntime
  1.32.0, numpy 2.4.6; the same 16 calibration photos; FP32 on ONNX Runtime, NNCF's model called as the benchmark
  calls it (`compiled(feeds)`), trtopt's through `Engine`, 1 thread, interleaved, 30-40 rounds, medians of the
  per-round ratios; per-layer perf counters 30-100 rounds, order rotated. What it was made of:
  the runner copied each input into the request's own tensor (`infer` without share_inputs): 1-2% at b1 (the
  same compiled model, 150 rounds: 28.4-28.6 against 28.0 ms), now read in place. A FakeQuantize u8 -> u8 after
  the stem's max pool (trtopt's placement requantises the pool's output to the next conv's grid; NNCF's has no
  quantiser there): 0.07 of 22 ms at b1, 0.8 of 206 ms at b8, now dropped (`requant`). Then the biases: this
  export's conv biases are all zero, so NNCF's convs run with no bias at all (two runtime inputs), while
  trtopt's bias correction gives each a bias (a third input): +0.32 ms over the 20 convs at b1, 1.3% of their
  time (a probe plan without them matched NNCF's counters conv for conv), the price of cutting the INT8 error
  to a third (0.010 relative to FP32 against 0.030 without the correction); where a model's convs have biases
  (open-nsfw) NNCF's carry them the same way (bias input, dequantisation Multiply, FakeQuantize). The FC as a 1x1
  conv wins 0.25-0.33 ms of it back at b1. `Engine`'s non-finite check on the inputs costs about 0.6% at b1 (one
  run; not this backend's). The rest was noise: 10 rounds on a shared machine move a ratio by several per cent.
  Before and after the two changes (the same plans otherwise; runs at load 0.3-1.0, speed-up over FP32):

  | model (runs)          | before: b1 / b8         | after: b1 / b8          | NNCF: b1 / b8           |
  |-----------------------|-------------------------|-------------------------|-------------------------|
  | ResNet-18 (4)         | 1.90-2.01x / 2.04-2.14x | 1.92-2.05x / 2.08-2.11x | 1.96-2.07x / 2.11-2.16x |
  | open-nsfw (2)         | 1.57-1.65x / 1.90-1.91x | 1.60-1.69x / 1.94-1.98x | 1.63-1.71x / 1.93-1.97x |
  | demo (2)              | 1.37-1.39x / 1.71-1.76x | 1.43-1.44x / 1.73-1.77x | 1.16-1.18x / 1.19-1.20x |
  | keras-mobilenetv2 (2) | 1.27x / 1.64-1.68x      | 1.32-1.33x / 1.68-1.71x | 1.15-1.16x / 1.11-1.20x |

  Against NNCF in the same run, ResNet-18 at b1: 0.965-0.994 before, 0.974-0.992 after; at b8 0.96-1.00 both;
  open-nsfw at b1 0.97 before, 0.985-0.99 after, at b8 0.96-0.99 before, 0.99-1.03 after. Fidelity is the same
  (held-out cosine to FP32: ResNet-18 0.99994 before and after, NNCF 0.99982; the demo's and keras-mobilenetv2's
  plans are unchanged graphs; open-nsfw's INT8 error to FP32 at build 0.0004 against 0.0006).
  `tools/bench_cpu_runtimes.py` after (30 rounds, load 0.8-1.3): ResNet-18 1.88x / 2.13x against NNCF's
  1.96x / 2.15x, open-nsfw 1.65x / 2.01x against 1.72x / 1.97x: level at b8, 1-4% behind at b1, where the bias
  costs 1.3% on ResNet-18 and runs of the same pair differ by about as much.
- **The biases, on an AVX-512 VNNI EPYC** (OpenVINO 2026.4.1, 1 thread, ResNet-18 of the corpus, per-layer
  counters of 200 interleaved rounds). The last 1-3% per conv against NNCF's, with the same kernels, was the
  conv's post-operations: trtopt's ran the weights' dequantising Multiply, the bias and the FakeQuantize, NNCF's
  the FakeQuantize alone. LPT folds a dequantising Multiply into the FakeQuantize that reads it, but stops at an
  Add it marks as a conv's bias (`FakeQuantizeTransformation::fuseElementwise`); NNCF's bias, a separate Add,
  ends up in the quantiser's ranges. No standard ONNX form says that (a QuantizeLinear's zero point is an
  integer), so the runner compiles a rewritten graph: the conv without its bias, the pair as OpenVINO's own
  FakeQuantize with the bias subtracted from its input range per channel (`biases.fold_biases`; the stored graph,
  ONNX Runtime's reference, is unchanged, and the build verifies the kernels the runner compiles). Convs 8,841 us
  against NNCF's 8,569 before, 8,612 against 8,590 after (two runs); through `Engine` (300 interleaved calls)
  1.040x -> 1.035x NNCF's time at b1 and 1.049x -> 1.020x on open-nsfw, the demo 3.8% faster at b1. The same
  probe: the runner's
  `infer(inputs, share_inputs=True)` spent ~0.9% of a call in OpenVINO's Python input dispatch, now tensors set
  directly; `Engine`'s non-finite check of the input, read from memory right after the previous call, ~0.7-1%.
  Called as tools/bench_cpu_runtimes.py calls them, interleaved with a 33 ms FP32 run that empties the caches
  (150-300 rounds, per-round ratios, three runs): `Engine` 1.016-1.042x NNCF's time, 1.001-1.027x without that
  check. The check stays: an INT8 plan turns a NaN or infinite input pixel into finite outputs (three plans tried).
- **Stored.** The Q/DQ ONNX (what `trtopt.verify` also runs as the reference) and the runner's settings
  (streams); no compiled blob: compiling the demo takes about 0.3 s, and a blob is tied to the OpenVINO version
  and CPU kind. Float layers run in f32 (`INFERENCE_PRECISION_HINT`), never bf16/fp16 behind the verification's
  back.
"""
