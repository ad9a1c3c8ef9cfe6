"""FP32 builds of ONNX's own conformance models: every node test case that the installed onnx generates in memory
(`onnx.backend.test.case.node.collect_testcases`, about 1,900 one-op models at opsets 1-27 with the inputs and
the outputs they must give), built as `trtopt build model.onnx --verify-data inputs.npz` would build them.

    python tools/onnx_conformance.py [--workers 2] [--out results.jsonl] [--int8] [--only NAME-PART] [--every N]

Each case ends in one of: `ok` (the plan gives the expected outputs), `wrong` (a plan was written whose outputs
differ: a trtopt bug), `bug` (an exception that is not a TrtoptError: a traceback for the user), `refused` (a
TrtoptError, which says why), `skipped` (inputs or outputs that are not tensors: sequences, optionals, strings)
or `not_ort` (ONNX Runtime itself does not give the expected outputs on the model as it is, so trtopt cannot be
judged there). The counts and the refusals' first lines are printed; `bug` and `wrong` cases are listed.
Nothing is downloaded: the cases come with onnx. docs/holdout.md (rounds 6 and 7) has the results.

`--int8` builds the cases with a layer trtopt quantises (Conv, ConvTranspose, Gemm, MatMul, Attention) and float inputs
INT8 instead: calibrated on the case's inputs and 7 noisy copies, verified on the inputs themselves. There `ok`
means a verified plan was written; it is not `wrong` when INT8 moves the outputs, so the printout adds the
plans' cosine with the expected outputs (the worst output of each case).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import re
import sys
import tempfile
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any

import numpy as np


def _close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> bool:
    if want.dtype.kind in "fc":
        return bool(np.allclose(got, want, rtol=max(rtol, 1e-4), atol=max(atol, 1e-5), equal_nan=True))
    return bool(np.array_equal(got, want))


QUANTISED = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Attention"}  # Attention: MatMuls in its function body


def _calibration(feeds: dict[str, np.ndarray], model: Any) -> dict[str, np.ndarray]:
    """The case's inputs and 7 copies with 10% noise on the float ones, as `--calib` arrays: stacked along a
    new sample axis, or joined along the inputs' shared first dimension where trtopt reads that as a batch."""
    from trtopt.data.arrays import has_batch_axis
    from trtopt.data.inputs import InputInfo

    rng = np.random.default_rng(0)
    copies = [feeds] + [
        {k: (v + rng.standard_normal(v.shape) * 0.1 * (np.std(v) or 1)).astype(v.dtype) if v.dtype.kind == "f" else v
         for k, v in feeds.items()} for _ in range(7)
    ]  # fmt: skip
    dims = {i.name: [d.dim_value or -1 for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    batched = has_batch_axis([InputInfo(k, tuple(dims.get(k, v.shape)), v.dtype) for k, v in feeds.items()])
    join = np.concatenate if batched and all(v.ndim for v in feeds.values()) else np.stack
    return {k: join([c[k] for c in copies]) for k in feeds}


def _cosine(got: np.ndarray, want: np.ndarray) -> float:
    a, b = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norms) if norms else float(np.array_equal(a, b))


def _run_case(case: Any, int8: bool = False) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    import trtopt
    from trtopt.build import BuildConfig, build_plan
    from trtopt.data.config import DataConfig
    from trtopt.errors import TrtoptError
    from trtopt.plan import write_plan

    inputs, outputs = case.data_sets[0]
    weights = {t.name for t in case.model.graph.initializer}
    names = [i.name for i in case.model.graph.input if i.name not in weights]
    tensors = all(isinstance(a, np.ndarray) and a.dtype.kind in "fiub" for a in inputs)
    if len(inputs) != len(names) or not tensors or not all(isinstance(o, np.ndarray) for o in outputs):
        return {"name": case.name, "result": "skipped"}
    feeds = dict(zip(names, inputs, strict=True))
    quantisable = QUANTISED & {n.op_type for n in case.model.graph.node} and all(a.dtype.kind == "f" for a in inputs)
    if int8 and not quantisable:
        return {"name": case.name, "result": "skipped"}
    try:
        session = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
        reference = session.run(None, feeds)
        if not all(_close(np.asarray(r), o, case.rtol, case.atol) for r, o in zip(reference, outputs, strict=True)):
            return {"name": case.name, "result": "not_ort"}
    except Exception:  # noqa: BLE001 - ONNX Runtime's own refusal
        return {"name": case.name, "result": "not_ort"}
    with tempfile.TemporaryDirectory() as folder:
        model, data, plan = (os.path.join(folder, f) for f in ("model.onnx", "inputs.npz", "plan.engine"))
        onnx.save(case.model, model)
        np.savez(data, **feeds)
        sources: tuple[str, ...] = ()
        if int8:
            sources = (os.path.join(folder, "calib.npz"),)
            np.savez(sources[0], **_calibration(feeds, case.model))
        try:
            config = BuildConfig(int8=int8, data=DataConfig(sources=sources, verify_sources=(data,)))
            result = build_plan(model, config)
            write_plan(result.plan, plan)
            got = list(trtopt.Engine.load(plan).infer(feeds).values())
        except TrtoptError as exc:
            return {"name": case.name, "result": "refused", "why": str(exc).splitlines()[0][:200]}
        except Exception:  # noqa: BLE001 - what the campaign looks for
            return {"name": case.name, "result": "bug", "why": traceback.format_exc()[-600:]}
    if int8:
        cosine = min((_cosine(g, o) for g, o in zip(got, outputs, strict=True)), default=1.0)
        return {"name": case.name, "result": "ok", "cosine": cosine}
    same = len(got) == len(outputs) and all(
        g.shape == o.shape and _close(g, o, case.rtol, case.atol) for g, o in zip(got, outputs, strict=True)
    )
    return {"name": case.name, "result": "ok" if same else "wrong"}


def _every(cases: list[Any], n: int) -> list[Any]:
    """The first case of each op (the set of op types its model holds: an `_expanded` case's function body is a
    set of its own) and every nth after it, in onnx's order."""
    seen: collections.Counter[frozenset[str]] = collections.Counter()
    kept = []
    for case in cases:
        ops = frozenset(node.op_type for node in case.model.graph.node)
        if seen[ops] % n == 0:
            kept.append(case)
        seen[ops] += 1
    return kept


def _quiet() -> None:
    import onnxruntime

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    onnxruntime.set_default_logger_severity(3)  # its warnings about onnx's expanded functions: errors only


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write one JSON line per case here")
    parser.add_argument("--int8", action="store_true", help="INT8 builds of the cases with a quantised layer")
    parser.add_argument("--only", metavar="TEXT", help="only the cases whose name contains TEXT (e.g. fp16)")
    parser.add_argument("--every", type=int, default=1, metavar="N",
                        help="a quicker sweep: of each op's cases (the op types of its model), the first and every "
                        "Nth after it (the test suite runs --every 2: every op, half the cases)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.every < 1:
        parser.error(f"--every takes 1 or more (every case: 1), not {args.every}")
    _quiet()
    from onnx.backend.test.case import node

    cases = _every([c for c in node.collect_testcases(None) if not args.only or args.only in c.name], args.every)
    with ProcessPoolExecutor(args.workers, initializer=_quiet) as pool:
        records = list(pool.map(partial(_run_case, int8=args.int8), cases, chunksize=8))
    if args.out:
        with open(args.out, "w") as out:
            out.writelines(json.dumps(r) + "\n" for r in records)
    counts = collections.Counter(r["result"] for r in records)
    print(f"{len(records)} cases: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    reasons = collections.Counter(re.sub(r"'[^']*'|/\S+|\d+", "_", r["why"])[:110] for r in records
                                  if r["result"] == "refused")  # fmt: skip
    for reason, n in reasons.most_common(8):
        print(f"  refused {n:4d}: {reason}")
    cosines = sorted(r["cosine"] for r in records if "cosine" in r)
    if cosines:
        print(f"  INT8 plans' worst-output cosine with the expected outputs: median {np.median(cosines):.4f}, "
              f"{sum(c >= 0.99 for c in cosines)} of {len(cosines)} at 0.99 or more, lowest {cosines[0]:.4f}")
    for r in records:
        if r["result"] in ("bug", "wrong"):
            print(f"{r['result'].upper()} {r['name']}: {r.get('why', '')}")
    return 1 if counts["bug"] or counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
