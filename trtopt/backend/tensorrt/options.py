"""The TensorRT backend's options: what `trtopt build` may tell TensorRT's builder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from trtopt.backend.base import BackendOptions
from trtopt.config_checks import MAX_BATCH, check_int


@dataclass(frozen=True)
class TensorRTOptions(BackendOptions):
    """None means TensorRT's default.

    - `batch` (--batch): the largest batch of a plan whose batch dimension is dynamic (the optimisation
      profile's max and opt; `trtopt.backend.tensorrt.builder.profiles_for`);
    - `workspace_mib` (--workspace): the builder's workspace memory pool limit;
    - `timing_cache` (--timing-cache): a timing cache file to reuse and update;
    - `optimization_level` (--opt-level): `builder_optimization_level`, 0-5 (TensorRT's default: 3);
    - `sparsity` (--sparsity): let TensorRT use 2:4 sparse weights (`BuilderFlag.SPARSE_WEIGHTS`);
    - `threads`: the builder's `max_threads`.
    """

    backend: ClassVar[str] = "tensorrt"
    batch: int | None = None
    workspace_mib: int | None = None
    timing_cache: Path | None = None
    optimization_level: int | None = None
    sparsity: bool = False
    threads: int | None = None

    def __post_init__(self) -> None:
        from trtopt.backend.tensorrt.builder import EngineOptions, validate_options

        check_int(self.batch, "--batch", 1, MAX_BATCH, example="8")
        validate_options(EngineOptions(workspace_mib=self.workspace_mib, timing_cache=self.timing_cache,
                                       optimization_level=self.optimization_level, threads=self.threads))  # fmt: skip
