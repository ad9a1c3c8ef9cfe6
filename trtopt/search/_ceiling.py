"""The sensitivity search's first test (`trtopt.search.sensitivity`): can keeping layers float save the plan?

The search keeps float some of its `CANDIDATES` ranked layers; before it tries them one by one (48 trials,
then the greedy stage's and a second round's: 107 trials, 11.5 minutes on 2 avx2 cores for SLANet-plus, a
hold-out table-structure model whose INT8 plan stays at cosine 0.895, docs/holdout.md), one trial keeps all
of them float at once. Were the worst output's cosine monotone in the layers kept float, that trial would
bound every plan the search can make (those keep a subset of the same layers, at most `MAX_SHARE` of the
plan's). It is not quite: a layer's error can cancel another's, so keeping one float can lower the cosine
(PP-OCRv4-det's p2o.Conv.6 alone: 0.9004 -> 0.8986; beside two others it lifts them 0.9893 -> 0.9935).
Hence two guards before the trial is taken as a bound:

- a margin: the search stops only when the trial leaves the worst output below `FLOOR` (0.95, the cosine
  under which the build's verification flags a plan: `trtopt.verify.REFERENCE_MIN_COSINE`), 0.04 below the
  search's aim, four times the error the aim allows and more than the interactions measured on the zoo
  (0.002-0.01). A search that cannot lift the plan there can neither reach its aim nor give a plan the
  verification accepts quietly; one that can (a plan at 0.96 whose candidates reach 0.97) runs as before,
  though it cannot reach the aim: what it buys is still a better plan;
- a second trial where the first falls short: the first `LATER` (24) candidates float, without the rest (what
  a round of the search starts from); the search stops only when that falls short too.

When every INT8 layer is a candidate, all of them float is the FP32 model: no test then (nothing it could
rule out). The trials count among the search's and are measured like them (on the search samples).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trtopt.search._objective import Figures, worst

FLOOR = 0.95  # trtopt.verify.REFERENCE_MIN_COSINE: below it the verification flags the plan


@dataclass(frozen=True)
class Ceiling:
    """The best of the test's trials: how many candidates it kept float, the worst output's cosine then, and
    whether the search stops for it."""

    layers: int
    worst: float
    hopeless: bool

    def to_dict(self) -> dict[str, float | int | bool]:
        return {"layers": self.layers, "worst": self.worst, "hopeless": self.hopeless}

    def describe(self, before: float, aim: float) -> str:
        return (f"with the {self.layers} layers adding the most error kept float at once the worst output score "
                f"on calibration samples is {self.worst:.4f} (INT8 plan: {before:.4f}), below {FLOOR}: no set of "
                f"layers the search can keep float reaches its {aim} aim")  # fmt: skip


def ceiling(
    measure: Callable[[Sequence[str]], Figures], tried: Sequence[str], layers: int, later: int
) -> Ceiling | None:
    """The test of the module doc: `measure(exclude)` as the search's, `tried` its candidates (ranked, most
    error first) out of `layers` INT8 layers, `later` the candidates of the nested second trial. None when
    the candidates are every layer."""
    if len(tried) >= layers:
        return None
    best = Ceiling(len(tried), worst(measure(tuple(tried))), False)
    if best.worst < FLOOR and 0 < later < len(tried):
        half = worst(measure(tuple(tried[:later])))
        best = best if best.worst >= half else Ceiling(later, half, False)
    return Ceiling(best.layers, best.worst, best.worst < FLOOR)
