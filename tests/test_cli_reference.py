"""docs/CLI.md (linked from README) matches the real parser: every command and option is documented."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from trtopt.cli.main import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_every_command_and_option_is_in_the_reference() -> None:
    text = (ROOT / "docs" / "CLI.md").read_text()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in COMMANDS:
        assert f"## trtopt {name}" in text
        section = text.split(f"## trtopt {name}", 1)[1].split("\n## ", 1)[0]
        for action in sub.choices[name]._actions:
            for flag in action.option_strings:
                assert flag in section, f"{name} {flag} missing from docs/CLI.md: run python tools/cli_reference.py"


def test_help_works_without_optional_dependencies() -> None:
    """`trtopt --help` and every `trtopt CMD --help` answer without importing TensorRT, CUDA or matplotlib."""
    code = (
        "import sys\n"
        "from trtopt.cli.main import main, COMMANDS\n"
        "for cmd in [None, *COMMANDS]:\n"
        "    try:\n"
        "        main([cmd, '--help'] if cmd else ['--help'])\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, cmd\n"
        "heavy = {'tensorrt', 'cuda', 'matplotlib', 'onnxruntime'} & {m.split('.')[0] for m in sys.modules}\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_python_dash_m_runs_the_command_line():
    """`python -m trtopt` is the `trtopt` command: its --help lists every command, and a bad command fails."""
    proc = subprocess.run([sys.executable, "-m", "trtopt", "--help"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in COMMANDS:
        assert name in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "trtopt", "no-such-command"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)  # fmt: skip
    assert bad.returncode != 0
