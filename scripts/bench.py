#!/usr/bin/env python3
"""strata side by side with Ray and StarPU on this machine (docs/benchmarks.md).

    python3 scripts/bench.py [--quick] [--strata-only] [--check] [--out DIR]

Builds and runs `strata-bench` (tests/src/bin/strata_bench.rs), installs the
peers into private places under `.bench/` (Ray from PyPI into a venv,
StarPU from Debian's `libstarpu-dev` with apt) and runs their programs
(bench/ray/, bench/starpu/), all in one run, then writes DIR/results.json,
DIR/results.md and, when matplotlib is available, DIR/results.png and
DIR/readers.png (strata's cost per task against N unfinished readers).
The Python jobs (bench/python/: tiled matmul, tiled Cholesky, a Jacobi
stencil and a loop of small tasks) run strata's Python package beside Dask
(threads and distributed) and numpy, in a venv of their own under `.bench/`
with this checkout's package built into it; DIR/python.png plots them.
A peer that cannot be installed is reported as such; strata's figures stand
alone then. `--quick` runs small sizes (under two minutes); `--check` exits 1
unless every strata scenario ran and checked its result (what CI runs, with
`--strata-only`); `--python-only` runs only the Python jobs.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = ["throughput", "latency", "stencil", "handoff", "remote", "remote-back"]
# strata's local scenarios run over every link: worker processes with their
# tasks on the shared-memory ring (the plain name), the same processes with
# the gRPC task stream (-grpc), and worker nodes inside the driver's process
# (-in-process). `remote` (bytes to the worker) and `remote-back` (written
# bytes back) are one worker over TCP.
LOCAL = [s for s in SCENARIOS if not s.startswith("remote")]
GRPC = [f"{s}-grpc" for s in LOCAL]
IN_PROCESS = [f"{s}-in-process" for s in LOCAL]
# Many unfinished tasks reading the same bytes, over the ring only:
# one row per pattern and N, in its own table.
READERS = "readers"
PATTERNS = ["private", "shared", "overlapping", "writer", "inference"]
# Tiled Cholesky per scheduling policy beside StarPU's own, and
# schedules at scale on timing-model chips: tables of their own.
CHOLESKY = "cholesky"
SCALE = "scale"
POLICIES = ["least-loaded", "dmda", "dmdas"]
ALL_STRATA = SCENARIOS + GRPC + IN_PROCESS + [READERS, CHOLESKY, SCALE]
# The Python jobs (bench/python/python_bench.py), each system a column.
PY_SCENARIOS = ["py-matmul", "py-cholesky", "py-jacobi", "py-loop"]
PY_SYSTEMS = [("strata", "strata, built-in kernels"), ("strata-py", "strata, numpy kernels"),
              ("dask-threads", "Dask threads"), ("dask-distributed", "Dask distributed"), ("numpy", "numpy")]
OWN_TABLES = (READERS, CHOLESKY, SCALE, *PY_SCENARIOS)


def link_of(scenario):
    """The link a strata row was measured over."""
    if scenario.startswith("remote"):
        return "grpc-tcp"
    if scenario.endswith("-grpc"):
        return "grpc-unix"
    if scenario.endswith("-in-process"):
        return "in-process"
    return "ring"


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def run_lines(cmd, timeout, env=None):
    """Runs cmd, returns (JSON objects printed on stdout, error or None)."""
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"{cmd[0]}: {e}"
    rows = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    err = None if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.strip()[-400:]}"
    return rows, err


def strata(quick):
    log("building strata-bench (release)")
    b = subprocess.run(["cargo", "build", "--release", "--locked", "-p", "strata-tests", "--bins"],
                       cwd=ROOT, capture_output=True, text=True)
    if b.returncode != 0:
        return [], "cargo build failed: " + b.stderr[-800:]
    exe = os.path.join(ROOT, "target", "release", "strata-bench")
    log("running strata")
    return run_lines([exe] + (["--quick"] if quick else []), timeout=900)


def ray(quick):
    venv = os.path.join(ROOT, ".bench", "ray-venv")
    log("installing Ray (private venv .bench/ray-venv)")
    i = subprocess.run(["bash", "bench/ray/install.sh", venv], cwd=ROOT,
                       capture_output=True, text=True)
    if i.returncode != 0:
        return [], "Ray could not be installed: " + (i.stderr or i.stdout).strip()[-400:]
    log("running Ray")
    return run_lines([os.path.join(venv, "bin", "python"), "bench/ray/ray_bench.py"]
                     + (["--quick"] if quick else []), timeout=1800)


def starpu(quick):
    log("installing StarPU (apt: libstarpu-dev)")
    i = subprocess.run(["bash", "bench/starpu/install.sh"], cwd=ROOT, capture_output=True, text=True)
    if i.returncode != 0:
        return [], "StarPU could not be installed: " + (i.stderr or i.stdout).strip()[-400:]
    out = os.path.join(ROOT, ".bench", "starpu")
    b = subprocess.run(["bash", "bench/starpu/build.sh", out], cwd=ROOT, capture_output=True, text=True)
    if b.returncode != 0:
        return [], "StarPU benchmark did not build: " + (b.stderr or b.stdout).strip()[-400:]
    log("running StarPU")
    rows, err = run_lines([os.path.join(out, "starpu_bench")] + (["--quick"] if quick else []), timeout=900)
    log("running StarPU's tiled Cholesky (cholesky_implicit, OpenBLAS, 2 CPU workers)")
    chol, cerr = run_lines([sys.executable, "bench/starpu/cholesky.py"] + (["--quick"] if quick else []),
                           timeout=1800)
    for r in chol:
        # Into the common row shape: variant = StarPU's scheduler.
        if "gflops" in r:
            rows.append({"system": "starpu", "scenario": CHOLESKY, "variant": r["sched"],
                         "params": {"n": r["n"], "tile": r["tile"], "runs_gflops": r.get("runs_gflops")},
                         "value": r["gflops"], "unit": "GFlop/s", "ok": True, "detail": r.get("blas", "")})
    return rows, err or cerr


def python_side(quick):
    venv = os.path.join(ROOT, ".bench", "py-venv")
    log("installing strata's Python package, numpy, scipy and Dask (private venv .bench/py-venv)")
    i = subprocess.run(["bash", "bench/python/install.sh", venv], cwd=ROOT, capture_output=True, text=True)
    if i.returncode != 0:
        return [], "the Python venv could not be made: " + (i.stderr or i.stdout).strip()[-400:]
    log("running the Python jobs: strata, Dask, numpy")
    return run_lines([os.path.join(venv, "bin", "python"), "bench/python/python_bench.py"]
                     + (["--quick"] if quick else []), timeout=3600)


def pick(rows, system, scenario, variant=None):
    for r in rows:
        if r.get("system") == system and r.get("scenario") == scenario and \
                (variant is None or r.get("variant") == variant):
            return r
    return None


def ratio(a, b):
    return a / b if a and b else None


def fmt(v, digits=3):
    if v is None:
        return "—"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def compare(rows):
    """The ring data plane's targets, from one run's rows (strata over the ring)."""
    out = []

    def target(name, value, ok, note):
        out.append({"target": name, "value": value, "met": ok, "note": note})

    st, sp = pick(rows, "strata", "throughput"), pick(rows, "starpu", "throughput")
    rt = pick(rows, "ray", "throughput", "tasks")
    if st:
        v = st["value"]
        r = ratio(v, sp and sp["value"])
        target("throughput ≥ StarPU's in-process no-op rate", r, None if r is None else r >= 1,
               f"{fmt(v)} tasks/s = {fmt(r)}× StarPU ({fmt(sp and sp['value'])}); "
               f"{fmt(ratio(v, rt and rt['value']))}× Ray tasks")
    sl, spl = pick(rows, "strata", "latency"), pick(rows, "starpu", "latency")
    if sl:
        v = sl["value"]
        r = ratio(v, spl and spl["value"])
        target("chain latency ≤ 20 µs per hop", v, v <= 20, f"{fmt(v)} µs/hop")
        target("chain latency ≤ 5× StarPU's hop", r, None if r is None else r <= 5,
               f"{fmt(r)}× StarPU ({fmt(spl and spl['value'])} µs/hop)")
    ks = [r for r in rows if r.get("system") == "strata" and r.get("scenario") == "stencil"]
    if ks:
        worst = None
        for r in ks:
            p = pick(rows, "starpu", "stencil", r["variant"])
            q = ratio(r["value"], p and p["value"])
            worst = q if q is not None and (worst is None or q > worst) else worst
        vals = [r["value"] for r in ks]
        flat = max(vals) / min(vals)
        target("stencil ≤ 2× StarPU per task at every k", worst, None if worst is None else worst <= 2,
               "worst k: " + fmt(worst) + "× StarPU")
        target("stencil flat in k (max/min ≤ 1.5)", flat, flat <= 1.5, f"max/min over k = {fmt(flat)}")
    for size in ("16MiB", "48MiB"):
        r = pick(rows, "strata", "remote", size)
        if r:
            target(f"remote staging ≥ 2 GB/s ({size})", r["value"], r["value"] >= 2,
                   f"{fmt(r['value'])} GB/s over TCP loopback with a token")
    rd = readers_table(rows)
    if rd:
        ratios = [rd[n].get("shared/private") for n in sorted(rd)]
        ratios = [r for r in ratios if r is not None]
        if ratios:
            target("readers: shared ≤ 1.2× private per task at every N", max(ratios), max(ratios) <= 1.2,
                   "shared/private " + " / ".join(fmt(r) for r in ratios) + " at N = "
                   + " / ".join(f"{n:,}" for n in sorted(rd)))
        lo, hi = min(rd), max(rd)
        if hi > lo:
            worst, name = None, None
            for p in PATTERNS:
                a, b = rd[lo].get(p), rd[hi].get(p)
                q = ratio(b, a)
                if q is not None and (worst is None or q > worst):
                    worst, name = q, p
            if worst is not None:
                target(f"readers: per task at N={hi:,} within 1.5× of N={lo:,}", worst, worst <= 1.5,
                       f"worst pattern {name}: {fmt(worst)}×")
    ch = cholesky_table(rows)
    if ch:
        worst, where = None, None
        for (n, t), v in sorted(ch.items()):
            best = max((v.get(("strata", "sim:mode=unified", p)) or 0) for p in POLICIES)
            q = ratio(best, v.get(("starpu", None, "dmda")))
            if q is not None and (worst is None or q < worst):
                worst, where = q, f"N={n} tile {t}"
        if worst is not None:
            target("Cholesky ≥ StarPU's dmda at every size", worst, worst >= 1,
                   f"worst {where}: strata's best policy {fmt(worst)}× StarPU dmda")
    sc = scale_table(rows)
    for (w, link, wb), v in sorted(sc.items()):
        worst = max((x for (c, p), x in v.items() if c in (4, 8) and p == "dmdas"), default=None)
        if worst is not None:
            target(f"scale: {w} ≤ 1.25× bound at 4 and 8 chips (dmdas, link {link}, write-back {wb})", worst,
                   worst <= 1.25,
                   " / ".join(f"{c} chips {fmt(x)}×" for (c, p), x in sorted(v.items()) if p == "dmdas"))
    for r in rows:
        if r.get("system") == "dask-threads" and r.get("scenario") == "py-matmul" and r["variant"] == "1024/64":
            best = min((x["value"] for x in rows if x.get("scenario") == "py-matmul" and x["variant"] == "1024/64"
                        and x["system"] in ("strata", "strata-py") and x.get("ok")), default=None)
            q = ratio(best, r["value"])
            target("Python tiled matmul 1024²/64² ≤ 0.1× Dask threads' time", q, None if q is None else q <= 0.1,
                   f"strata {fmt(best)} s, Dask threads {fmt(r['value'])} s: {fmt(q)}×")
    h1, hg = pick(rows, "strata", "handoff", "1MiB"), pick(rows, "strata", "handoff", "1GiB")
    if h1 and hg:
        r = ratio(hg["value"], h1["value"])
        target("zero-copy: 1 GiB within 2× of 1 MiB", r, r is not None and r <= 2,
               f"1 MiB {fmt(h1['value'])} ms, 1 GiB {fmt(hg['value'])} ms")
    return out


def readers_table(rows):
    """{N: {pattern: value}} of strata's readers rows over the ring."""
    out = {}
    for r in rows:
        if r.get("system") != "strata" or r.get("scenario") != READERS:
            continue
        p = r.get("params", {})
        if "N" in p and "pattern" in p:
            out.setdefault(p["N"], {})[p["pattern"]] = r["value"] if r.get("ok") else None
            if p["pattern"] == "writer-added":
                out[p["N"]]["writer-insert"] = p.get("writer_insert_us")
    return out


