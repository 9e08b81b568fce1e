"""Exact bias of every fixed-row estimator (issue #17): the table in docs/mixture.md.

For each response length (1–3 tokens) and seed, a tiny actor and a different tiny fixed model
(4-token vocabulary, fixed policy at temperature 0.8) enumerate every response; each
estimator's expected gradient over the fixed policy's samples is compared with the on-policy
gradient (``toolgrpo.mixture.bias``). Clip settings are the defaults (ε = 0.2, dual clip 3).
Prints a markdown table of the relative error ‖E[ĝ] − ∇J‖ / ‖∇J‖ (mean and max over seeds) and
writes ``mixture_bias.json``. Seconds on a CPU:

    python benchmarks/mixture_bias.py [--seeds 8] [--top-k 0] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import fmean

from toolgrpo.mixture.bias import ESTIMATORS, scenario

ROOT = Path(__file__).resolve().parents[1]


def table(seeds: int, top_k: int, lengths: tuple[int, ...] = (1, 2, 3)) -> dict:
    rows: dict[str, dict[int, list[float]]] = {e.name: {n: [] for n in lengths} for e in ESTIMATORS}
    ess: dict[int, list[float]] = {n: [] for n in lengths}
    for n in lengths:
        for seed in range(seeds):
            r = scenario(seed, n, fixed_top_k=top_k)
            ess[n].append(r.seq_ess)
            for e in ESTIMATORS:
                rows[e.name][n].append(r.relative_error(e.name))
    return {"rows": rows, "seq_ess": ess, "seeds": seeds, "top_k": top_k}


def markdown(res: dict) -> str:
    lengths = list(res["seq_ess"])
    head = "| estimator (config) | " + " | ".join(f"{n} token(s)" for n in lengths) + " |"
    lines = [head, "|" + "---|" * (len(lengths) + 1)]
    for name, by_len in res["rows"].items():
        cells = [f"{fmean(v):.3f} (max {max(v):.3f})" for v in by_len.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    ess = [f"{fmean(v):.2f}" for v in res["seq_ess"].values()]
    lines.append("| *sequence ESS of the fixed samples* | " + " | ".join(ess) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=0, help="fixed sampler's top-k (0 = off)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    res = table(args.seeds, args.top_k)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "mixture_bias.json" if args.top_k == 0 else f"mixture_bias_topk{args.top_k}.json"
    (out / name).write_text(json.dumps(res, indent=1))
    print(markdown(res))
    print(f"\nwrote {out / name}")


if __name__ == "__main__":
    main(sys.argv[1:])
