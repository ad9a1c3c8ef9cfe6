"""The plan file: one self-describing, integrity-checked container for a built model.

`format.py` reads and writes it, `schema.py` bounds its header, `metadata.py` types what it records,
`verification.py` is the record of its self-check and the tolerances that record is judged by (the backends
return it and the header stores it, so it lives here, below them), `signing.py` signs it where a key is set.
"""

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