def cholesky_table(rows):
    """{(N, tile): {(system, device, variant): GFlop/s}}."""
    out = {}
    for r in rows:
        if r.get("scenario") != CHOLESKY or "n" not in r.get("params", {}):
            continue
        p = r["params"]
        out.setdefault((p["n"], p["tile"]), {})[(r["system"], p.get("device"), r["variant"])] = \
            r["value"] if r.get("ok") else None
    return out


def cholesky_markdown(rows):
    ch = cholesky_table(rows)
    if not ch:
        return []
    lines = ["", "Tiled Cholesky, F32, 2 workers (GFlop/s = N³/3 / wall; StarPU: `cholesky_implicit` on 2 CPU "
             "workers over OpenBLAS, models calibrated; strata: built-in kernels on 2 worker processes, "
             "median of the runs after one calibration run):", "",
             "| N | tile | StarPU dmda | StarPU dmdas | StarPU eager | strata least-loaded | strata dmda | "
             "strata dmdas | strata dmdas, staged chips |", "|---|---|---|---|---|---|---|---|---|"]
    for (n, t), v in sorted(ch.items()):
        cells = [v.get(("starpu", None, s)) for s in ("dmda", "dmdas", "eager")]
        cells += [v.get(("strata", "sim:mode=unified", p)) for p in POLICIES]
        cells.append(v.get(("strata", "sim", "dmdas")))
        lines.append(f"| {n} | {t} | " + " | ".join(fmt(c) for c in cells) + " |")
    return lines


