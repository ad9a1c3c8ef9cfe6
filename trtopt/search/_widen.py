"""Wider thresholds: the sensitivity search's last stage (`trtopt.search.sensitivity`), when keeping layers float
leaves the plan short of its aim.

`--method auto` scores each tensor's threshold candidates by the error they add to the layers that read it
(`trtopt.calib.auto`), one layer deep. Where a threshold clips, that local score can understate what the clipped
values do further on. On the zoo's layout-cdla (PicoDet, hardswish; 16 held-out pages, avx2, Q/DQ run as float math,
the search's 4 float layers kept; throw-away scripts, docs/zoo.md round 14) quantising one activation alone moves a
class-score output's cosine by up to 0.0033, and the largest single errors came from thresholds auto had clipped to
a fraction of the tensor's range: `hardswish_76.tmp_0` at 0.857 of 5.38 (percentile), `hardswish_93.tmp_0` at 9.68
of 25.4 (mse). Raising the first to 1.5x its threshold cut its own error from 0.0022 to 0.0012. The error left after
the float layers is spread thinly (the 48 most harmful layers all float reach only 0.9925 on calibration pages), so
no further float layer pays `MIN_GAIN`, but a few wider thresholds do, and they cost nothing at run time.

The stage tries, for the input activations of the ranked candidate layers the search did not keep float (up to
`CANDIDATES`, 48), thresholds `FACTORS` times wider, capped at the tensor's calibrated maximum, each on top of the
layers kept float. It then runs the search's greedy stage over those moves, with the same rules: a move must gain
`MIN_GAIN` (or reach the aim), the confirmation samples must not refute it, and the stage stops at the aim.
It keeps the best move per tensor. A move is a key of the search's trial sets (`key`), so trials, their cache
and the confirmation treat it as they treat a layer. The plan applies the moves to the calibrated thresholds
(`thresholds`). The calibration, and any cache written from it, keeps the thresholds as calibrated.

Measured (avx2, `tools/bench_zoo.py --models layout-cdla --count 32 --eval-count 64`, the default build): the
search kept the same 4 layers float and then widened thresholds, 0.9875 -> 0.9892 on the search pages; on 64
held-out pages the worst output went 0.9893 -> 0.9912 and box F1 94.2% -> 94.5%, and the build took 479 -> 644 s.
The moves come last, so every plan the float layers bring to the aim is built as before. Trying them first
(they cost no run time, where a float layer does) is not measured.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import onnx_graphsurgeon as gs

from trtopt.search._greedy import REASON as FLOAT_REASON

MARK = " @amax "  # a move's key: tensor MARK threshold (no tensor name holds it)
FACTORS = (1.5, 2.25)  # how much wider a move's threshold is than the calibrated one (at most the maximum)
REASON = "threshold widened by sensitivity analysis"


def key(tensor: str, amax: float) -> str:
    return f"{tensor}{MARK}{amax!r}"


def layers(chosen: Mapping[str, str]) -> dict[str, str]:
    """The layers kept float among the search's `chosen` keys (-> its reason), without the moves."""
    return {name: why for name, why in chosen.items() if MARK not in name}


def shown(name: str) -> str:
    """A trial key as the record names it: a layer as it is, a move as "tensor's threshold -> T"."""
    tensor, mark, amax = name.partition(MARK)
    return f"{tensor}'s threshold -> {float(amax):.4g}" if mark else name


def split(keys: Sequence[str]) -> tuple[list[str], dict[str, float]]:
    """(the layers kept float, {tensor: threshold}) of a trial set; a later move of a tensor wins."""
    floats, moves = [], {}
    for name in keys:
        tensor, mark, amax = name.partition(MARK)
        if mark:
            moves[tensor] = float(amax)
        else:
            floats.append(name)
    return floats, moves


def widened(calibration: Any, moves: Mapping[str, float]) -> Any:
    """`calibration` with the moved thresholds (a `trtopt.calib.Calibration`; itself when nothing moves)."""
    from dataclasses import replace

    return replace(calibration, amax={**calibration.amax, **moves}) if moves else calibration


def moves_for(graph: gs.Graph, calibration: Any, layers: Sequence[str], kept: Collection[str]) -> list[str]:
    """The moves to try: for each of `layers` (ranked) not in `kept`, each calibrated activation it reads
    whose threshold clips (below the maximum seen), `FACTORS` times wider, capped at that maximum."""
    nodes = {n.name: n for n in graph.nodes}
    ranges = calibration.ranges  # the maximum seen, where the histograms are kept (else the threshold: no move)
    moves: list[str] = []
    seen: set[str] = set()
    for layer in layers:
        node = nodes.get(layer)
        if node is None or layer in kept:
            continue
        for tensor in node.inputs:
            name = tensor.name
            amax, top = calibration.amax.get(name), ranges.get(name)
            if name in seen or amax is None or top is None or amax >= top:  # weights have no threshold
                continue
            seen.add(name)
            wider = sorted({min(float(amax) * f, float(top)) for f in FACTORS})
            moves.extend(key(name, value) for value in wider)
    return moves


def best_per_tensor(moves: Sequence[str]) -> list[str]:
    """The first move of each tensor in `moves` (ordered best first)."""
    first: dict[str, str] = {}
    for move in moves:
        first.setdefault(move.partition(MARK)[0], move)
    return list(first.values())


def thresholds(chosen: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The moves among the search's `chosen` keys (-> its reason): tensor -> {"to": threshold, "why": ...}."""
    found: dict[str, dict[str, Any]] = {}
    for name, why in chosen.items():
        tensor, mark, amax = name.partition(MARK)
        if mark:
            found[tensor] = {"to": float(amax), "why": f"{REASON}{why.removeprefix(FLOAT_REASON)}"}
    return found
