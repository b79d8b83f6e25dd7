"""The compulsory traffic of a `strata run` of a graph file, for the
placement the run actually chose: every byte a chip reads moved there once
for each value it reads — a view a task reads (INPUT, INOUT,
OUTPUT_EXISTING) costs its bytes unless its chip holds that view's current
value already (read there, or written there, since the last write) — plus
every byte written moved back once (each distinct view any task writes).
Views are the graph's named views (the graph's tasks must not write views
that overlap other views); the placement comes from the run's trace
(`--trace`), whose task ids are the graph's tasks in order. Tasks are
taken in submission order, which for a graph whose writers of one view
form a chain is the order that view's values were made in.

    strata run --local 4 --trace t.json job.json
    python3 scripts/compulsory.py job.json t.json

Prints the bytes read per chip, the bytes written, and the bound.
"""

import json
import sys

ITEM = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i64": 8, "i32": 4, "u8": 1, "i8": 1}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    graph = json.load(open(sys.argv[1]))
    trace = json.load(open(sys.argv[2]))
    worker = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "task":
            worker[e["args"]["task"]] = e["pid"]
    views = graph["views"]
    bufs = graph["buffers"]

    def nbytes(name):
        v = views[name]
        n = 1
        for d in v["shape"]:
            n *= d
        return n * ITEM[bufs[v["buffer"]]["dtype"]]

    # Per view: its current value (a count of writes); per chip and view:
    # the value the chip holds.
    current, held, per_chip, written = {}, {}, {}, set()
    for i, t in enumerate(graph["tasks"], start=1):
        w = worker.get(i)
        if w is None:
            sys.exit(f"task {i} is not in the trace (did the run finish?)")
        for a in t["args"]:
            v = a["view"]
            if a["tag"] in ("input", "inout", "output_existing"):
                if held.get((w, v)) != current.get(v, 0):
                    per_chip[w] = per_chip.get(w, 0) + nbytes(v)
                    held[(w, v)] = current.get(v, 0)
        for a in t["args"]:
            v = a["view"]
            if a["tag"] in ("output", "inout", "output_existing"):
                current[v] = current.get(v, 0) + 1
                held[(w, v)] = current[v]
                written.add(v)
    per_chip = dict(sorted(per_chip.items()))
    back = sum(nbytes(v) for v in written)
    total = sum(per_chip.values()) + back
    for w, b in per_chip.items():
        print(f"chip track {w}: {b} bytes moved in")
    print(f"written once: {back} bytes")
    print(f"compulsory bound: {total} bytes ({total / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