def scale_table(rows):
    """{(workload, link, write-back): {(chips, policy): makespan / bound}}."""
    out = {}
    for r in rows:
        if r.get("system") != "strata" or r.get("scenario") != SCALE or "chips" not in r.get("params", {}):
            continue
        p = r["params"]
        key = (p["workload"], p.get("link"), p.get("write_back", "through"))
        out.setdefault(key, {})[(p["chips"], p["policy"])] = r["value"]
    return out


def scale_markdown(rows):
    sc = scale_table(rows)
    if not sc:
        return []
    lines = ["", "Schedules at scale (timing-model chips, 10 GFlop/s each, modelled link; makespan of the "
             "second run ÷ max(critical path, total work / chips)):", "",
             "| workload | link | write-back | chips | least-loaded | dmda | dmdas |",
             "|---|---|---|---|---|---|---|"]
    for (w, link, wb), v in sorted(sc.items()):
        for c in sorted({c for c, _ in v}):
            lines.append(f"| {w} | {link} | {wb} | {c} | " + " | ".join(fmt(v.get((c, p))) for p in POLICIES)
                         + " |")
    return lines


def python_markdown(rows):
    py = [r for r in rows if r.get("scenario") in PY_SCENARIOS]
    if not py:
        return []
    lines = ["", "From Python, beside Dask and numpy (float64; 2 workers, 2 threads or 2 Dask worker processes; "
             "BLAS at one thread; seconds from host numpy arrays to a numpy result, median after a warm-up; "
             "the loop in tasks/s; each result checked against numpy, a wrong one marked):", "",
             "| job | size | tasks | " + " | ".join(n for _, n in PY_SYSTEMS) + " | unit |",
             "|---|---|---|" + "---|" * len(PY_SYSTEMS) + "---|"]
    keys = []
    for r in py:
        k = (r["scenario"], r["variant"])
        if k not in keys:
            keys.append(k)
    for sc, var in keys:
        cells = []
        for system, _ in PY_SYSTEMS:
            r = pick(rows, system, sc, var)
            cells.append("—" if not r or r.get("value") is None
                         else fmt(r["value"]) + ("" if r.get("ok") else " (wrong!)"))
        any_row = next(r for r in py if (r["scenario"], r["variant"]) == (sc, var))
        lines.append(f"| {sc[3:]} | {var} | {any_row['params'].get('tasks', '—'):,} | " + " | ".join(cells)
                     + f" | {any_row['unit']} |")
    return lines


