#!/usr/bin/env python3
"""Render a Chrome trace-event JSON file (as loaded by Perfetto / chrome://tracing) to a PNG timeline.

Usage:
    python3 scripts/trace_png.py TRACE.json OUT.png [--width 14] [--height auto]
                                 [--max-arrows 400] [--title TEXT]

One row per (pid, tid), labelled "<process_name> / <thread_name>" from "M" metadata events and
ordered by process/thread sort index (if given), then pid, then tid. Each complete ("X") event is a
bar coloured by its name (stable colour per name; legend on the right). Flow events ("s" -> "f",
matched by cat + id) become thin arrows from the end of the source slice to the start of the target
slice, unless there are more than --max-arrows of them (then they are skipped and the title says so).
Time axis: milliseconds since the earliest drawn event. Other event types are ignored.
Needs matplotlib (scripts/requirements.txt). Exit status 2 on a missing/unreadable file, invalid
JSON, or a trace without slices.
"""
import argparse
import bisect
import json
import math
import os
import sys
import zlib
from collections import Counter, defaultdict

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
except ImportError:
    print("trace_png: error: matplotlib is missing; pip install -r scripts/requirements.txt", file=sys.stderr)
    sys.exit(2)

EPS_US = 1e-3
MAX_LEGEND = 30


def die(msg):
    print(f"trace_png: error: {msg}", file=sys.stderr)
    sys.exit(2)


