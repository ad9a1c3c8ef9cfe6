"""The plan file: one self-describing, integrity-checked container for a built model."""

from trtopt.plan.format import FORMAT_VERSION, MAGIC, Plan, TensorSpec, read_plan, write_plan
from trtopt.plan.metadata import METADATA_VERSION, OptimizerRecord, PlanMetadata, QuantRecord, SparsityRecord

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "METADATA_VERSION",
    "OptimizerRecord",
    "Plan",
    "PlanMetadata",
    "QuantRecord",
    "SparsityRecord",
    "TensorSpec",
    "read_plan",
    "write_plan",
]
