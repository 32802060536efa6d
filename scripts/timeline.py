#!/usr/bin/env python3
"""Where a training step goes, from a kernel timeline (dev/cuda/timeline.cu).

Usage: python3 scripts/timeline.py TIMELINE [--marker NAME] [--skip N] [--top K]

Steps are cut at the end of each launch of the marker kernel (default adamw_kernel: one a step); the first
--skip steps (default 2: warm-up) are left out. For the steps after them it prints the medians of: the step's
wall time; the time the GPU runs something (the union of every kernel, memset and copy); the idle time (wall
minus busy); each kernel's total time a step, by name, on the main stream (the one with the most records) and
on the others; and the idle gaps on the main stream between two of its records, by the pair of names.
"""
import argparse
import re
import signal
import statistics
import sys
from collections import defaultdict


def short_name(name):
    """A kernel's name without its namespace, template arguments or parameters."""
    depth, cut = 0, []
    for ch in name:
        if ch == '<':
            depth += 1
        elif ch == '>':
            depth -= 1
        elif depth == 0:
            cut.append(ch)
    plain = ''.join(cut).split('(')[0].strip()
    plain = re.sub(r'^.*\s', '', plain)  # a return type ("void ")
    return plain.split('::')[-1] or name


def read_records(path):
    recs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip('\n').split('\t', 4)
            if len(parts) != 5 or parts[0] not in 'KSC':
                sys.exit(f'timeline.py: {path}:{n}: not a timeline record')
            kind, start, end, stream, name = parts
            recs.append((int(start), int(end), int(stream), kind, short_name(name) if kind == 'K' else name))
    if not recs:
        sys.exit(f'timeline.py: {path}: no records')
    recs.sort()
    return recs


def union_ns(intervals):
    busy, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return busy + (cur_e - cur_s if cur_e is not None else 0)


def step_stats(recs, lo, hi, main):
    inside = [r for r in recs if r[0] >= lo and r[0] < hi]
    busy = union_ns([(s, min(e, hi)) for s, e, *_ in inside])
    per_name = defaultdict(float)
    for s, e, stream, kind, name in inside:
        per_name[(stream == main, name)] += e - s
    gaps = defaultdict(lambda: [0, 0])
    on_main = [r for r in inside if r[2] == main]
    for a, b in zip(on_main, on_main[1:]):
        if b[0] > a[1]:
            g = gaps[(a[4], b[4])]
            g[0] += b[0] - a[1]
            g[1] += 1
    return hi - lo, busy, per_name, gaps


def analyze(recs, marker='adamw_kernel', skip=2):
    """The medians over the steps after `skip` (ms a step): wall, busy, per (on the main stream, name) kernel
    time, per (name before, name after) main-stream gap time and count; None with too few steps."""
    ends = [e for s, e, _, kind, name in recs if kind == 'K' and name == marker]
    if len(ends) < skip + 2:
        return None
    count = defaultdict(int)
    for r in recs:
        count[r[2]] += 1
    main_stream = max(count, key=count.get)
    steps = [step_stats(recs, lo, hi, main_stream) for lo, hi in zip(ends[skip:], ends[skip + 1:])]
    ms = 1e-6
    keys = set().union(*(s[2] for s in steps))
    gkeys = set().union(*(s[3] for s in steps))
    return {
        'steps': len(steps),
        'wall': statistics.median(s[0] for s in steps) * ms,
        'busy': statistics.median(s[1] for s in steps) * ms,
        'kernels': {k: statistics.median(s[2].get(k, 0.0) for s in steps) * ms for k in keys},
        'gaps': {k: (statistics.median(s[3][k][0] if k in s[3] else 0 for s in steps) * ms,
                     statistics.median(s[3][k][1] if k in s[3] else 0 for s in steps)) for k in gkeys},
    }


def report(a, skip, top):
    wall, busy = a['wall'], a['busy']
    print(f'{a["steps"]} steps (after {skip}), medians, ms a step')
    print(f'wall {wall:.2f}   GPU busy {busy:.2f}   idle {wall - busy:.2f} ({100 * (wall - busy) / wall:.1f}%)')
    per = a['kernels']
    main_total = sum(v for (m, _), v in per.items() if m)
    side_total = sum(v for (m, _), v in per.items() if not m)
    print(f'\nkernel time: main stream {main_total:.2f}, other streams {side_total:.2f}')
    print(f'{"stream":6} {"ms":>8} {"%wall":>6}  name')
    for (m, name), v in sorted(per.items(), key=lambda kv: -kv[1])[:top]:
        print(f'{"main" if m else "other":6} {v:8.2f} {100 * v / wall:6.1f}  {name}')
    gap = a['gaps']
    total_gap = sum(v[0] for v in gap.values())
    total_n = sum(v[1] for v in gap.values())
    print(f'\nidle gaps on the main stream: {total_gap:.2f} ms in {total_n:.0f} gaps a step')
    print(f'{"ms":>8} {"gaps":>6} {"us each":>8}  after -> before')
    for (a_, b), (v, n) in sorted(gap.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f'{v:8.3f} {n:6.0f} {1e3 * v / max(n, 1):8.2f}  {a_} -> {b}')


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('timeline')
    ap.add_argument('--marker', default='adamw_kernel')
    ap.add_argument('--skip', type=int, default=2)
    ap.add_argument('--top', type=int, default=25)
    args = ap.parse_args()
    try:
        recs = read_records(args.timeline)
    except OSError as e:
        sys.exit(f'timeline.py: {e}')
    a = analyze(recs, args.marker, args.skip)
    if a is None:
        sys.exit(f'timeline.py: too few launches of {args.marker} for a step after --skip {args.skip}')
    report(a, args.skip, args.top)


if __name__ == '__main__':
    main()