def load_events(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        die(f"cannot read {path}: {e.strerror or e}")
    except UnicodeDecodeError as e:
        die(f"{path} is not valid JSON (not UTF-8 text: {e.reason})")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        # The array form may legally be unterminated (writer killed mid-run): try closing it.
        try:
            data = json.loads(text.rstrip().rstrip(",") + "]") if text.lstrip().startswith("[") else None
        except json.JSONDecodeError:
            data = None
        if data is None:
            die(f"{path} is not valid JSON: {e}")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        die(f"{path}: expected a JSON array of events or an object with a 'traceEvents' array")
    return [e for e in events if isinstance(e, dict)]


def num(v):  # finite JSON number -> float, anything else -> None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def order_key(v):  # pids/tids may be ints or strings; keep the sort total
    return (0, v, "") if num(v) is not None else (1, 0, str(v))


def palette_colors(names):
    """Stable colour per name: crc32 picks a palette slot, collisions probe onwards (sorted order)."""
    pal = [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (14, 15)]  # no greys
    if len(names) > len(pal):
        pal += list(plt.get_cmap("tab20b").colors) + list(plt.get_cmap("tab20c").colors)
    used, out = set(), {}
    for name in sorted(names):
        slot = zlib.crc32(name.encode()) % len(pal)
        while slot in used:
            slot = (slot + 1) % len(pal)
        used.add(slot)
        if len(used) == len(pal):
            used.clear()
        out[name] = pal[slot]
    return out


def snap(track, ts, mode):
    """x (us) a flow endpoint binds to on its track: 'src' -> end of the slice holding ts,
    'enc' -> start of the slice holding ts (bp "e"), 'next' -> start of the next slice; else ts."""
    starts, ends = track
    if mode == "next":
        i = bisect.bisect_left(starts, ts - EPS_US)
        return starts[i] if i < len(starts) else ts
    if mode == "src":  # prefer the slice starting before ts over one starting exactly at it
        i = bisect.bisect_left(starts, ts) - 1
        if i >= 0 and ends[i] >= ts - EPS_US:
            return ends[i]
        return ends[i + 1] if i + 1 < len(starts) and starts[i + 1] - ts <= EPS_US else ts
    i = bisect.bisect_right(starts, ts + EPS_US) - 1
    return starts[i] if i >= 0 and ends[i] >= ts - EPS_US else ts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="Chrome trace-event JSON file (object with traceEvents, or array)")
    ap.add_argument("out", help="PNG file to write")
    ap.add_argument("--width", type=float, default=14.0, help="figure width in inches (default 14)")
    ap.add_argument("--height", default="auto", help="figure height in inches, or 'auto' (default)")
    ap.add_argument("--max-arrows", type=int, default=400, help="skip flow arrows beyond this many (default 400)")
    ap.add_argument("--title", help="title text (default: trace file name)")
    a = ap.parse_args()
    if a.height != "auto":
        try:
            a.height = float(a.height)
        except ValueError:
            die(f"--height must be a number or 'auto', got {a.height!r}")
    if a.width <= 0 or (a.height != "auto" and a.height <= 0):
        die("--width and --height must be positive")

    events = load_events(a.trace)
    pnames, tnames, psort, tsort = {}, {}, {}, {}
    slices = defaultdict(list)  # (pid, tid) -> [(start_us, dur_us, name)]
    flow_s, flow_f, task_ids = {}, [], set()  # a task may have several member slices
    for e in events:
        ph, pid, tid = e.get("ph"), e.get("pid", 0), e.get("tid", 0)
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if not all(isinstance(x, (int, float, str)) for x in (pid, tid)):
            continue  # malformed ids; skip rather than crash
        if ph == "M":
            n = e.get("name")
            if n == "process_name":
                pnames[pid] = str(args.get("name", pid))
            elif n == "thread_name":
                tnames[(pid, tid)] = str(args.get("name", tid))
            elif n == "process_sort_index" and num(args.get("sort_index")) is not None:
                psort[pid] = num(args["sort_index"])
            elif n == "thread_sort_index" and num(args.get("sort_index")) is not None:
                tsort[(pid, tid)] = num(args["sort_index"])
        elif ph == "X" and num(e.get("ts")) is not None:
            slices[(pid, tid)].append((num(e["ts"]), max(num(e.get("dur")) or 0.0, 0.0), str(e.get("name", "?"))))
            task_ids.add(("task", str(args["task"])) if "task" in args else ("slice", id(e)))
        elif ph in ("s", "f") and num(e.get("ts")) is not None and "id" in e:
            key = (e.get("cat"), str(e["id"]))
            if ph == "s":
                flow_s.setdefault(key, e)
            else:
                flow_f.append((key, e))
    n_slices = sum(map(len, slices.values()))
    if n_slices == 0:
        die(f"{a.trace} contains no complete ('ph': 'X') slices to draw")

    tracks = sorted(slices, key=lambda k: (psort.get(k[0], 0), order_key(k[0]), tsort.get(k, 0), order_key(k[1])))
    row = {k: i for i, k in enumerate(tracks)}
    index = {}
    for k in tracks:
        slices[k].sort()
        index[k] = ([s for s, _, _ in slices[k]], [s + d for s, d, _ in slices[k]])
    t0 = min(s for v in index.values() for s in v[0])
    t1 = max(x for v in index.values() for x in v[1])

    pairs = []  # (src_track, src_x_us, dst_track, dst_x_us)
    for key, f in flow_f:
        s = flow_s.get(key)
        sk = (s.get("pid", 0), s.get("tid", 0)) if s else None
        fk = (f.get("pid", 0), f.get("tid", 0))
        if sk not in row or fk not in row:  # unmatched flow, or an end on a track without slices
            continue
        pairs.append((sk, snap(index[sk], num(s["ts"]), "src"), fk,
                      snap(index[fk], num(f["ts"]), "enc" if f.get("bp") == "e" else "next")))

    counts = Counter(n for v in slices.values() for _, _, n in v)
    colors = palette_colors(counts)
    legend_names = sorted(counts, key=lambda n: (-counts[n], n))[:MAX_LEGEND]
    height = a.height if a.height != "auto" else max(3.0, 1.6 + 0.32 * len(tracks), 0.9 + 0.2 * len(legend_names))
    fig, ax = plt.subplots(figsize=(a.width, height), dpi=120)

    dense = max(map(len, slices.values())) > a.width * 40  # roughly > 1 slice per 3 px
    prev_pid, shade = object(), True
    for k in tracks:
        if k[0] != prev_pid:
            prev_pid, shade = k[0], not shade
        if shade:
            ax.axhspan(row[k] - 0.5, row[k] + 0.5, color="0.94", zorder=0, lw=0)
        groups = defaultdict(list)
        for s, d, n in slices[k]:
            groups[n].append(((s - t0) / 1e3, d / 1e3))
        for n, bars in groups.items():
            # darker outline separates neighbours; in dense traces it would swamp the fill colours
            edge = colors[n] if dense else tuple(c * 0.6 for c in colors[n][:3])
            ax.broken_barh(bars, (row[k] - 0.38, 0.76), facecolors=colors[n], edgecolors=edge, lw=0.4, zorder=2)

    arrow_note = ""
    if len(pairs) > a.max_arrows:
        arrow_note = f" · {len(pairs)} dependency arrows not drawn (> --max-arrows {a.max_arrows})"
    elif pairs:
        arrow_note = f" · {len(pairs)} dependency arrows"
        for sk, sx, fk, fx in pairs:
            ax.annotate("", xy=((fx - t0) / 1e3, row[fk]), xytext=((sx - t0) / 1e3, row[sk]), zorder=3,
                        arrowprops=dict(arrowstyle="-|>", lw=0.5, color="0.15", alpha=0.45,
                                        mutation_scale=6, shrinkA=0, shrinkB=0))

    def label(k):
        text = f"{pnames.get(k[0], f'pid {k[0]}')} / {tnames.get(k, f'tid {k[1]}')}"
        return text if len(text) <= 60 else text[:57] + "..."

    ax.set_yticks(range(len(tracks)), [label(k) for k in tracks], fontsize=8)
    ax.set_ylim(len(tracks) - 0.5, -0.5)
    span_ms = (t1 - t0) / 1e3
    ax.set_xlim(0, span_ms * 1.01 if span_ms > 0 else 1.0)
    ax.set_xlabel("time since first event (ms)")
    ax.grid(axis="x", color="0.8", lw=0.5, zorder=1)
    ax.set_axisbelow(True)
    handles = [Patch(color=colors[n], label=f"{n} ({counts[n]})") for n in legend_names]
    if len(counts) > MAX_LEGEND:
        handles.append(Patch(color="white", label=f"... {len(counts) - MAX_LEGEND} more names"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False,
              title="callable (slices)", title_fontsize=8)
    title = a.title or os.path.basename(a.trace)
    tasks = f"{len(task_ids)} tasks" + (f" ({n_slices} slices)" if n_slices != len(task_ids) else "")
    ax.set_title(f"{title}\n{tasks} · {len(tracks)} tracks · span {span_ms:.3f} ms{arrow_note}", fontsize=10)
    try:
        fig.savefig(a.out, bbox_inches="tight")
    except OSError as e:
        die(f"cannot write {a.out}: {e.strerror or e}")
    print(f"wrote {a.out}: {n_slices} slices, {len(tracks)} tracks, {len(pairs)} flows, {span_ms:.3f} ms")


if __name__ == "__main__":
    main()
