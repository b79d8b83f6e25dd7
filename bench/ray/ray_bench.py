#!/usr/bin/env python3
"""Ray side of the strata-vs-Ray benchmark comparison.

Run with the private venv made by bench/ray/install.sh:

    .bench/ray-venv/bin/python bench/ray/ray_bench.py [--quick] [--scenario NAME ...]

Prints one JSON object per line on stdout, one per measurement:

    {"system": "ray", "scenario": S, "variant": V, "params": {...},
     "value": number, "unit": U, "ok": bool, "detail": "short text"}

Everything else (Ray's own chatter, progress notes) goes to stderr.
"""

import argparse
import json
import logging
import os
import statistics
import sys
import time
import traceback

# Keep Ray quiet and local before it is imported.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

GIB = 1 << 30
MIB = 1 << 20
NUM_CPUS = 2
OBJECT_STORE_BYTES = 3 * GIB
SCENARIOS = ("throughput", "latency", "handoff")

# --------------------------------------------------------------------------
# Output: JSON goes to the *original* stdout; fd 1 is pointed at stderr so that
# nothing Ray (or a child process it spawns) writes can corrupt the JSON stream.
# --------------------------------------------------------------------------
_json_out = None


def _isolate_stdout():
    global _json_out
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    _json_out = os.fdopen(saved, "w", buffering=1)
    sys.stdout = sys.stderr


def emit(scenario, variant, params, value, unit, ok, detail):
    rec = {
        "system": "ray",
        "scenario": scenario,
        "variant": variant,
        "params": params,
        "value": (round(value, 3) if isinstance(value, float) else value),
        "unit": unit,
        "ok": bool(ok),
        "detail": detail,
    }
    _json_out.write(json.dumps(rec) + "\n")
    _json_out.flush()


def note(msg):
    print(f"[ray_bench] {msg}", file=sys.stderr, flush=True)


def short_err(exc):
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text[:300]


# --------------------------------------------------------------------------
# Ray set-up
# --------------------------------------------------------------------------
def pick_store_dir(forced=None):
    """Use /dev/shm when it can hold the whole object store, else /tmp."""
    if forced:
        return forced, f"store={forced} (forced by --plasma-dir)"
    try:
        st = os.statvfs("/dev/shm")
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    if free >= OBJECT_STORE_BYTES:
        return None, f"store=/dev/shm ({free / GIB:.1f}GiB free)"
    return "/tmp", f"store=/tmp (/dev/shm only {free / GIB:.1f}GiB free)"


def start_ray(ray, forced_dir=None):
    plasma_dir, store_note = pick_store_dir(forced_dir)
    kwargs = dict(
        num_cpus=NUM_CPUS,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
        object_store_memory=OBJECT_STORE_BYTES,
        configure_logging=True,
    )
    if plasma_dir is not None:
        kwargs["_plasma_directory"] = plasma_dir
    t0 = time.perf_counter()
    ray.init(**kwargs)
    return store_note, time.perf_counter() - t0


# --------------------------------------------------------------------------
# Scenarios. Remote functions/actors are defined lazily (after `import ray`).
# --------------------------------------------------------------------------
def define_remotes(ray):
    @ray.remote(num_cpus=1)
    def noop():
        return 1

    @ray.remote(num_cpus=1)
    def inc(prev):
        return prev + 1

    @ray.remote(num_cpus=1)
    def read(arr):
        return int(arr[0]) + int(arr[-1]), int(arr.nbytes)

    @ray.remote(num_cpus=1)
    class Worker:
        def noop(self):
            return 1

        def inc(self, prev):
            return prev + 1

        def pid(self):
            return os.getpid()

    return noop, inc, read, Worker


def make_actors(ray, Worker):
    actors = [Worker.remote(), Worker.remote()]
    # Warm-up: wait for both actor processes to start and serve a few calls.
    pids = ray.get([a.pid.remote() for a in actors])
    ray.get([a.noop.remote() for a in actors for _ in range(20)])
    return actors, pids


