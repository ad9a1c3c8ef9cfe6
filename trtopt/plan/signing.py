"""Keyed plans: an HMAC-SHA256 trailer that only the holder of a key can write, so a forged plan is refused.

A plan's sha256 proves the file is whole, not who wrote it: anyone who edits the header (the preprocessing, the
labels) can recompute every checksum (issue #46: a photo classified "bison" became "class 347" that way). With
`TRTOPT_PLAN_KEY` set when a plan is built, the plan ends with a signature trailer,

    b"TRTOSIGN"   8 bytes
    HMAC-SHA256(key, everything before the trailer)   32 bytes

and with `TRTOPT_PLAN_KEY` set where it is loaded, only plans whose trailer that key verifies are read; unsigned
plans are refused. Without the variable, plans are written and read as before (a trailer, when present, is
ignored). The key is any string; keep it out of the plan's folder.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from trtopt.errors import PlanError

KEY_VARIABLE = "TRTOPT_PLAN_KEY"
SIGNATURE_MAGIC = b"TRTOSIGN"
_SIGNATURE_SIZE = len(SIGNATURE_MAGIC) + 32


def plan_key() -> bytes | None:
    key = os.environ.get(KEY_VARIABLE)
    return key.encode() if key else None


def signed(data: bytes, key: bytes | None) -> bytes:
    """`data` (a whole plan) with its signature trailer when there is a key."""
    if key is None:
        return data
    return data + SIGNATURE_MAGIC + hmac.new(key, data, hashlib.sha256).digest()


def unsigned(data: bytes, key: bytes | None, where: str) -> bytes:
    """The plan without its trailer, after checking the trailer against `key` (None: not checked)."""
    has_trailer = len(data) > _SIGNATURE_SIZE and data[-_SIGNATURE_SIZE:-32] == SIGNATURE_MAGIC
    plan = data[:-_SIGNATURE_SIZE] if has_trailer else data
    if key is None:
        return plan
    fix = (f"Rebuild the plan with {KEY_VARIABLE} set to the key this service trusts, or unset {KEY_VARIABLE} "
           "to load plans without checking who wrote them.")
    if not has_trailer:
        raise PlanError(f"{where} is not signed, and {KEY_VARIABLE} asks for signed plans.", fix=fix)
    expected = hmac.new(key, plan, hashlib.sha256).digest()
    if not hmac.compare_digest(expected, data[-32:]):
        raise PlanError(f"{where} has a signature that {KEY_VARIABLE} does not verify: it was changed after "
                        "it was signed, or signed with another key.", fix=fix)
    return plan