def readers_markdown(rows):
    rd = readers_table(rows)
    if not rd:
        return []
    ns = sorted(rd)
    head = "| pattern | " + " | ".join(f"N={n:,}" for n in ns) + " | unit |"
    lines = ["", "Many readers of the same bytes (strata over the ring, per task; all N unfinished "
             "until the last is submitted; every run's bytes checked, a wrong one shown as —):", "", head,
             "|---|" + "---|" * len(ns) + "---|"]

    def row(label, key, unit, scale=1.0):
        vals = [rd[n].get(key) for n in ns]
        if any(v is not None for v in vals):
            cells = " | ".join("—" if v is None else fmt(v * scale) for v in vals)
            lines.append(f"| {label} | {cells} | {unit} |")
    for p in PATTERNS:
        row(p, p, "µs/task")
    row("shared / private", "shared/private", "ratio")
    row("writer-added (run with the writer minus without)", "writer-added", "ms", 1e-3)
    row("the writer's submit + a totals round trip", "writer-insert", "ms", 1e-3)
    wrong = [r["variant"] for r in rows if r.get("system") == "strata"
             and r.get("scenario") == READERS and not r.get("ok")]
    if wrong:
        lines.append("")
        lines.append("**Wrong results:** " + ", ".join(wrong))
    return lines


