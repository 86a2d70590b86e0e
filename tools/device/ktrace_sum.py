#!/usr/bin/env python3
"""ktrace_sum: one forward of a ktrace.c timeline, kernel by kernel.

The window runs from the n-th last launch of a marker kernel (default
k_embed, which opens every forward) to the next one, or to the end of the
trace. Each kernel's (or copy's) line gives its start within the window,
its time, and the gap between the latest end so far and its start
(negative: it started while an earlier kernel still ran, as a programmatic
dependent). The totals by kernel name then say where the window's time
went. Host API calls (traced with KTRACE_API=1) are listed among them as
"host" lines, outside the gaps, and totalled apart.

--steps lists every forward instead: from its first start to its last end,
and the GPU's idle time from there to the next forward's first start (the
host's share of a decode step: the token's copy back, the next batch's
upload and the graph's launch), with the median of the last forwards.

  python3 tools/device/ktrace_sum.py /tmp/k.csv [--marker k_embed] [--nth 2] [--lines | --steps]
"""
import argparse
import collections
import csv
import re
import statistics


def short(name):
    """The kernel's name without its argument list, return type or mangling
    (CUPTI reports C++ kernels by their mangled names: _Z7k_embedPf...)."""
    m = re.match(r"_Z(\d+)", name)
    if m:
        return name[m.end():m.end() + int(m.group(1))]
    name = re.sub(r"\(.*$", "", name)
    return re.sub(r"^void ", "", name)


def steps(rows, marks):
    """Each forward's span and the idle time before the next one; the median
    over the last half of the forwards (a bench run's decode steps)."""
    dev = [r for r in rows if r[2] != "api"]
    spans, idles = [], []
    print(f"{'forward':>7} {'start us':>10} {'span us':>9} {'idle us':>8}")
    for i, (lo, hi) in enumerate(zip(marks, marks[1:])):
        end = max(r[1] for r in dev if lo <= r[0] < hi)
        spans.append((end - lo) / 1e3)
        idles.append((hi - end) / 1e3)
        print(f"{i:7d} {(lo - marks[0]) / 1e3:10.1f} {spans[-1]:9.1f} {idles[-1]:8.1f}")
    half = len(spans) // 2
    if half:
        span, idle = statistics.median(spans[-half:]), statistics.median(idles[-half:])
        print(f"the last {half} forwards, medians: span {span:.1f} us, idle {idle:.1f} us "
              f"({100 * idle / (span + idle):.1f}% of a step)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--marker", default="k_embed", help="the kernel that opens a window")
    ap.add_argument("--nth", type=int, default=2, help="which marker launch from the end opens the window")
    ap.add_argument("--lines", action="store_true", help="print every kernel of the window")
    ap.add_argument("--steps", action="store_true", help="every forward's span and the idle time after it")
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = [(int(r["start_ns"]), int(r["end_ns"]), r["grid"], r["block"], r["graph"], short(r["name"]))
                for r in csv.DictReader(f)]
    rows.sort()
    marks = [r[0] for r in rows if r[2] not in ("api", "copy") and r[5].startswith(a.marker)]
    if a.steps:
        steps(rows, marks)
        return
    if len(marks) < a.nth:
        raise SystemExit(f"ktrace_sum: {len(marks)} launches of {a.marker}, fewer than {a.nth}")
    lo = marks[-a.nth]
    hi = marks[-a.nth + 1] if a.nth > 1 else None
    win = [r for r in rows if r[0] >= lo and (hi is None or r[0] < hi)]
    t0 = win[0][0]
    by = collections.OrderedDict()
    host = collections.OrderedDict()
    prev_end = None
    for s, e, grid, block, graph, name in win:
        if grid == "api":
            if a.lines:
                print(f"{(s - t0) / 1e3:9.2f} {(e - s) / 1e3:8.2f} {'':7}  host {name}")
            t = host.setdefault(name, [0, 0.0])
            t[0] += 1
            t[1] += (e - s) / 1e3
            continue
        gap = (s - prev_end) / 1e3 if prev_end is not None else 0.0
        if a.lines:
            where = "" if grid == "copy" else f" grid {grid} block {block}"
            print(f"{(s - t0) / 1e3:9.2f} {(e - s) / 1e3:8.2f} {gap:7.2f}  {name}{where}")
        t = by.setdefault(name, [0, 0.0, 0.0])
        t[0] += 1
        t[1] += (e - s) / 1e3
        t[2] += gap
        prev_end = e if prev_end is None else max(prev_end, e)
    dev = [r for r in win if r[2] != "api"]
    span = (max(r[1] for r in dev) - t0) / 1e3
    busy = sum(t[1] for t in by.values())
    print(f"window: {len(dev)} kernels and copies, {span:.1f} us from the first start to the last end; "
          f"their time {busy:.1f} us (overlaps counted twice)")
    print(f"{'count':>6} {'time us':>9} {'gaps us':>9}  kernel or copy")
    for name, (n, t, g) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{n:6d} {t:9.1f} {g:9.1f}  {name}")
    if host:
        print(f"{'count':>6} {'time us':>9}  host API call (KTRACE_API=1; nested driver calls counted again)")
        for name, (n, t) in sorted(host.items(), key=lambda kv: -kv[1][1]):
            print(f"{n:6d} {t:9.1f}  {name}")

if __name__ == "__main__":
    main()
