"""INT8 calibration: streaming histograms of |x|, TensorRT's entropy threshold search, caches.

One short flow::

    calibration = calibrate(model, batches, tensors, CalibConfig(method="entropy"))
    save_cache("model.calib.json", calibration)                 # or format="tensorrt" / "onnxruntime"
    amax = calibration.amax                                     # tensor -> T; scale = T / 127

`histogram.py` and `thresholds.py` are pure numpy (no model); `collect.py` runs the model on ONNX
Runtime; `cache.py` reads and writes trtopt, TensorRT and ONNX Runtime calibration files; `plot.py`
draws a histogram with its thresholds (needs matplotlib). The methods register into `METHODS`, declared in
`config.py` beside `CalibConfig`; `ranges.py` says which tensors an activation bounds (their observed maximum
is kept).
"""

from trtopt.calib.cache import (
    CACHE_FORMATS,
    check_cache_matches,
    load_cache,
    save_cache,
    trt_scale_from_hex,
    trt_scale_to_hex,
)
from trtopt.calib.calibration import Calibration, CalibTimings
from trtopt.calib.collect import (
    BatchSource,
    CalibProgress,
    CollectedHistograms,
    CollectedRanges,
    calibrate,
    collect_histograms,
    collect_ranges,
)
from trtopt.calib.config import CalibConfig
from trtopt.calib.fingerprint import model_fingerprint
from trtopt.calib.histogram import (
    HistogramCollector,
    RangeCollector,
    TensorHistogram,
    TensorRange,
    histogram_from_values,
)
from trtopt.calib.plot import plot_histogram
from trtopt.calib.thresholds import (
    METHODS,
    QMAX,
    ZERO_AMAX,
    compute_thresholds,
    entropy_bins,
    kl_divergences,
    threshold,
)

__all__ = [
    "CACHE_FORMATS",
    "METHODS",
    "QMAX",
    "ZERO_AMAX",
    "BatchSource",
    "CalibConfig",
    "CalibProgress",
    "CalibTimings",
    "Calibration",
    "CollectedHistograms",
    "CollectedRanges",
    "HistogramCollector",
    "RangeCollector",
    "TensorHistogram",
    "TensorRange",
    "calibrate",
    "check_cache_matches",
    "collect_histograms",
    "collect_ranges",
    "compute_thresholds",
    "entropy_bins",
    "histogram_from_values",
    "kl_divergences",
    "load_cache",
    "model_fingerprint",
    "plot_histogram",
    "save_cache",
    "threshold",
    "trt_scale_from_hex",
    "trt_scale_to_hex",
]