def markdown(rows, targets, peers, meta):
    lines = [f"Run: `{meta['command']}` on {meta['machine']}, {meta['date']}.", ""]
    for name, err in peers.items():
        if err:
            lines.append(f"- **{name}**: {err}")
    keys = []
    for r in rows:
        if r.get("scenario") in OWN_TABLES:
            continue
        k = (r.get("scenario"), r.get("variant"))
        if k not in keys:
            keys.append(k)
    order = {s: i for i, s in enumerate(ALL_STRATA)}
    keys.sort(key=lambda k: order.get(k[0], len(order)))
    if keys:
        lines += ["", "| scenario | strata link | variant | strata | Ray | StarPU | unit |",
                  "|---|---|---|---|---|---|---|"]
    for sc, var in keys:
        def val(system):
            r = pick(rows, system, sc, var)
            if not r:
                return "—"
            return fmt(r["value"]) + ("" if r.get("ok") else " (wrong!)")
        unit = next(r["unit"] for r in rows if (r.get("scenario"), r.get("variant")) == (sc, var))
        link = link_of(sc) if pick(rows, "strata", sc, var) else "—"
        lines.append(f"| {sc} | {link} | {var} | {val('strata')} | {val('ray')} | {val('starpu')} | {unit} |")
    lines += readers_markdown(rows)
    lines += cholesky_markdown(rows)
    lines += scale_markdown(rows)
    lines += python_markdown(rows)
    lines += ["", "| target | met | figure |", "|---|---|---|"]
    for t in targets:
        met = "n/a (peer not run)" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['target']} | {met} | {t['note']} |")
    return "\n".join(lines) + "\n"


