"""wait_all releases the GIL, and Ctrl-C interrupts it promptly, leaving
no worker behind."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import strata
from conftest import alive

HERE = os.path.dirname(os.path.abspath(__file__))


def test_wait_all_releases_the_gil(local2):
    c = local2
    a = c.zeros(4)
    for _ in range(3):
        c.submit("test.sleep", a, 0.15)
    counted = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counted[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    start = time.monotonic()
    c.wait_all()
    took = time.monotonic() - start
    at_end = counted[0]
    stop.set()
    t.join()
    assert took >= 0.4
    # A Python thread that needs the GIL ran all along.
    assert at_end > 100_000, at_end


# Ctrl-C raises KeyboardInterrupt only where Python installed its handler,
# which it does not when the process starts with SIGINT ignored (as a
# shell's background job does): the tests install it themselves.
SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {here!r})
    import strata, pykernels
    c = strata.Cluster(local=2, kernels=[pykernels.sleep])
    a = c.zeros(4)
    for _ in range(200):
        c.submit("test.sleep", a, 0.05)
    print("pids", *[w.pid for w in c.workers], flush=True)
    try:
        c.wait_all()
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", time.monotonic(), flush=True)
        c.close()
        print("closed", time.monotonic(), flush=True)
    """
)


def test_ctrl_c_interrupts_wait_all_and_leaves_no_worker():
    p = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(here=HERE)],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = p.stdout.readline()
    assert line.startswith("pids"), line
    pids = [int(x) for x in line.split()[1:]]
    assert all(alive(pid) for pid in pids)
    time.sleep(0.5)  # well inside the 10 s of work
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    out = p.stdout.readline()
    assert out.startswith("interrupted"), out
    interrupted = float(out.split()[1])
    assert interrupted - sent < 1.0, interrupted - sent
    closed = p.stdout.readline()
    assert closed.startswith("closed"), closed
    p.wait(10)
    assert p.returncode == 0
    deadline = time.monotonic() + 2
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt here, whatever this process started
    with (see SCRIPT)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_wait_all_after_an_interrupt_still_reports_the_whole_run(local2, ctrl_c_raises):
    c = local2
    a = c.zeros(4)
    b = c.zeros(4)
    c.submit("test.sleep", a, 0.3)
    c.submit("test.fail", a)  # after the sleep (reads a): fails
    c.submit("fill", b, 2.0)
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        c.wait_all()
        raise AssertionError("not interrupted")
    except KeyboardInterrupt:
        pass
    # The interrupted wait's request is taken over: the run's first
    # failure and its figures are not lost.
    try:
        c.wait_all()
        raise AssertionError("the failure was lost")
    except strata.TaskFailed as e:
        assert e.callable == "test.fail@1"
    s = c.wait_all()
    assert s.submitted == 0
    assert (b.numpy() == 2).all()


def test_waits_give_up_after_their_timeout_and_the_tasks_go_on(local2):
    c = local2
    a = c.zeros(4)
    t = c.submit("test.sleep", a, 0.8)
    t0 = time.monotonic()
    with pytest.raises(strata.WaitTimeout, match=r"the run is unfinished after timeout=0\.1 s") as e:
        c.wait_all(timeout=0.1)
    assert isinstance(e.value, TimeoutError)
    assert time.monotonic() - t0 < 0.6
    with pytest.raises(strata.WaitTimeout, match=f"task {t.id} is unfinished"):
        t.wait(timeout=0.05)
    with pytest.raises(strata.WaitTimeout):
        c.wait(t, timeout=0)
    # What was waited for went on: waiting again collects it.
    t.wait(timeout=10)
    s = c.wait_all(timeout=10)
    assert s.failed == 0
    assert (a.numpy() == 1).all()
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(strata.Error, match="timeout"):
            c.wait_all(timeout=bad)
        with pytest.raises(strata.Error, match="timeout"):
            t.wait(timeout=bad)


def test_close_from_another_thread_ends_a_blocked_wait_all_at_once():
    import pykernels

    c = strata.Cluster(local=1, kernels=[pykernels.sleep])
    x = c.zeros(4)
    c.submit("test.sleep", x, 6.0)
    got = []

    def waiter():
        try:
            c.wait_all()
        except Exception as e:  # noqa: BLE001 - the test looks at it
            got.append(e)

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    c.close()
    took = time.monotonic() - t0
    th.join(10)
    assert not th.is_alive()
    # It did not wait for the 6 s task.
    assert took < 3, took
    assert len(got) == 1 and isinstance(got[0], strata.ClusterClosed), got
    assert "closed while waiting" in str(got[0])
    assert c.closed
