"""What the optimiser did travels with the optimised model as JSON in `metadata_props`.

The graph itself stays standard ONNX (TensorRT's parser re-fuses CBR on its own); the metadata says
which passes ran, what they changed and the fusion and concat groups, in the optimiser report's format
(`OptimizeResult.to_dict`), without a side file. trtopt itself recomputes the groups from the graph.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import onnx

if TYPE_CHECKING:
    from trtopt.passes.pipeline import OptimizeResult

METADATA_KEY = "trtopt.optimizer"
FORMAT_VERSION = 2  # 2: the optimiser report's summary (`OptimizeResult.to_dict`) and its groups


def record_metadata(model: onnx.ModelProto, result: OptimizeResult) -> None:
    """Write (or replace) the optimiser's record in `model.metadata_props`."""
    payload = {"version": FORMAT_VERSION, **result.to_dict(details=False), "groups": result.groups_dict()}
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=METADATA_KEY, value=json.dumps(payload, separators=(",", ":")))
