"""The plan file: one self-describing, integrity-checked container for a built model."""

from trtopt.plan.format import FORMAT_VERSION, MAGIC, Plan, TensorSpec, read_plan, write_plan

__all__ = ["FORMAT_VERSION", "MAGIC", "Plan", "TensorSpec", "read_plan", "write_plan"]
