"""The CLI's argument groups are declared once: `build`, `calibrate` and `optimize` share them, and each
turns into its stage's config with the config's own defaults."""

from __future__ import annotations

import argparse

import pytest

from trtopt.backend import BACKENDS, get_backend
from trtopt.backend.cpu.options import CpuOptions
from trtopt.backend.tensorrt.options import TensorRTOptions
from trtopt.build import BuildConfig
from trtopt.calib import CalibConfig
from trtopt.calib.thresholds import METHODS
from trtopt.cli import args as groups
from trtopt.cli.build_cmd import build_config
from trtopt.cli.main import build_parser
from trtopt.data import DataConfig
from trtopt.passes.config import GraphConfig
from trtopt.quant import QuantConfig
from trtopt.verify import VerifyConfig


def _command(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


@pytest.mark.parametrize(
    ("commands", "flags"),
    [
        (("build", "calibrate", "optimize"), ("--shapes", "--passes")),
        (("build", "calibrate"), ("--calib", "--calib-count", "--calib-batch", "--workers", "--method",
                                  "--no-bounded-max", "--preset", "--mean")),  # fmt: skip
    ],
)
def test_shared_flags_are_one_declaration(commands: tuple[str, ...], flags: tuple[str, ...]) -> None:
    """Same help, same default, same type in every command that takes the flag (one declaration)."""
    for flag in flags:
        actions = [_flags(_command(c))[flag] for c in commands]
        assert len({(a.help, a.default, a.type, a.nargs) for a in actions}) == 1, flag


def test_build_without_flags_is_the_default_config() -> None:
    """A flag left out is None and the config's default applies: defaults are written once, in the configs."""
    args = build_parser().parse_args(["build", "m.onnx", "-o", "p.engine"])
    config = build_config(args)
    defaults = tuple(get_backend(name).options_type() for name in BACKENDS)  # every registered backend's
    assert config == BuildConfig(int8=False, backend_options=defaults)
    assert config.data == DataConfig() and config.calib == CalibConfig() and config.quant == QuantConfig()
    assert config.verify == VerifyConfig() and config.graph == GraphConfig()


def test_every_build_flag_reaches_its_stage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    argv = ["build", "m.onnx", "-o", "p.engine", "--int8", "--calib", "a", "b", "--calib-count", "9",
            "--calib-batch", "4", "--workers", "2", "--method", "percentile", "--no-bounded-max",
            "--save-cache", "c.json", "--exclude", "Gemm", "--keep-first-last", "--min-channels", "4",
            "--no-bias-correction", "--shapes", "x:1x3x8x8", "--shapes", "y:1x2", "--passes", "",
            "--backend", "cpu", "--fp16", "--cpu-gemm", "on", "--cpu-encoding", "u8u8", "--batch", "16",
            "--workspace", "64", "--opt-level", "5", "--sparsity", "--verify-samples", "3",
            "--preset", "tf"]  # fmt: skip
    config = build_config(build_parser().parse_args(argv))
    assert config.data == DataConfig(sources=("a", "b"), count=9, batch=4, workers=2)
    assert config.calib.method == "percentile" and not config.calib.bounded_max and config.calib.save_cache
    assert config.quant == QuantConfig(exclude=("Gemm",), keep_first_last=True, min_channels=4, bias_correction=False)
    assert config.graph == GraphConfig(shapes={"x": (1, 3, 8, 8), "y": (1, 2)}, passes=())  # '': no passes
    assert config.fp16 and config.int8 and config.verify.samples == 3 and config.preprocess.preset == "tf"
    assert config.target().options_for(CpuOptions) == CpuOptions(gemm="on", encoding="u8u8")
    trt = config.target().options_for(TensorRTOptions)
    assert (trt.batch, trt.workspace_mib, trt.optimization_level) == (16, 64, 5)
    assert config.sparsity  # build-wide: the plan records 2:4 layers; TensorRT's options add SPARSE_WEIGHTS


def test_build_can_turn_bounded_max_off_as_calibrate_can() -> None:
    for argv in (["build", "m.onnx", "-o", "p", "--no-bounded-max"], ["calibrate", "m.onnx", "--calib", "d", "-o", "c",
                                                                        "--no-bounded-max"]):  # fmt: skip
        assert not groups.calib_config(build_parser().parse_args(argv)).bounded_max


def test_method_help_lists_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A threshold method registered anywhere appears in `--method` (and is accepted) without touching the CLI."""
    monkeypatch.setitem(METHODS._items, "median-ish", METHODS.get("max"))
    action = _flags(_command("calibrate"))["--method"]
    assert all(name in action.help for name in METHODS.names()) and "median-ish" in action.help
    args = build_parser().parse_args(["build", "m.onnx", "-o", "p", "--method", "median-ish"])
    assert groups.calib_config(args).method == "median-ish"