def kill_actors(ray, actors):
    for a in actors:
        try:
            ray.kill(a)
        except Exception:  # noqa: BLE001
            pass
    # Give the raylet a moment to release the actors' CPUs.
    time.sleep(0.5)


def warm_tasks(ray, noop):
    # Start both task workers and exercise the submit/get path.
    ray.get([noop.remote() for _ in range(200)])


def scenario_throughput(ray, remotes, quick, store_note):
    noop, _inc, _read, Worker = remotes
    n = 10_000 if quick else 100_000
    params = {"n": n, "num_cpus": NUM_CPUS, "workers": 2}

    # --- variant: tasks -------------------------------------------------
    try:
        warm_tasks(ray, noop)
        t0 = time.perf_counter()
        refs = [noop.remote() for _ in range(n)]
        t_sub = time.perf_counter() - t0
        results = ray.get(refs)
        wall = time.perf_counter() - t0
        ok = len(results) == n and sum(results) == n
        emit("throughput", "tasks", params, n / wall, "tasks/s", ok,
             f"{len(results)}/{n} results; wall {wall:.3f}s (submit {t_sub:.3f}s); {store_note}")
        del refs, results
    except Exception as exc:  # noqa: BLE001
        emit("throughput", "tasks", params, 0, "tasks/s", False, short_err(exc))

    # --- variant: actor_calls -------------------------------------------
    actors = []
    try:
        actors, _pids = make_actors(ray, Worker)
        t0 = time.perf_counter()
        refs = [actors[i & 1].noop.remote() for i in range(n)]
        t_sub = time.perf_counter() - t0
        results = ray.get(refs)
        wall = time.perf_counter() - t0
        ok = len(results) == n and sum(results) == n
        emit("throughput", "actor_calls", {**params, "actors": 2}, n / wall, "tasks/s", ok,
             f"{len(results)}/{n} results; 2 actors round-robin; wall {wall:.3f}s "
             f"(submit {t_sub:.3f}s); {store_note}")
        del refs, results
    except Exception as exc:  # noqa: BLE001
        emit("throughput", "actor_calls", {**params, "actors": 2}, 0, "tasks/s", False,
             short_err(exc))
    finally:
        kill_actors(ray, actors)


def scenario_latency(ray, remotes, quick, store_note):
    noop, inc, _read, Worker = remotes
    n = 1_000 if quick else 10_000
    params = {"n": n, "workers": 2}

    # --- variant: tasks: chain of dependent tasks, placement left to Ray ---
    try:
        warm_tasks(ray, noop)
        ray.get(inc.remote(inc.remote(0)))
        t0 = time.perf_counter()
        prev = inc.remote(0)
        for _ in range(n - 1):
            prev = inc.remote(prev)
        final = ray.get(prev)
        wall = time.perf_counter() - t0
        emit("latency", "tasks", params, wall / n * 1e6, "us/hop", final == n,
             f"final={final} expected={n}; wall {wall:.3f}s; worker placement chosen by Ray "
             f"(tasks cannot be pinned to a worker); {store_note}")
    except Exception as exc:  # noqa: BLE001
        emit("latency", "tasks", params, 0, "us/hop", False, short_err(exc))

    # --- variant: actors: A and B strictly alternate ------------------------
    actors = []
    try:
        actors, pids = make_actors(ray, Worker)
        a, b = actors
        ray.get(b.inc.remote(a.inc.remote(0)))
        t0 = time.perf_counter()
        prev = a.inc.remote(0)
        for i in range(1, n):
            prev = (b if i & 1 else a).inc.remote(prev)
        final = ray.get(prev)
        wall = time.perf_counter() - t0
        emit("latency", "actors", {**params, "actors": 2}, wall / n * 1e6, "us/hop", final == n,
             f"final={final} expected={n}; wall {wall:.3f}s; actors A/B alternate "
             f"(pids {pids[0]}/{pids[1]}), each call gets previous ObjectRef; {store_note}")
    except Exception as exc:  # noqa: BLE001
        emit("latency", "actors", {**params, "actors": 2}, 0, "us/hop", False, short_err(exc))
    finally:
        kill_actors(ray, actors)


