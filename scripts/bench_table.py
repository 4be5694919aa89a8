#!/usr/bin/env python3
"""Summarise `switchyard bench ... --json` runs as a Markdown table.

Usage: scripts/bench_table.py [--metric=NAME] run1.jsonl run2.jsonl run3.jsonl

Each file is one launch of the benchmark (each already the median of its repetitions);
the table shows, per case, the median over launches of ours, the baseline and the ratio
(loopback TCP runs are bimodal on small VMs, so compare medians of several launches).
"""
import json
import statistics
import sys


def size_text(size):
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return f"{size >> 20} MiB"
    if size >= 1 << 10 and size % (1 << 10) == 0:
        return f"{size >> 10} KiB"
    return f"{size} B"


def number(value):
    if value >= 1e5:
        return f"{value / 1e6:.2f} M"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}"


def main(paths):
    metric_filter = None
    if paths and paths[0].startswith("--metric="):
        metric_filter = paths[0].split("=", 1)[1]
        paths = paths[1:]
    rows = {}
    order = []
    for path in paths:
        with open(path) as lines:
            for line in lines:
                row = json.loads(line)
                key = (row["case"], row["size"], row["metric"], row["baseline_name"])
                if key not in rows:
                    order.append(key)
                rows.setdefault(key, []).append(row)
    print("| case | size | metric | switchyard | baseline | baseline is | ratio (median) | ratios per launch |")
    print("|---|---|---|---|---|---|---|---|")
    for key in order:
        if metric_filter and key[2] != metric_filter:
            continue
        runs = rows[key]
        ours = statistics.median(r["ours"] for r in runs)
        base = statistics.median(r["baseline"] for r in runs)
        ratio = statistics.median(r["ratio"] for r in runs)
        each = ", ".join(f"{r['ratio']:.2f}" for r in runs)
        print(f"| {key[0]} | {size_text(key[1])} | {key[2]} | {number(ours)} | {number(base)} "
              f"| {runs[0]['baseline_name']} | **{ratio:.2f}** | {each} |")


if __name__ == "__main__":
    main(sys.argv[1:])
