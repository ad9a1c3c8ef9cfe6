"""Calibration's compiled loops (trtopt/calib/kernels_numba.py, auto_kernels_numba.py) are compiled once and
loaded from numba's disk cache by every later process, without adding cache files; with no writable cache
directory they still compile, with a warning."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parents[1]

# A tiny calibration in a fresh process: a histogram (the counting loop and its merge), an MSE threshold
# search and every scoring loop of `--method auto`; then, per compiled function, which signatures numba
# compiled (cache misses) and which it loaded from its cache (hits).
TINY_CALIBRATION = """
import json
import numpy as np
from trtopt.calib import CalibConfig, auto_kernels, histogram_from_values
from trtopt.calib import auto_kernels_numba, kernels_numba
from trtopt.calib.thresholds import mse_threshold

values = (np.random.default_rng(0).standard_normal((2, 3, 50)) * 3).astype(np.float32)
hist = histogram_from_values(values, 256)
mse_threshold(hist, CalibConfig(method="mse", num_bins=256))
stacked = auto_kernels.quantize_stack(values, np.array([1.0, 4.0]))
auto_kernels.squared_errors(stacked, values)
auto_kernels.elementwise_errors("Mul", stacked, values, values, scored_first=False)
auto_kernels.sum_of_squares(values)
loops = {kernels_numba: ("count_abs", "merge_bins"),
         auto_kernels_numba: ("quantize", "squared", "elementwise", "apply", "energy", "mse")}
functions = {f"{module.__name__}.{name}": getattr(module, name) for module, names in loops.items() for name in names}
print(json.dumps({name: [len(f.stats.cache_misses), len(f.stats.cache_hits)] for name, f in functions.items()}))
"""


def _calibrate_in_new_process(cache_dir: Path) -> dict[str, list[int]]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", TINY_CALIBRATION], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    counts: dict[str, list[int]] = json.loads(done.stdout.strip().splitlines()[-1])
    return counts


def _cache_files(cache_dir: Path) -> list[str]:
    return sorted(path.name for path in cache_dir.rglob("*") if path.suffix in (".nbi", ".nbc"))


# Two fresh processes, the first compiling every loop: about 7 s on two shared cores.
def test_a_second_process_loads_every_loop_from_the_cache_and_adds_no_file(tmp_path: Path) -> None:
    first = _calibrate_in_new_process(tmp_path)
    files = _cache_files(tmp_path)
    assert all(misses >= 1 for misses, _ in first.values()), first  # every loop ran, and compiled
    assert len([name for name in files if name.endswith(".nbi")]) == len(first), files  # one index each

    second = _calibrate_in_new_process(tmp_path)
    assert all(misses == 0 for misses, _ in second.values()), second
    # The loops called from Python come from the cache; the ones they call are linked into their code.
    called_only_by_loops = {"trtopt.calib.kernels_numba.merge_bins", "trtopt.calib.auto_kernels_numba.apply"}
    assert all(hits >= 1 for name, (_, hits) in second.items() if name not in called_only_by_loops), second
    assert _cache_files(tmp_path) == files


def test_a_loop_still_compiles_without_a_writable_cache(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """numba raises RuntimeError at decoration when no cache directory can be written (numba/core/caching.py);
    `compiled` falls back to an uncached compile and says how to get a cache."""
    from trtopt.calib import kernels_numba

    njit = kernels_numba.numba.njit

    def njit_without_cache(*args, **options):  # type: ignore[no-untyped-def]
        if options.get("cache"):
            raise RuntimeError("cannot cache function 'twice': no locator available for file 'x.py'")
        return njit(*args, **options)

    def twice(values: np.ndarray) -> float:
        return float(values.sum() * 2)

    monkeypatch.setattr(kernels_numba.numba, "njit", njit_without_cache)
    monkeypatch.setattr(kernels_numba, "_warned", [])
    with caplog.at_level(logging.WARNING, logger=kernels_numba.__name__):
        loop = kernels_numba.compiled(twice)
    assert loop(np.arange(4.0)) == 12.0
    assert "NUMBA_CACHE_DIR" in caplog.text and "no locator available" in caplog.text