PLOT = r'''
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = json.load(open(sys.argv[1]))["rows"]
def get(system, scenario):
    return [(r["variant"], r["value"]) for r in rows if r["system"] == system and r["scenario"] == scenario]
fig, ax = plt.subplots(1, 4, figsize=(20, 4.2))
colors = {"strata": "#1f77b4", "ray": "#ff7f0e", "starpu": "#2ca02c"}
for i, (sc, unit, log) in enumerate([("throughput", "tasks/s", True), ("latency", "µs per hop", True),
                                     ("stencil", "µs per task", False), ("handoff", "ms", True)]):
    a = ax[i]
    links = [("", "ring", "#1f77b4"), ("-grpc", "grpc", "#9ecae1"), ("-in-process", "in-proc", "#08306b")]
    if sc == "stencil":
        series = [("strata " + n, get("strata", sc + suf), c) for suf, n, c in links]
        series.append(("starpu", get("starpu", sc), colors["starpu"]))
        for name, got, c in series:
            pts = [(int(v.split("=")[1]), x) for v, x in got]
            if pts:
                a.plot(*zip(*sorted(pts)), marker="o", label=name, color=c)
        a.set_xscale("log", base=2); a.set_xlabel("tiles k")
    else:
        labels, vals, cols = [], [], []
        for suf, n, c in links:
            for v, x in get("strata", sc + suf):
                labels.append(f"strata {n}\n{v[:10]}"); vals.append(x); cols.append(c)
        for s in ("ray", "starpu"):
            for v, x in get(s, sc):
                labels.append(f"{s}\n{v[:14]}"); vals.append(x); cols.append(colors[s])
        a.bar(range(len(vals)), vals, color=cols)
        a.set_xticks(range(len(vals))); a.set_xticklabels(labels, fontsize=6, rotation=60)
        if log and vals: a.set_yscale("log")
    a.set_title(sc); a.set_ylabel(unit)
    if sc == "stencil": a.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
'''

SCALE_PLOT = r'''
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [r for r in json.load(open(sys.argv[1]))["rows"]
        if r.get("system") == "strata" and r.get("scenario") == "scale"]
groups = sorted({(r["params"]["workload"], r["params"].get("link")) for r in rows})
fig, ax = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4.2), squeeze=False)
for a, (w, link) in zip(ax[0], groups):
    for p, c in (("least-loaded", "#999999"), ("dmda", "#6baed6"), ("dmdas", "#08519c")):
        for wb, ls in (("through", "-"), ("deferred", ":")):
            pts = sorted((r["params"]["chips"], r["value"]) for r in rows
                         if r["params"]["workload"] == w and r["params"].get("link") == link
                         and r["params"]["policy"] == p and r["params"].get("write_back", "through") == wb)
            if pts:
                a.plot(*zip(*pts), marker="o", ls=ls, label=f"{p}, {wb}", color=c)
    a.axhline(1.25, color="r", ls="--", lw=1, label="1.25")
    a.set_xscale("log", base=2); a.set_xlabel("chips"); a.set_ylabel("makespan / lower bound")
    a.set_title(f"{w}, link {link}"); a.set_ylim(bottom=1); a.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
'''

PY_PLOT = r'''
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r.get("scenario", "").startswith("py-")]
systems = [("strata", "strata, built-in", "#08519c"), ("strata-py", "strata, numpy kernels", "#6baed6"),
           ("dask-threads", "Dask threads", "#fd8d3c"), ("dask-distributed", "Dask distributed", "#a63603"),
           ("numpy", "numpy", "#777777")]
scen = [s for s in ("py-matmul", "py-cholesky", "py-jacobi", "py-loop") if any(r["scenario"] == s for r in rows)]
fig, ax = plt.subplots(1, len(scen), figsize=(5 * len(scen), 4.2), squeeze=False)
for a, sc in zip(ax[0], scen):
    variants = list(dict.fromkeys(r["variant"] for r in rows if r["scenario"] == sc))
    w = 0.8 / len(systems)
    for k, (sys_, label, c) in enumerate(systems):
        xs, ys = [], []
        for i, v in enumerate(variants):
            got = [r for r in rows if r["scenario"] == sc and r["variant"] == v and r["system"] == sys_
                   and r.get("value") and r.get("ok")]
            if got:
                xs.append(i + (k - len(systems) / 2 + 0.5) * w); ys.append(got[0]["value"])
        if xs:
            a.bar(xs, ys, w, label=label, color=c)
    a.set_xticks(range(len(variants))); a.set_xticklabels(variants)
    a.set_yscale("log"); a.set_title(sc[3:] + (" (higher is better)" if sc == "py-loop" else " (lower is better)"))
    a.set_ylabel("tasks/s" if sc == "py-loop" else "seconds")
ax[0][0].legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
'''

