"""The TensorRT backend's options: what `trtopt build` may tell TensorRT's builder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from trtopt.backend.base import BackendOptions
from trtopt.config_checks import MAX_BATCH, check_int, check_threads
from trtopt.errors import TrtoptError


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
        check_int(self.batch, "--batch", 1, MAX_BATCH, example="8")
        check_int(self.workspace_mib, "--workspace", 1, 2**30, example="4096")
        check_int(self.optimization_level, "--opt-level", 0, 5, example="3")
        check_threads(self.threads)
        if self.timing_cache is not None and Path(self.timing_cache).is_dir():
            raise TrtoptError(
                f"--timing-cache {str(self.timing_cache)!r} is a folder.",
                fix="Give a file path, e.g. --timing-cache build/timing.cache (created if missing).",
            )
