"""Headroom of every target x drafter x hardware in conf/: fit and KV capacity lost.

Run: .venv/bin/python bench/headroom_matrix.py [--csv out.csv] [--smoke]
(--smoke: h200 x the qwen3_8b and tiny targets x ngram, eagle3 and draft_model_derived: 6
pairs, seconds, instead of the ~2 min of every combination)
For each pair the drafter's first engine config (its smallest N) is shown; pairs the drafter
was not made for are listed as "n/a" with the reason compile gives. The last line is one JSON
object: the combinations and their count per fit.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time

from rich.console import Console
from rich.table import Table

from specflow.config.compose import conf_dir, load_plan, options
from specflow.spec.errors import SpecError
from specflow.spec.memory import headroom

SMOKE = {"hardware": ("h200",), "target": ("qwen3_8b", "tiny"),
         "drafter": ("ngram", "eagle3", "draft_model_derived")}
"""--smoke: the conf entries crossed (lookup, a checkpoint per target, and a drafter made for
one of the two targets only: an "n/a" row)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="also write the rows to this CSV file")
    parser.add_argument("--smoke", action="store_true",
                        help="the whole code path at its smallest: the pairs in SMOKE only")
    args = parser.parse_args()
    root = conf_dir()

    def entries(group: str) -> list[str]:
        names = [n for n in options(group, root) if n != "none"]
        return [n for n in names if n in SMOKE[group]] if args.smoke else names

    targets, drafters, hardware = entries("target"), entries("drafter"), entries("hardware")
    rows = []
    start = time.perf_counter()
    for hw in hardware:
        for target in targets:
            for drafter in drafters:
                try:
                    loaded, plan = load_plan([f"target={target}", f"drafter={drafter}",
                                              f"hardware={hw}"])
                except SpecError as err:
                    rows.append((hw, target, drafter, "n/a", "", "", "", "", "",
                                 err.problems[0].problem))
                    continue
                base = headroom(loaded.spec, plan.engine_configs[0])
                ec = plan.engine_configs[1]
                h = headroom(loaded.spec, ec)
                rows.append((hw, target, drafter, h.fit, str(ec.num_speculative_tokens),
                             f"{h.capacity_without_drafter.tokens:,}", f"{h.capacity.tokens:,}",
                             f"{h.drafter_cost_tokens:,}", f"{h.drafter_cost_percent:.1f}%",
                             "; ".join(h.reasons or base.reasons)))
    elapsed = time.perf_counter() - start
    table = Table(title="headroom: every target x drafter x hardware in conf/")
    for col in ("hardware", "target", "drafter", "fit", "N", "KV tokens (no drafter)",
                "KV tokens", "lost", "lost %", "reason"):
        table.add_column(col, overflow="fold")
    colors = {"fits": "green", "warn": "yellow", "refuse": "red", "n/a": "dim"}
    for r in rows:
        table.add_row(*r[:3], f"[{colors[r[3]]}]{r[3]}[/]", *r[4:])
    console = Console(width=200)
    console.print(table)
    counts = {v: sum(1 for r in rows if r[3] == v) for v in ("fits", "warn", "refuse", "n/a")}
    console.print(f"{len(rows)} combinations in {elapsed:.1f} s: {counts}")
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["hardware", "target", "drafter", "fit", "n", "kv_tokens_no_drafter",
                        "kv_tokens", "lost_tokens", "lost_percent", "reason"])
            w.writerows(rows)
    print(json.dumps({"combinations": len(rows), **counts, "seconds": round(elapsed, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
