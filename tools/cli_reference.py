"""Write docs/CLI.md from the argparse definitions, so the CLI reference always matches `--help`.

    python tools/cli_reference.py            # rewrite docs/CLI.md
    python tools/cli_reference.py --check    # exit 1 if docs/CLI.md is stale (run by the tests)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "CLI.md"


def render() -> str:
    os.environ["COLUMNS"] = "100"  # stable wrapping, whatever the terminal
    from trtopt.cli.main import COMMANDS, build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = [
        "# trtopt command-line reference",
        "",
        "Generated from the argparse definitions by `python tools/cli_reference.py`; identical to `--help`.",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
    ]
    for name in COMMANDS:
        parts += ["", f"## trtopt {name}", "", "```text", subparsers.choices[name].format_help().rstrip(), "```"]
    return "\n".join(parts) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not TARGET.is_file() or TARGET.read_text() != text:
            print(f"{TARGET} is out of date: run python tools/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    TARGET.parent.mkdir(exist_ok=True)
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
