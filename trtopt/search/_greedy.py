"""The sensitivity search's greedy stage (`trtopt.search.sensitivity`, steps 3 to 5): keep the layers (or
threshold moves, `trtopt.search._widen`) that gain most, one at a time, as long as each pays and the confirmation
samples do not refute it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from trtopt.search._objective import Cosines, Figures, gain, lift_words, refuted, worst, worst_mean

NOISE = 2.0  # standard errors of the confirmation samples' paired gain that a refusal must clear
MIN_GAIN = 0.001  # the least rise of the worst cosine that pays for a layer kept float (a tenth of 1 - MIN_COSINE)
REASON = "kept float by sensitivity analysis"  # how the reason of each layer it keeps float begins


@dataclass
class Greedy:
    chosen: dict[str, str]  # layers kept float (and threshold moves, `trtopt.search._widen` keys), in order -> why
    current: Figures  # each output's cosine with `chosen` float
    aim: float
    start: Cosines | None  # the confirmation samples' per-sample cosines before any layer was kept float
    checked: Cosines | None  # ... and with `chosen` float
    refused: dict[str, str]  # layers that gained on the search samples only -> why they stay INT8

    def reached(self) -> bool:
        return worst(self.current) >= self.aim and (self.checked is None or worst_mean(self.checked) >= self.aim)

    def gain(self, trial: Figures) -> float:
        return gain(trial, self.current, self.aim)

    def pays(self, trial: Figures) -> bool:
        """Whether `trial` gains `MIN_GAIN`, or lifts the worst output to the aim (the last step there)."""
        return self.gain(trial) >= MIN_GAIN or worst(trial) >= self.aim > worst(self.current)


def greedy(
    found: Greedy, order: Sequence[str], gains: Mapping[str, Figures], measure: Callable[[Sequence[str]], Figures],
    confirm: Callable[[Sequence[str]], Cosines] | None,
) -> None:  # fmt: skip
    """Keep float (add to `found.chosen`) each layer of `order` in turn that gains `MIN_GAIN` (and that the
    confirmation samples, where given, do not refute), until the aim is reached on both; `gains` holds
    each layer's figures kept float beside `found.chosen` as it was (the round's first trial)."""
    if confirm is not None and order and found.start is None:
        found.start = found.checked = confirm(())
    base = len(found.chosen)
    for layer in order:
        trial = gains[layer] if len(found.chosen) == base else measure((*found.chosen, layer))
        if not found.pays(trial):
            continue
        if confirm is not None and found.checked is not None:
            again = confirm((*found.chosen, layer))
            if refuted(again, found.checked, found.aim, MIN_GAIN, NOISE):  # the search samples only: chance
                was, now = worst_mean(found.checked), worst_mean(again)
                found.refused[layer] = (f"lifts the search samples' cosine to {worst(trial):.4f}, the confirmation "
                                        f"samples' {was:.4f} -> {now:.4f} only")  # fmt: skip
                continue
            found.checked = again
        beside = f"beside the {len(found.chosen)} kept float before it," if found.chosen else "alone"
        found.chosen[layer] = f"{REASON} ({beside} it lifts {lift_words(found.current, trial, found.aim)})"
        found.current = trial
        if found.reached():
            break
