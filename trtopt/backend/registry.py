"""The backends' registry: each backend registers itself here where it is defined (`trtopt/backend/<name>/backend.py`),
and `trtopt.backend` imports every backend module once, so that listing the registry lists them all. The
registry is its own module so that the arrows run one way: a backend imports this and `base`, never the package
that imports it."""

from __future__ import annotations

from typing import Any

from trtopt.backend.base import Backend
from trtopt.registry import Registry

BACKENDS: Registry[Backend[Any]] = Registry("backend")
