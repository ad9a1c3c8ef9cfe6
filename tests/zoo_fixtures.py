"""The `zoo_model` fixture: one cached real model of the zoo (tools/zoo.py) per test, or a skip with the reason.

    from zoo_fixtures import ZooCase, zoo_model  # noqa: F401  (the fixture)

    def test_something(zoo_model: ZooCase) -> None:       # runs once per catalog model
        ...zoo_model.path, zoo_model.model.task, zoo_model.calib...

    @pytest.mark.parametrize("zoo_model", ["ppocr-v4-det"], indirect=True)
    def test_one(zoo_model: ZooCase) -> None: ...

A model that is not in the cache skips its test with "zoo cache empty: run python tools/zoo.py fetch";
nothing is downloaded by the tests themselves.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tools") not in sys.path:
    sys.path.insert(0, str(ROOT / "tools"))

import zoo  # noqa: E402

ZOO_NAMES = tuple(m.name for m in zoo.catalog())


@dataclass(frozen=True)
class ZooCase:
    model: zoo.ZooModel
    path: Path  # the cached .onnx
    calib: Path  # its calibration data: a folder of images or an .npz (zoo.calib_path)


def zoo_case(name: str) -> ZooCase:
    """The cached model `name`, or a skip that says how to fill the cache."""
    path = zoo.cached_path(name)
    if path is None:
        pytest.skip(f"zoo cache empty: run python tools/zoo.py fetch ({name} is not in {zoo.cache_dir()})")
    model = zoo.model_named(name)
    return ZooCase(model, path, zoo.calib_path(model))


@pytest.fixture(params=ZOO_NAMES)
def zoo_model(request: pytest.FixtureRequest) -> ZooCase:
    return zoo_case(request.param)
