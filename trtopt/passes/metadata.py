"""Fusion and concat groups travel with the optimised model as JSON in `metadata_props`.

The graph itself stays standard ONNX (TensorRT's parser re-fuses CBR on its own); the metadata tells
the quantizer and the reports what the optimiser decided, without a side file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import onnx

from trtopt.errors import ModelError
from trtopt.passes.groups import ConcatGroup, FusionGroup

if TYPE_CHECKING:
    from trtopt.passes.pipeline import OptimizeResult

METADATA_KEY = "trtopt.optimizer"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class OptimizerMetadata:
    passes: tuple[str, ...]
    fusion_groups: tuple[FusionGroup, ...]
    concat_groups: tuple[ConcatGroup, ...]


def record_metadata(model: onnx.ModelProto, result: OptimizeResult) -> None:
    """Write (or replace) the optimiser's record in `model.metadata_props`."""
    payload = {
        "version": FORMAT_VERSION,
        "passes": [r.name for r in result.reports],
        "fusion_groups": [asdict(g) for g in result.fusion_groups],
        "concat_groups": [asdict(g) for g in result.concat_groups],
    }
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=METADATA_KEY, value=json.dumps(payload, separators=(",", ":")))


def read_metadata(model: onnx.ModelProto) -> OptimizerMetadata | None:
    """The optimiser's record, or None for a model `trtopt optimize` did not write."""
    raw = next((p.value for p in model.metadata_props if p.key == METADATA_KEY), None)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {data.get('version')!r}, expected {FORMAT_VERSION}")
        return OptimizerMetadata(
            passes=tuple(data["passes"]),
            fusion_groups=tuple(
                FusionGroup(g["kind"], tuple(g["nodes"]), g["input"], g["residual"], g["output"])
                for g in data["fusion_groups"]
            ),
            concat_groups=tuple(
                ConcatGroup(g["output"], tuple(g["inputs"]), bool(g["in_place"]))
                for g in data["concat_groups"]
            ),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(
            f"The model's {METADATA_KEY!r} metadata cannot be read ({exc}).",
            fix="Re-run `trtopt optimize` on the original model to regenerate it.",
        ) from None
