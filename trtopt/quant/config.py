"""Quantisation options. None / empty means default."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trtopt.calib.thresholds import ZERO_AMAX
from trtopt.errors import TrtoptError

DEFAULT_MIN_CHANNELS = 16  # layers narrower than this stay float unless the backend or the user says otherwise


@dataclass(frozen=True)
class QuantConfig:
    """Where INT8 may go.

    `exclude` holds node names or op types to keep in floating point. `keep_first_last` keeps the first
    and the last quantisable layer in float (common for accuracy). Layers with fewer than
    `min_channels` input or output channels stay float: TensorRT gains nothing on them (DESIGN.md,
    "leave tiny layers in floating point") and their error is large relative to their cost. On the CPU
    backend too: quantising EfficientNet-Lite0's 3-channel stem bought no measurable speed and cost
    about two points of top-1 agreement with FP32 (measured with tools/bench_accuracy.py). `None` means
    the backend's default (its `quant_config`; `plan_quantization` alone reads `None` as
    `DEFAULT_MIN_CHANNELS`): OpenVINO's INT8 stem conv is worth 10% of a ResNet's time
    (`trtopt.backend.openvino`).

    `quantize_outputs` also puts Q/DQ on every consumer edge of a quantised layer's output, after the
    activations in `output_folds` that follow it (those the backend's INT8 kernel applies before it
    quantises its output), unless every consumer is a layer kept float (`placement._output_sites`). The
    TensorRT form leaves outputs to TensorRT; a backend whose kernels need them
    says so in its `quant_config` (the CPU backend: `trtopt.backend.cpu.backend`).

    `integer_pools` (the CPU backend's `quant_config`) lets pooling run on the integer grid between INT8 layers
    (`trtopt.quant.placement._pool_sites`): a MaxPool whose input and output are both quantised shares one
    threshold (max pooling commutes with rounding, so it is exact), a thin stem conv that feeds only a MaxPool
    stays INT8 under `min_channels`, and a GlobalAveragePool that feeds an INT8 layer reads and writes quantised
    tensors (with the residual Add before it).

    `integer_gates` (the CPU backend's `quant_config`) lets element-wise gates between INT8 layers run on the
    integer grid (`trtopt.quant.gates`): SiLU's Sigmoid and Mul, a squeeze-excite block's pool, Sigmoid and gate
    Mul, where their inputs are quantised already (or are per-channel vectors) and INT8 layers read their outputs.
    `integer_hard_swish` (the CPU backend's `quant_config` too) adds MobileNetV3's HardSwish, HardSigmoid gates and
    global ReduceMean pools to them (the CPU lowering writes them as integer ops: `trtopt.backend.cpu.hard_gates`),
    the gate of an equalised HardSwish too; `integer_gates` builds leave SiLU out of the gated equalisation.

    `float_leading_depthwise` keeps a depthwise conv float when its input comes from a float layer (or
    the graph input), so that INT8 would start at it. `None` means the backend's default (its
    `quant_config`; `plan_quantization` alone reads `None` as off).

    `bias_correction` subtracts the mean output shift that rounding a layer's weights to INT8 causes from
    its bias (`trtopt.quant.bias`); placement ignores it, the quantisation stage of a build reads it.
    `auto_exclude` keeps the fewest most sensitive layers float when an output's cosine with FP32 stays below
    0.99 on calibration samples (`trtopt.search.sensitivity`; also read by the build's quantisation stage).
    `equalize` evens out the channel ranges of the tensors that feed depthwise convs (directly, through a
    ReLU, or through a HardSwish/SiLU gate: `trtopt.quant.equalize.GATED_IN_BUILDS`; then scalar affine maps
    too) before calibration, an
    exact float rewrite (`trtopt.quant.equalize`; read by the build's quantisation stage). trtopt's calibration
    cache records the gains with the thresholds, and a build from it redoes the same rewrite
    (`trtopt.quant.equalize_cache`); a cache without them (older, or another tool's) builds without it.

    `seven_bit_layers` puts the named layers' weights on a 7-bit grid (per-channel max / 63), which a CPU whose
    u8s8 kernels saturate runs exactly at their speed (`trtopt.backend.cpu.isa`); `seven_bit_search` lets the
    build choose those layers among the dense INT8 ones by measurement (`trtopt.search.seven_bit`). The CPU backend
    asks for the search where its encoding needs it (its `quant_config`). `pair_bounded_weights` keeps the other
    dense layers' weights 8-bit but widens the grid of each output channel whose neighbouring same-sign weights could
    saturate those kernels' int16 pair sums (`trtopt.quant.pairs`): exact there too, at nearly 8-bit fidelity.

    `min_amax` is the smallest activation threshold a Q/DQ pair gets. The default, `ZERO_AMAX` (scale 2**-14),
    keeps every scale representable in FP16 (TensorRT); the CPU and OpenVINO backends, whose scales are float32,
    set `FP32_AMAX` (`trtopt.calib.thresholds`), so a tensor whose whole range is tiny keeps its own grid.

    `widen_thin` asks the build for a second Q/DQ model with the thin layers `min_channels` and
    `float_leading_depthwise` keep float in INT8, for the backend's speed check to time beside the plan
    (`trtopt.quant.thin`; the CPU backends set it where the user set neither).

    `float_ops` are op types the backend's runtime has no INT8 kernel for: they stay float, with that reason,
    rather than carry Q/DQ their runtime would dequantise again (the CPU backend: ONNX Runtime has no INT8
    ConvTranspose).
    """

    exclude: tuple[str, ...] = ()
    keep_first_last: bool = False
    min_channels: int | None = None
    quantize_residual: bool = True
    quantize_outputs: bool = False
    output_folds: frozenset[str] = frozenset()
    float_leading_depthwise: bool | None = None
    integer_pools: bool = False
    integer_gates: bool = False
    integer_hard_swish: bool = False
    bias_correction: bool = True
    auto_exclude: bool = True
    equalize: bool = True
    seven_bit_layers: tuple[str, ...] = ()
    seven_bit_search: bool = False
    pair_bounded_weights: bool = False
    min_amax: float = ZERO_AMAX
    widen_thin: bool = False
    float_ops: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        channels = self.min_channels
        if channels is not None and (isinstance(channels, bool) or not isinstance(channels, int)
                                     or not 0 <= channels <= 2**31 - 1):
            raise TrtoptError(
                f"--min-channels (QuantConfig.min_channels) is {channels!r}; expected a whole number of at least 0.",
                fix="Pass e.g. --min-channels 16 (the default), or 0 to quantise layers of every width.",
            )
        if isinstance(self.exclude, str) or not all(isinstance(e, str) for e in self.exclude):
            raise TrtoptError(
                f"--exclude (QuantConfig.exclude) is {self.exclude!r}; expected a tuple of node names or op types.",
                fix="Pass e.g. exclude=('Gemm', 'conv_12').",
            )
        object.__setattr__(self, "exclude", tuple(self.exclude))
        object.__setattr__(self, "seven_bit_layers", tuple(self.seven_bit_layers))
        object.__setattr__(self, "output_folds", frozenset(self.output_folds))

    @property
    def channels(self) -> int:
        """`min_channels`, `None` read as `DEFAULT_MIN_CHANNELS`."""
        return DEFAULT_MIN_CHANNELS if self.min_channels is None else self.min_channels

    @classmethod
    def covering(cls, configs: Sequence[QuantConfig]) -> QuantConfig:
        """A config whose placement quantises every tensor any of `configs` may quantise: no exclusions,
        the smallest `min_channels`, and every kind of site any of them asks for."""
        return cls(
            min_channels=min((c.channels for c in configs), default=DEFAULT_MIN_CHANNELS),
            quantize_residual=any(c.quantize_residual for c in configs),
            quantize_outputs=any(c.quantize_outputs for c in configs),
            output_folds=frozenset().union(*(c.output_folds for c in configs)),
            integer_pools=any(c.integer_pools for c in configs),
            integer_gates=any(c.integer_gates for c in configs),
            integer_hard_swish=any(c.integer_hard_swish for c in configs),
            float_leading_depthwise=False,
        )
