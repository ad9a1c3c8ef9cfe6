"""The data stage's configs: where samples come from, and how images become inputs. None means default.

`DataConfig` feeds calibration (and a build's verification samples); `PreprocessConfig` says how images
are turned into input tensors, and the spec it resolves to is stored in the plan
(`trtopt.data.samples.preprocess_spec_for`). Both are validated on construction; the errors name the
CLI flag that sets each field.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from trtopt.config_checks import check_int
from trtopt.data.overrides import PreprocessOverrides
from trtopt.errors import TrtoptError

DEFAULT_BATCH = 8
MAX_CALIB_BATCH = 4096


@dataclass(frozen=True)
class DataConfig:
    """Calibration data: `sources` (--calib) are folders or files of images, .npy or .npz; `count`
    (--calib-count) uses the first N samples (None: all); `batch` (--calib-batch) samples per batch;
    `workers` (--workers) threads that decode and preprocess ahead of inference (None: up to 4, at most
    the CPUs); `verify_sources` (--verify-data) the samples a build checks its plan on instead (an FP32 build
    too: a model whose integer inputs are sizes or indices refuses the random inputs it checks on otherwise).
    A single path may be given as a string."""

    sources: tuple[str, ...] = ()
    count: int | None = None
    batch: int = DEFAULT_BATCH
    workers: int | None = None
    verify_sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", _paths(self.sources, "--calib", "sources", "calib_data/"))
        object.__setattr__(self, "verify_sources", _paths(self.verify_sources, "--verify-data", "verify_sources",
                                                          "feeds.npz"))  # fmt: skip
        check_int(self.count, "--calib-count", 1, 2**31 - 1, example="500")
        check_int(self.batch, "--calib-batch", 1, MAX_CALIB_BATCH, optional=False, example="8")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 1):  # fmt: skip
            raise TrtoptError(f"--workers is {self.workers}.", fix="Give at least 1 decoding thread, or leave it out.")

    @property
    def source(self) -> str | list[str]:
        """`sources` as `trtopt.data.load_dataset` takes them: one path, or a list of several."""
        return list(self.sources) if len(self.sources) > 1 else self.sources[0]


def _paths(given: object, flag: str, name: str, example: str) -> tuple[str, ...]:
    paths = (given,) if isinstance(given, (str, os.PathLike)) else given
    if not isinstance(paths, Sequence) or not all(isinstance(s, (str, os.PathLike)) for s in paths):
        raise TrtoptError(
            f"{flag} (DataConfig.{name}) is {given!r}; expected paths of folders or files.",
            fix=f"Pass e.g. DataConfig({name}=({example!r},)).",
        )
    return tuple(str(s) for s in paths)


@dataclass(frozen=True)
class PreprocessConfig:
    """How images become the model's input: `preset` (--preset, a name in `trtopt.data.PRESETS`; None: the
    model's sidecar `<model>.json` if present, else what its exporter wrote into the model file (Ultralytics'
    task and size: `trtopt.data.embedded_recipe`), else ImageNet's, raw for uint8 inputs), then the fields
    `overrides` gives one by one (--resize, --mean, ...) on top of it."""

    preset: str | None = None
    overrides: PreprocessOverrides = field(default_factory=PreprocessOverrides)

    def __post_init__(self) -> None:
        from trtopt.data.preprocess import PRESETS

        if self.preset is not None:
            PRESETS.get(self.preset)  # an unknown name lists the valid ones
        if not isinstance(self.overrides, PreprocessOverrides):
            raise TrtoptError(
                f"PreprocessConfig.overrides is a {type(self.overrides).__name__}; expected PreprocessOverrides.",
                fix="Pass e.g. PreprocessConfig(overrides=PreprocessOverrides(mean=(0.5,), std=(0.5,))).",
            )
