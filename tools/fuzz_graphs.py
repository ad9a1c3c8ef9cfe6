"""Long property-based fuzzing campaigns on random CNN graphs; every failure saved as a minimal reproduction.

    python tools/fuzz_graphs.py --examples 2000 --seed 1 --out fuzz-out/ [--minutes 15] [--properties a,b]
    python tools/fuzz_graphs.py --replay fuzz-out/001_int8_plan_valid/model.onnx

Graphs come from trtopt.zoo.random_graphs through hypothesis, and the properties from tests/graph_fuzz.py
(the ones tests/test_graph_fuzz.py runs in CI). A failure is identified by its signature (property,
error type, message with numbers and names blanked). The first time a signature fails, hypothesis shrinks
that graph, and the shrunk model is saved as `<out>/<n>_<property>/model.onnx` with its calibration
samples (`calib.npy`) and a note (`note.json`, `note.md`: property, error, traceback, blocks). Later
examples with a known signature count as passing, so the campaign goes on looking for new failures
with a fresh seed after each one. `<out>/summary.json` holds the counts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graph_fuzz import PROPERTIES, BuildVariant, Case, build_variants, random_graphs  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402

from trtopt.zoo.random_graphs import RandomGraph  # noqa: E402

ROUND_EXAMPLES = 100  # examples per hypothesis run before a fresh seed


@dataclass
class Failure:
    prop: str
    signature: str
    error: str
    trace: str
    graph: RandomGraph
    variant: BuildVariant


@dataclass
class Campaign:
    properties: list[str]
    deadline: float
    examples: int = 0
    calls: int = 0
    known: dict[str, int] = field(default_factory=dict)  # signature -> examples that hit it
    last: Failure | None = None

    def check(self, graph: RandomGraph, variant: BuildVariant) -> None:
        """The hypothesis test body: run the properties in order, raise on a failure not seen before."""
        self.calls += 1
        if time.monotonic() > self.deadline:
            return
        failure = run_properties(graph, variant, self.properties)
        if failure is None:
            return
        if failure.signature in self.known:
            self.known[failure.signature] += 1
            return
        self.last = failure
        raise AssertionError(failure.error)


def run_properties(graph: RandomGraph, variant: BuildVariant, properties: list[str]) -> Failure | None:
    case = Case(graph.model, variant)
    for name in properties:
        try:
            PROPERTIES[name](case)
        except Exception as exc:  # noqa: BLE001 (any exception is a finding)
            message = f"{type(exc).__name__}: {exc}"
            return Failure(name, signature(name, exc), message, traceback.format_exc(), graph, variant)
    return None


def signature(prop: str, exc: Exception) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    first = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", first)
    first = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", first)
    return f"{prop} | {type(exc).__name__} | {first[:160]}"


def run_round(campaign: Campaign, seed: int, max_examples: int) -> Failure | None:
    @hypothesis_seed(seed)
    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(random_graphs(), build_variants())
    def body(graph: RandomGraph, variant: BuildVariant) -> None:
        campaign.check(graph, variant)

    campaign.last = None
    before = campaign.calls
    with contextlib.suppress(AssertionError):  # a new failure, shrunk: campaign.last holds it
        body()
    campaign.examples += campaign.calls - before
    return campaign.last


def save(failure: Failure, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(failure.graph.model, folder / "model.onnx")
    np.save(folder / "calib.npy", Case(failure.graph.model).samples)
    note = {
        "property": failure.prop,
        "signature": failure.signature,
        "error": failure.error,
        "blocks": failure.graph.blocks,
        "build": asdict(failure.variant),
        "nodes": len(failure.graph.model.graph.node),
        "replay": f"python tools/fuzz_graphs.py --replay {folder / 'model.onnx'}",
    }
    (folder / "note.json").write_text(json.dumps(note, indent=2) + "\n")
    blocks = "\n".join(f"- {b}" for b in failure.graph.blocks)
    (folder / "note.md").write_text(
        f"# {failure.prop} fails\n\n{failure.error}\n\n## Graph ({note['nodes']} nodes)\n\n{blocks}\n\n"
        f"Build options: {note['build']}\n\n"
        f"## Replay\n\n    {note['replay']}\n\n## Traceback\n\n```\n{failure.trace}```\n"
    )


def campaign_main(args: argparse.Namespace) -> int:
    properties = args.properties.split(",") if args.properties else list(PROPERTIES)
    unknown = sorted(set(properties) - set(PROPERTIES))
    if unknown:
        sys.exit(f"unknown properties {unknown}; valid: {', '.join(PROPERTIES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    campaign = Campaign(properties, deadline=start + 60 * args.minutes)
    saved: list[dict[str, object]] = []
    round_seed = args.seed
    while campaign.examples < args.examples and time.monotonic() < campaign.deadline:
        failure = run_round(campaign, round_seed, min(ROUND_EXAMPLES, args.examples - campaign.examples))
        round_seed += 1
        if failure is None:
            continue
        folder = out / f"{len(saved) + 1:03d}_{failure.prop}"
        save(failure, folder)
        campaign.known[failure.signature] = 1
        nodes = len(failure.graph.model.graph.node)
        saved.append({"folder": folder.name, "signature": failure.signature, "nodes": nodes})
        print(f"[{time.monotonic() - start:6.0f}s] {folder.name}: {failure.error.splitlines()[0][:150]}", flush=True)
    summary = {
        "seed": args.seed,
        "properties": properties,
        "test_calls": campaign.examples,  # generated examples plus the shrinker's replays
        "seconds": round(time.monotonic() - start, 1),
        "failures": [{**s, "hits": campaign.known[str(s["signature"])]} for s in saved],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 1 if saved else 0


def replay_main(path: Path, properties: list[str]) -> int:
    """Check a saved model with the build options in its note.json (defaults when there is none)."""
    graph = RandomGraph(onnx.load(path), [f"replayed from {path}"])
    note = path.with_name("note.json")
    variant = BuildVariant(**json.loads(note.read_text())["build"]) if note.is_file() else BuildVariant()
    failure = run_properties(graph, variant, properties)
    print("all properties hold" if failure is None else f"{failure.prop}: {failure.error}\n{failure.trace}")
    return 0 if failure is None else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=1000, help="test calls in all (shrinking included)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="fuzz-out", help="folder for reproductions and summary.json")
    parser.add_argument("--minutes", type=float, default=15.0, help="stop after this long")
    parser.add_argument("--properties", help=f"comma-separated subset of: {', '.join(PROPERTIES)}")
    parser.add_argument("--replay", type=Path, help="check one saved model.onnx against the properties")
    args = parser.parse_args()
    if args.replay:
        return replay_main(args.replay, args.properties.split(",") if args.properties else list(PROPERTIES))
    return campaign_main(args)


if __name__ == "__main__":
    sys.exit(main())
