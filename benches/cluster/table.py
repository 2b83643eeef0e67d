#!/usr/bin/env python3
"""Reads benches/cluster/run.sh's JSON files and prints the markdown table: per topology and
collective, % of the bound at 64 MiB and 1 GiB for the tuner's choice (what it chose) and the
best single algorithm, with build (synthesis) and tuning times.
usage: table.py [--bounds DIR2] DIR TOPOLOGY...
  --bounds DIR2: percentages against DIR2's bounds (an older run priced against today's bound)"""
import json, os, re, sys

ALGOS = ["ring", "tree", "rhd", "rd", "hier", "hier-rhd", "blink", "forest", "tacos"]
COLLS = ["all_reduce", "all_gather", "reduce_scatter"]


def load(d, topo, coll, algo):
    name = re.sub(r"[^a-zA-Z0-9]", "_", topo) + f"-{coll}-{algo}.json"
    try:
        with open(os.path.join(d, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


BOUNDS = None  # (dir) whose files' bounds replace each file's own


def parse_bound(doc):
    """(algbw GB/s, latency µs) of a file's bound line."""
    m = re.search(r"algbw ≤ ([0-9.]+) GB/s.*time ≥ ([0-9.]+) us", doc.get("bound", ""))
    return (float(m.group(1)), float(m.group(2))) if m else None


def rows(doc, other=None):
    """(rows by size, schedule line) of the one sweep in a file, or None; with `other` (a file
    of the same topology and collective) the percentages are against its bound."""
    if not doc or "sweeps" not in doc:
        return None
    sweep = doc["sweeps"][0]
    out = {r["size"]: dict(r) for r in sweep["rows"]}
    bound = parse_bound(other) if other else None
    if bound:
        rate, lat = bound
        for size, r in out.items():
            r["pct_of_bound"] = 100.0 * max(lat, size / (rate * 1e3)) / r["time_us"]
    return out, sweep.get("schedule", "")


def reference(topo, coll):
    """A file of today's run for the same topology and collective, for its bound."""
    if not BOUNDS:
        return None
    for algo in ["ring", "auto", "tacos", "rhd"]:
        doc = load(BOUNDS, topo, coll, algo)
        if doc and "bound" in doc:
            return doc
    return None


def ms(text, pattern):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def fmt_time(msv):
    if msv is None:
        return "–"
    return f"{msv / 1000:.1f} s" if msv >= 1000 else f"{msv:.0f} ms"


def main():
    global BOUNDS
    args = sys.argv[1:]
    if args and args[0] == "--bounds":
        BOUNDS, args = args[1], args[2:]
    d, topos = args[0], args[1:]
    sizes = [64 << 20, 1 << 30]
    print("| topology | collective | auto 64 MiB | auto 1 GiB | chosen (64 MiB / 1 GiB) | best algorithm 64 MiB | best 1 GiB | tuning (both sizes) | slowest build |")
    print("|---|---|---|---|---|---|---|---|---|")
    for topo in topos:
        for coll in COLLS:
            ref = reference(topo, coll)
            auto = load(d, topo, coll, "auto")
            a = rows(auto, ref)
            cells = []
            if a:
                r, sched = a
                cells += [f"{r[s]['pct_of_bound']:.1f}" if s in r else "–" for s in sizes]
                cells.append(" / ".join(r[s].get("choice", "?") for s in sizes if s in r))
                tuning = fmt_time(ms(sched, r"sizes in ([0-9.]+) ms"))
            else:
                why = "timeout" if auto and "timeout_s" in auto else "error" if auto else "not run"
                cells += [why, why, "–"]
                tuning = f">{auto['timeout_s']} s" if auto and "timeout_s" in auto else "–"
            best = {s: (None, 0.0) for s in sizes}
            slowest = (None, 0.0)
            for algo in ALGOS:
                doc = load(d, topo, coll, algo)
                if doc and "timeout_s" in doc:
                    slowest = (algo, float("inf")) if slowest[1] != float("inf") else slowest
                got = rows(doc, ref)
                if not got:
                    continue
                r, sched = got
                build = ms(sched, r"generated in ([0-9.]+) ms")
                if build is not None and build > slowest[1]:
                    slowest = (algo, build)
                for s in sizes:
                    if s in r and r[s]["pct_of_bound"] > best[s][1]:
                        best[s] = (algo, r[s]["pct_of_bound"])
            cells += [f"{best[s][1]:.1f} {best[s][0]}" if best[s][0] else "–" for s in sizes]
            cells.append(tuning)
            if slowest[0] is None:
                cells.append("–")
            elif slowest[1] == float("inf"):
                cells.append(f"{slowest[0]}: timeout")
            else:
                cells.append(f"{slowest[0]} {fmt_time(slowest[1])}")
            print(f"| `{topo}` | {coll} | " + " | ".join(cells) + " |")


main()
