"""Draw a tensor's |x| histogram (log y) with its thresholds as vertical lines, to PNG.

matplotlib is optional (``pip install trtopt[plot]``) and imported only here, when a plot is asked for;
the figure is rendered with the Agg canvas directly, so no GUI backend or global state is touched.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trtopt.calib.histogram import TensorHistogram
from trtopt.errors import BackendUnavailableError
from trtopt.frontend.writer import write_atomic

_COLOURS = ("tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink")


def plot_histogram(
    hist: TensorHistogram,
    path: str | os.PathLike[str],
    thresholds: Mapping[str, float] | None = None,
    *,
    title: str | None = None,
    dpi: int = 120,
) -> Path:
    """Write a PNG of `hist` with one dashed line per threshold (label -> T); returns the path.

    The y axis is logarithmic, so the tail that decides a threshold stays visible next to the bulk; the
    legend gives each T, its ratio to amax, and the share of values it clips.
    """
    figure_cls, canvas_cls = _matplotlib()
    figure = figure_cls(figsize=(8, 4.5), dpi=dpi)
    canvas = canvas_cls(figure)
    axes = figure.add_subplot(1, 1, 1)
    edges = hist.edges
    counts = hist.counts.astype(np.float64)
    axes.stairs(np.where(counts > 0, counts, np.nan), edges, fill=True, alpha=0.6, label="count of |x|")
    axes.set_yscale("log")
    axes.set_xlim(0.0, max(hist.amax, 1e-30) * 1.02)
    axes.set_xlabel("|x|")
    axes.set_ylabel("values per bin")
    for colour, (label, t) in zip(_COLOURS * 4, (thresholds or {}).items(), strict=False):
        axes.axvline(t, color=colour, linestyle="--", linewidth=1.2, label=_describe(label, t, hist))
    axes.set_title(title or f"{hist.name}: {hist.count:,} values, amax {hist.amax:.4g}, {hist.num_bins} bins")
    axes.legend(loc="upper right", fontsize="small")
    figure.tight_layout()
    buffer = io.BytesIO()
    canvas.print_png(buffer)
    return write_atomic(path, buffer.getvalue())


def _describe(label: str, t: float, hist: TensorHistogram) -> str:
    clipped_bins = int(np.ceil(t / hist.bin_width)) if hist.bin_width > 0 else hist.num_bins
    clipped = int(hist.counts[min(clipped_bins, hist.num_bins):].sum())
    share = clipped / hist.count if hist.count else 0.0
    ratio = t / hist.amax if hist.amax > 0 else 1.0
    return f"{label}: T={t:.4g} ({ratio:.2f} amax, clips {share:.3%})"


def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise BackendUnavailableError(
            "Plotting calibration histograms needs matplotlib, which is not installed.",
            fix="pip install trtopt[plot]",
        ) from None
    return Figure, FigureCanvasAgg
