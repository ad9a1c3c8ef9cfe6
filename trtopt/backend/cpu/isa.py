"""Which integer dot-product instructions this CPU has, and what that means for ONNX Runtime's INT8 kernels.

ONNX Runtime's MLAS kernels multiply uint8 activations by int8 weights (u8s8). How they accumulate
depends on the instruction set, and that decides whether a plan computes what its Q/DQ graph says:

- AVX-512 VNNI / AVX-VNNI (`vpdpbusd`) and AMX (`tdpbusd`) add each u8*s8 product straight into 32-bit
  sums: exact for every uint8 / int8 value.
- AVX2 and AVX-512 without VNNI use `vpmaddubsw`, which adds *pairs* of u8*s8 products into a
  *saturating int16* first. Two products of 255 * 127 reach 64770 > 32767, so large activations meeting
  large weights of one sign are clipped silently (ONNX Runtime's quantization guide, "when and why to use
  reduce_range"; Intel's intrinsics guide for `_mm256_maddubs_epi16`). The same kernels are exact when
  either side is 7-bit: 127 * 127 * 2 = 32258, or 255 * 64 * 2 = 32640, both below 32767.

So weights within +-64 (`SEVEN_BIT_MAX`: a 7-bit grid, `trtopt.search.seven_bit`, with room for the GEMM routing's
q - 1) run the fast u8s8 kernels exactly on every x86 CPU; `tools/bench_conv_kernels.py` measures the kernels per
conv on the CPU it runs on.
"""

from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path

import numpy as np

# From the most capable down; the first one whose flags are all present names the class.
ISA_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("amx", ("amx_int8",)),
    ("avx512_vnni", ("avx512_vnni",)),
    ("avx_vnni", ("avx_vnni",)),
    ("avx512", ("avx512bw",)),
    ("avx2", ("avx2",)),
)
# Classes whose u8s8 kernels accumulate in 32 bits, and classes known to saturate pairs in int16.
EXACT_U8S8 = frozenset({"amx", "avx512_vnni", "avx_vnni"})
SATURATING_U8S8 = frozenset({"avx512", "avx2"})
SEVEN_BIT_MAX = 64  # the largest |weight| a saturating u8s8 pair sum holds exactly: 255 * 64 * 2 = 32640 <= 32767


def fits_seven_bits(q: np.ndarray) -> bool:
    """Whether int8 weights `q` meet uint8 activations exactly in every CPU's u8s8 kernels (`SEVEN_BIT_MAX`)."""
    return bool(q.size == 0 or np.abs(q.astype(np.int16)).max() <= SEVEN_BIT_MAX)


def isa_from_flags(flags: set[str]) -> str:
    """The ISA class of a CPU with these /proc/cpuinfo flags ("other" when none of the classes match)."""
    return next((name for name, needed in ISA_CLASSES if all(f in flags for f in needed)), "other")


@lru_cache(maxsize=1)
def cpu_isa(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This machine's ISA class: one of ISA_CLASSES' names, "other" (an x86 CPU below AVX2), or the
    machine name (e.g. "arm64") where /proc/cpuinfo is not there or has no x86 flags."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.machine().lower() or "unknown"
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    if flags is None:
        return platform.machine().lower() or "unknown"
    return isa_from_flags(set(flags))
