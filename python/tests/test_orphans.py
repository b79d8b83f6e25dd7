"""Nothing outlives its driver: a Python driver SIGKILLed while its
spawned workers run a sleeping and a spinning Python kernel takes them
with it within a second, and leaves nothing in the temporary directory or
/dev/shm."""

import os
import signal
import subprocess
import sys
import time

from conftest import HERE, alive

DRIVER = """
import sys, time
sys.path.insert(0, {here!r})
import strata, pykernels
c = strata.Cluster(local=2, kernels=[pykernels.sleep, pykernels.spin])
x, y = c.zeros(4), c.zeros(4)
c.submit("test.sleep", x, 3600.0, on=0)
c.submit("test.spin", y, on=1)
print("pids=" + ",".join(str(w.pid) for w in c.workers), flush=True)
while True:
    time.sleep(3600)
"""


def test_a_killed_driver_takes_its_sleeping_and_spinning_workers_and_their_files(tmp_path):
    tmpdir, started = tmp_path / "tmp", tmp_path / "started"
    tmpdir.mkdir()
    started.mkdir()
    shm_before = set(os.listdir("/dev/shm"))
    env = dict(os.environ, TMPDIR=str(tmpdir), STRATA_TEST_STARTED=str(started))
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER.format(here=HERE)], stdout=subprocess.PIPE, text=True, env=env
    )
    pids = []
    try:
        line = driver.stdout.readline()
        assert line.startswith("pids="), f"the driver did not start: {line!r}"
        pids = [int(p) for p in line.strip()[len("pids=") :].split(",")]
        marks = [started / f"test.sleep.{pids[0]}", started / f"test.spin.{pids[1]}"]
        deadline = time.monotonic() + 60
        while not all(m.exists() for m in marks):
            assert time.monotonic() < deadline, "the kernels did not start"
            time.sleep(0.01)
        folders = [n for n in os.listdir(tmpdir) if n.startswith("strata-")]
        assert len(folders) == 1, folders
        assert (tmpdir / folders[0] / "strata-driver").exists()

        driver.send_signal(signal.SIGKILL)
        driver.wait()
        start = time.monotonic()
        while any(alive(p) for p in pids) and time.monotonic() - start < 1.0:
            time.sleep(0.002)
        took = time.monotonic() - start
        assert not any(alive(p) for p in pids), "workers still run 1 s after their driver was killed"
        print(f"workers gone {took * 1e3:.2f} ms after their driver was killed")
        assert os.listdir(tmpdir) == []
        assert set(os.listdir("/dev/shm")) - shm_before == set()
    finally:
        driver.kill()
        driver.wait()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)
