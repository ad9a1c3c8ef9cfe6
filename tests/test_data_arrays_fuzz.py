""".npz data for any input signature, fuzzed with hypothesis: either trtopt's own `DataError` with a message, or
feeds every model input accepts. Round 5's hold-out (silero-vad's op15 export: a dynamic batch in the middle of
one input, an int64 scalar input) found two paths here that gave a bare numpy scalar or refused good data.

Per input: rank 0 to 3, each size fixed (1 to 3), dynamic or named; per array: one sample or feed, a stack of
them, or a shape that does not fit; float32, float64 or int64 values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtopt.data import InputInfo, load_dataset
from trtopt.data.arrays import has_batch_axis, shapes_from_arrays
from trtopt.errors import DataError

FUZZ = settings(max_examples=80, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))

dims = st.one_of(st.integers(1, 3), st.none(), st.sampled_from(["batch", "seq"]))
signatures = st.lists(st.tuples(st.lists(dims, max_size=3), st.sampled_from(["float32", "int64"])),
                      min_size=1, max_size=3)  # fmt: skip


@st.composite
def arrays_for(draw: Any, signature: list[tuple[list[Any], str]]) -> dict[str, np.ndarray]:
    """One array per input, stacks of one size N (arrays may still not fit: that is part of the test)."""
    n = draw(st.integers(1, 3))
    out = {}
    for i, (shape, dtype) in enumerate(signature):
        concrete = [d if isinstance(d, int) else draw(st.integers(1, 3)) for d in shape]
        form = draw(st.sampled_from(["one", "stack", "stack", "wrong"]))
        if form == "stack":
            concrete = [n, *concrete]
        elif form == "wrong":
            concrete = [*concrete, 2] if draw(st.booleans()) else concrete[:-1] or [5, 5, 5, 5, 5]
        kind = draw(st.sampled_from([dtype, "float64"]))
        out[f"in{i}"] = np.ones(concrete, dtype=kind)
    return out


@FUZZ
@given(data=st.data(), signature=signatures)
def test_any_npz_gives_a_data_error_or_feeds_the_inputs_accept(
    data: Any, signature: list, tmp_path_factory: Any
) -> None:
    infos = [InputInfo(f"in{i}", shape, dtype) for i, (shape, dtype) in enumerate(signature)]
    arrays = data.draw(arrays_for(signature))
    path = Path(tmp_path_factory.mktemp("npz")) / "d.npz"
    np.savez(path, **arrays)
    try:
        dataset = load_dataset(path, infos)
        batches = list(dataset.batches(2))
    except DataError as exc:
        assert str(exc).strip()  # a message, never a traceback from numpy
        return
    feeds_whole = not has_batch_axis(infos)
    for batch in batches:
        for info in infos:
            value = batch.feeds[info.name]
            assert isinstance(value, np.ndarray), (info, type(value))  # not a numpy scalar
            assert value.dtype == info.dtype and value.ndim == len(info.shape)
            fixed = info.shape if feeds_whole else info.shape[1:]
            got = value.shape if feeds_whole else value.shape[1:]
            assert all(w is None or w == g for w, g in zip(fixed, got, strict=True)), (info, value.shape)


@FUZZ
@given(data=st.data(), signature=signatures, feeds=st.booleans())
def test_sizes_read_from_arrays_keep_the_rank_and_every_fixed_size(
    data: Any, signature: list, feeds: bool, tmp_path_factory: Any
) -> None:
    arrays = data.draw(arrays_for(signature))
    path = Path(tmp_path_factory.mktemp("npz")) / "d.npz"
    np.savez(path, **arrays)
    model_dims = {f"in{i}": list(shape) for i, (shape, _) in enumerate(signature)}
    try:
        found = shapes_from_arrays(path, model_dims, feeds=feeds)
    except DataError as exc:
        assert "but the input" in str(exc) and " takes " in str(exc)
        return
    for name, shape in found.items():
        want = model_dims[name]
        assert len(shape) == len(want)
        assert all(not isinstance(w, int) or w == s for w, s in zip(want, shape, strict=True)), (want, shape)
