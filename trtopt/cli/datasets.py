"""Shared CLI glue: a dataset shaped for a plan's or a model's inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtopt.plan import Plan


def dataset_for_plan(plan: Plan, sources: Sequence[str], *, count: int | None = None) -> Any:
    """Inputs read and preprocessed as the plan stores it."""
    from trtopt.data import InputInfo, PreprocessSpec, load_dataset

    infos = [InputInfo(t.name, tuple(t.shape), t.dtype) for t in plan.inputs]
    spec = PreprocessSpec.from_dict(plan.preprocess) if plan.preprocess else None
    return load_dataset(list(sources) if len(sources) > 1 else sources[0], infos, spec, count=count)
