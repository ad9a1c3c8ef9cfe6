"""Shared CLI glue: a dataset shaped for a plan's or a model's inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtopt.plan import Plan


def dataset_for_plan(
    plan: Plan, sources: Sequence[str], *, count: int | None = None, overrides: Any = None
) -> Any:
    """Inputs read and preprocessed as the plan stores it, with the fields `overrides` (a
    `trtopt.data.PreprocessOverrides`, from --mean, --std, ...) replaced."""
    from trtopt.data import InputInfo, PreprocessSpec, load_dataset, spec_for_input

    infos = [InputInfo(t.name, tuple(t.shape), t.dtype) for t in plan.inputs]
    spec = PreprocessSpec.from_dict(plan.preprocess, where="the plan's preprocessing") if plan.preprocess else None
    if overrides and len(infos) > 1:
        from trtopt.data.overrides import refuse_for_multi_input

        refuse_for_multi_input([info.name for info in infos])
    if overrides and len(infos) == 1:
        info = infos[0]
        if spec is None:  # a plan built for arrays: the flags describe the whole recipe over the default preset
            spec = spec_for_input(info.shape, info.dtype, name=info.name, overrides=overrides)
        else:
            spec = overrides.apply(spec, name=info.name, input_shape=info.shape)
    return load_dataset(list(sources) if len(sources) > 1 else sources[0], infos, spec, count=count)
