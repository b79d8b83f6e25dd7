//! Nothing outlives its driver: a driver SIGKILLed while its
//! spawned workers run a sleeping and a spinning kernel takes them with it
//! within a second, and leaves nothing in the temporary directory or
//! `/dev/shm`; a folder that a crash did leave behind is swept by the next
//! driver that starts, and a running driver's folder is not.
//!
//! The driver is `strata-test-driver`, a process of its own with a private
//! `TMPDIR`, so that what is left there is its doing alone.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use strata_tests::process_exited;

/// The driver process and its workers, killed if a test fails half-way.
struct Driver {
    child: Child,
    workers: Vec<u32>,
}

impl Driver {
    /// Starts `strata-test-driver` with `tmpdir` as its temporary
    /// directory and waits (up to 60 s) until both kernels run.
    fn start(tmpdir: &Path, started: &Path) -> Driver {
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata-test-driver"))
            .env("TMPDIR", tmpdir)
            .env("STRATA_TEST_STARTED", started)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn strata-test-driver");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut driver = Driver {
            child,
            workers: Vec::new(),
        };
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the driver's pids line");
        driver.workers = line
            .trim()
            .strip_prefix("pids=")
            .unwrap_or_else(|| panic!("not a pids line: {line:?}"))
            .split(',')
            .map(|p| p.parse().expect("a pid"))
            .collect();
        assert_eq!(driver.workers.len(), 2, "{line:?}");
        let marks = [
            started.join(format!("test.sleep.{}", driver.workers[0])),
            started.join(format!("test.spin.{}", driver.workers[1])),
        ];
        let deadline = Instant::now() + Duration::from_secs(60);
        while !marks.iter().all(|m| m.exists()) {
            assert!(Instant::now() < deadline, "the kernels did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        driver
    }

    fn sigkill(&mut self) {
        kill(pid(self.child.id()), Signal::SIGKILL).expect("kill the driver");
        self.child.wait().expect("reap the driver");
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for &w in &self.workers {
            if !process_exited(w) {
                let _ = kill(pid(w), Signal::SIGKILL);
            }
        }
    }
}

fn pid(p: u32) -> Pid {
    Pid::from_raw(i32::try_from(p).expect("a pid fits i32"))
}

/// Waits up to `limit` for every process of `pids` to end; how long it took.
fn wait_gone(pids: &[u32], limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    loop {
        if pids.iter().all(|&p| process_exited(p)) {
            return Some(t0.elapsed());
        }
        if t0.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A private temporary directory for a driver, and a folder where its
/// kernels say they started.
fn scene() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = tempfile::tempdir().expect("tempdir");
    let tmpdir = root.path().join("tmp");
    let started = root.path().join("started");
    std::fs::create_dir(&tmpdir).expect("tmp");
    std::fs::create_dir(&started).expect("started");
    (root, tmpdir, started)
}

/// The one `strata-*` folder of `tmpdir` (the driver's).
fn driver_folder(tmpdir: &Path) -> PathBuf {
    let folders: Vec<String> = entries(tmpdir)
        .into_iter()
        .filter(|n| n.starts_with("strata-"))
        .collect();
    assert_eq!(folders.len(), 1, "{folders:?}");
    tmpdir.join(&folders[0])
}

#[test]
fn a_killed_driver_takes_its_sleeping_and_spinning_workers_and_their_files() {
    let (_root, tmpdir, started) = scene();
    let shm_before = entries(Path::new("/dev/shm"));
    let mut driver = Driver::start(&tmpdir, &started);
    let folder = driver_folder(&tmpdir);
    let files = entries(&folder);
    for f in [
        "strata-driver",
        "chip0.sock",
        "chip0.sock.fd",
        "chip0.log",
        "chip1.sock",
        "chip1.log",
    ] {
        assert!(files.contains(f), "{f} is not in {files:?}");
    }
    let workers = driver.workers.clone();
    assert!(workers.iter().all(|&w| !process_exited(w)));
    driver.sigkill();
    let took = wait_gone(&workers, Duration::from_secs(1)).unwrap_or_else(|| {
        panic!("workers {workers:?} still run 1 s after their driver was killed")
    });
    eprintln!(
        "workers gone {:.2} ms after their driver was killed",
        took.as_secs_f64() * 1e3
    );
    assert_eq!(
        entries(&tmpdir),
        BTreeSet::new(),
        "left in the temporary directory"
    );
    let new_in_shm: Vec<String> = entries(Path::new("/dev/shm"))
        .difference(&shm_before)
        .cloned()
        .collect();
    assert!(new_in_shm.is_empty(), "new in /dev/shm: {new_in_shm:?}");
}

/// This process's `pid=… start=…` marker text.
fn own_marker() -> String {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let (_, rest) = stat.rsplit_once(')').expect("stat fields");
    let start = rest.split_whitespace().nth(19).expect("start time");
    format!("pid={} start={start}\n", std::process::id())
}

#[test]
fn the_next_driver_sweeps_a_dead_drivers_folder_and_keeps_a_live_ones() {
    let (_root, tmpdir, started) = scene();
    // A crash that leaves a folder behind: the workers are killed with
    // their driver, so none of them cleans up.
    let mut crashed = Driver::start(&tmpdir, &started);
    let stale = driver_folder(&tmpdir);
    for &w in &crashed.workers {
        kill(pid(w), Signal::SIGKILL).expect("kill a worker");
    }
    crashed.sigkill();
    assert!(
        wait_gone(&crashed.workers, Duration::from_secs(5)).is_some(),
        "killed workers still run"
    );
    assert!(
        stale.join("strata-driver").exists() && stale.join("chip0.log").exists(),
        "the crash left nothing to sweep: {:?}",
        entries(&stale)
    );
    // A running driver's folder (this process's), and a folder that is
    // not a strata driver's at all.
    let live = tmpdir.join("strata-live");
    std::fs::create_dir(&live).unwrap();
    std::fs::write(live.join("strata-driver"), own_marker()).unwrap();
    let foreign = tmpdir.join("strata-foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("data"), "not ours").unwrap();

    let mut next = Driver::start(&tmpdir, &started);
    assert!(!stale.exists(), "the dead driver's folder is still there");
    assert!(
        live.join("strata-driver").exists(),
        "a live driver's folder was swept"
    );
    assert!(
        foreign.join("data").exists(),
        "a folder without marker was swept"
    );
    let workers = next.workers.clone();
    next.sigkill();
    assert!(wait_gone(&workers, Duration::from_secs(1)).is_some());
    assert_eq!(
        entries(&tmpdir),
        BTreeSet::from(["strata-foreign".to_owned(), "strata-live".to_owned()]),
    );
}
