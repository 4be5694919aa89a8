#!/usr/bin/env python3
"""Compare two builds' `switchyard bench ... --json` launches, before and after a change.

Usage: scripts/bench_compare.py before1.jsonl before2.jsonl ... -- after1.jsonl after2.jsonl ...

Every row's ratio (above 1: switchyard better than the baseline measured in the same
launch) is reduced to its median over the launches of each side; the table shows both
medians and after/before. Ratios, not raw figures, are compared because each launch's
baseline absorbs the machine's load at that moment.
"""
import json
import statistics
import sys


def load(paths):
    rows = {}
    order = []
    for path in paths:
        with open(path) as lines:
            for line in lines:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                row = json.loads(line)
                key = (row["suite"], row["case"], row["size"], row["metric"], row["baseline_name"])
                if key not in rows:
                    rows[key] = []
                    order.append(key)
                rows[key].append(row["ratio"])
    return rows, order


def size_text(size):
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return f"{size >> 20} MiB"
    if size >= 1 << 10 and size % (1 << 10) == 0:
        return f"{size >> 10} KiB"
    return f"{size} B"


def main(argv):
    if "--" not in argv:
        sys.exit(__doc__)
    split = argv.index("--")
    before, _ = load(argv[:split])
    after, order = load(argv[split + 1 :])
    print("| suite | case | size | metric | baseline | ratio before | ratio after | after/before | launches |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in order:
        suite, case, size, metric, baseline_name = key
        a = statistics.median(after[key])
        if key in before:
            b = statistics.median(before[key])
            change = f"{a / b:.2f}" if b else "-"
            b_text = f"{b:.2f}"
        else:
            b_text, change = "(new)", "-"
        n = f"{len(before.get(key, []))}/{len(after[key])}"
        print(f"| {suite} | {case} | {size_text(size)} | {metric} | {baseline_name} | {b_text} | {a:.2f} | {change} | {n} |")


if __name__ == "__main__":
    main(sys.argv[1:])
