"""The licence the package declares is the one it ships: pyproject's `license = "Apache-2.0"` (an SPDX
expression, PEP 639) with the verbatim Apache License 2.0 at the repository root, named in `license-files`
so setuptools copies it into every sdist and wheel."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# SHA-256 of the Apache License 2.0 as the ASF publishes it (https://www.apache.org/licenses/LICENSE-2.0.txt;
# the same bytes as Debian's /usr/share/common-licenses/Apache-2.0 and onnx's dist-info LICENSE).
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_license_file_is_the_verbatim_apache_2_0_text() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert text.splitlines()[1].strip() == b"Apache License" and b"END OF TERMS AND CONDITIONS" in text
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256, "LICENSE differs from the Apache-2.0 text"


def test_pyproject_declares_apache_2_0_and_ships_the_license_file() -> None:
    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib in its standard library")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0"
    assert "LICENSE" in project["license-files"]
    assert all((ROOT / pattern).is_file() for pattern in project["license-files"])