def scenario_handoff(ray, remotes, quick, store_note):
    import numpy as np

    _noop, _inc, read, _Worker = remotes
    sizes = [("1MiB", MIB), ("64MiB", 64 * MIB)]
    if not quick:
        sizes.append(("1GiB", GIB))

    # Warm-up: start a worker, exercise put + zero-copy read once.
    try:
        small = np.ones(4096, dtype=np.uint8)
        ray.get(read.remote(ray.put(small)))
        del small
    except Exception as exc:  # noqa: BLE001
        note(f"handoff warm-up failed: {short_err(exc)}")

    for label, nbytes in sizes:
        reps = 3 if nbytes >= GIB else 5
        params = {"bytes": nbytes, "dtype": "uint8", "reps": reps}
        arr = None
        try:
            # Prepared before timing; np.full touches every page.
            arr = np.full(nbytes, 1, dtype=np.uint8)
            arr[0], arr[-1] = 3, 5
            expected = (8, nbytes)
            totals, puts, ok = [], [], True
            for _ in range(reps):
                t0 = time.perf_counter()
                ref = ray.put(arr)
                t1 = time.perf_counter()
                got = ray.get(read.remote(ref))
                t2 = time.perf_counter()
                ok = ok and tuple(got) == expected
                puts.append((t1 - t0) * 1e3)
                totals.append((t2 - t0) * 1e3)
                del ref  # free the object-store copy before the next rep
            fmt = lambda xs: "/".join(f"{x:.1f}" for x in xs)  # noqa: E731
            emit("handoff", label, params, statistics.median(totals), "ms", ok,
                 f"put alone median {statistics.median(puts):.3f}ms; "
                 f"per-rep total ms {fmt(totals)}, put ms {fmt(puts)}; "
                 f"task returns arr[0]+arr[-1], nbytes; {store_note}")
        except Exception as exc:  # noqa: BLE001
            emit("handoff", label, params, 0, "ms", False, short_err(exc))
        finally:
            del arr


RUNNERS = {
    "throughput": scenario_throughput,
    "latency": scenario_latency,
    "handoff": scenario_handoff,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    ap.add_argument("--scenario", action="append", choices=SCENARIOS,
                    help="scenario to run (repeatable; default: all)")
    ap.add_argument("--plasma-dir", metavar="DIR",
                    help="force Ray's object-store directory (default: /dev/shm if it has "
                         "room for the 3 GiB store, else /tmp)")
    args = ap.parse_args()
    selected = args.scenario or list(SCENARIOS)

    _isolate_stdout()

    try:
        import ray
    except Exception as exc:  # noqa: BLE001
        for s in selected:
            emit(s, "setup", {}, 0, "", False, f"import ray failed: {short_err(exc)}")
        return 1

    try:
        store_note, t_init = start_ray(ray, args.plasma_dir)
        note(f"ray {ray.__version__} started in {t_init:.1f}s; {store_note}")
    except Exception as exc:  # noqa: BLE001
        for s in selected:
            emit(s, "setup", {}, 0, "", False, f"ray.init failed: {short_err(exc)}")
        return 1

    try:
        remotes = define_remotes(ray)
        for s in selected:
            note(f"scenario {s} ({'quick' if args.quick else 'full'})")
            t0 = time.perf_counter()
            try:
                RUNNERS[s](ray, remotes, args.quick, store_note)
            except Exception as exc:  # noqa: BLE001  (runners catch per variant)
                traceback.print_exc()
                emit(s, "error", {}, 0, "", False, short_err(exc))
            note(f"scenario {s} done in {time.perf_counter() - t0:.1f}s")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