READERS_PLOT = r'''
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [r for r in json.load(open(sys.argv[1]))["rows"]
        if r.get("system") == "strata" and r.get("scenario") == "readers"]
fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
for p in ["private", "shared", "overlapping", "writer", "inference"]:
    pts = sorted((r["params"]["N"], r["value"]) for r in rows if r["params"].get("pattern") == p)
    if pts:
        ax[0].plot(*zip(*pts), marker="o", label=p)
pts = sorted((r["params"]["N"], r["value"]) for r in rows if r["params"].get("pattern") == "shared/private")
if pts:
    ax[1].plot(*zip(*pts), marker="o", color="k", label="shared / private")
ax[1].axhline(1.2, color="r", ls="--", lw=1, label="1.2, the target")
ax[0].set_title("cost per task, N unfinished readers (ring)"); ax[0].set_ylabel("µs per task")
ax[1].set_title("shared / private"); ax[1].set_ylabel("ratio")
for a in ax:
    a.set_xscale("log"); a.set_xlabel("N (tasks unfinished at once)"); a.set_ylim(bottom=0); a.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
'''


def plot(results_json, png, script=PLOT):
    candidates = [sys.executable, os.path.join(ROOT, ".bench", "py-venv", "bin", "python"),
                  os.path.join(ROOT, ".bench", "ray-venv", "bin", "python"), os.path.join(ROOT, ".venv", "bin", "python")]
    for py in candidates:
        if not os.path.exists(py):
            continue
        if subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode == 0:
            p = subprocess.run([py, "-c", script, results_json, png], capture_output=True, text=True)
            if p.returncode == 0:
                return None
            return "plot failed: " + p.stderr[-300:]
    return "no python with matplotlib (pip install -r scripts/requirements.txt): no plot"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, under two minutes")
    ap.add_argument("--strata-only", action="store_true", help="do not install or run the peers")
    ap.add_argument("--python-only", action="store_true", help="only the Python jobs beside Dask and numpy")
    ap.add_argument("--check", action="store_true", help="exit 1 unless every strata scenario ran and was right")
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "bench"), help="where results go")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    started = time.time()
    rows, peers = [], {}
    if not a.python_only:
        got, err = strata(a.quick)
        rows += got
        peers["strata"] = err
    if not a.strata_only:
        others = (("Ray", ray), ("StarPU", starpu)) if not a.python_only else ()
        for name, fn in others + (("Python", python_side),):
            got, err = fn(a.quick)
            rows += got
            peers[name] = err
            if err:
                log(f"{name}: {err}")
    targets = compare(rows)
    cmd = "python3 scripts/bench.py" + (" --quick" if a.quick else "") + (" --strata-only" if a.strata_only else "") \
        + (" --python-only" if a.python_only else "")
    meta = {
        "command": cmd,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(time.time() - started, 1),
    }
    res = os.path.join(a.out, "results.json")
    with open(res, "w") as f:
        json.dump({"meta": meta, "peers": peers, "rows": rows, "targets": targets}, f, indent=1)
    md = markdown(rows, targets, peers, meta)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(md)
    main_rows = any(r.get("scenario") in SCENARIOS + GRPC + IN_PROCESS for r in rows)
    perr = plot(res, os.path.join(a.out, "results.png")) if main_rows else None
    if perr:
        log(perr)
    elif readers_table(rows):
        perr = plot(res, os.path.join(a.out, "readers.png"), READERS_PLOT)
        if perr:
            log(perr)
    if not perr and any(r.get("scenario") in PY_SCENARIOS for r in rows):
        perr = plot(res, os.path.join(a.out, "python.png"), PY_PLOT)
        if perr:
            log(perr)
    if not perr and scale_table(rows):
        perr = plot(res, os.path.join(a.out, "scale.png"), SCALE_PLOT)
        if perr:
            log(perr)
    print(md)
    log(f"done in {meta['seconds']} s; results in {a.out}")
    if a.check:
        missing = [s for s in ALL_STRATA if not pick(rows, "strata", s)]
        wrong = [f"{r['scenario']}/{r['variant']}: {r.get('detail')}" for r in rows
                 if r.get("system") == "strata" and not r.get("ok")]
        if missing or wrong or peers.get("strata"):
            log(f"check failed: missing {missing}, wrong {wrong}, strata error {peers.get('strata')}")
            return 1
        log("check: every strata scenario ran and checked its result")
    return 0


if __name__ == "__main__":
    sys.exit(main())
