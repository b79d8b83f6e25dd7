//! Local workers the cluster spawns itself: one `strata worker` process
//! per chip, on private sockets in a temporary directory (mode 0700,
//! marked as this driver's: see [`crate::driver_dir`]), logging to files
//! there, killed and reaped when the cluster goes. They hold a pipe from
//! the driver as stdin and exit at once when it closes, so they do not
//! outlive a driver that is killed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use strata_client::Endpoint;
use tempfile::TempDir;

use crate::error::ClusterError;

/// The `strata` binary to run workers with: `$STRATA_BIN`, this program
/// if it is `strata`, a `strata` next to this program or one folder up
/// (cargo's `target/<profile>/` from an example or a test), or `strata` on
/// the `PATH`.
pub fn default_worker_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("STRATA_BIN") {
        return Some(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if exe.file_name().is_some_and(|n| n == "strata") {
            return Some(exe);
        }
        let mut dir = exe.parent();
        for _ in 0..2 {
            let Some(d) = dir else { break };
            let cand = d.join("strata");
            if cand.is_file() {
                return Some(cand);
            }
            dir = d.parent();
        }
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("strata"))
            .find(|p| p.is_file())
    })
}

struct Spawned {
    child: Child,
    /// The worker's stdin: it exits when this closes, so it does not
    /// outlive the driver even if the driver is killed.
    stdin: Option<std::process::ChildStdin>,
    log: PathBuf,
    drain: Option<JoinHandle<()>>,
}

/// Worker processes this cluster started.
pub(crate) struct LocalWorkers {
    spawned: Vec<Spawned>,
    dir: Option<TempDir>,
    binary: PathBuf,
    /// Arguments before `worker` ([`crate::ClusterBuilder::worker_command`]).
    binary_args: Vec<std::ffi::OsString>,
    /// The device spec of each chip's worker.
    devices: Vec<String>,
    ready_timeout: Duration,
}

impl std::fmt::Debug for LocalWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalWorkers({:?})", self.pids())
    }
}

/// A worker just started: its ready line arrives on `ready`.
pub(crate) struct Starting {
    pub(crate) chip: usize,
    ready: mpsc::Receiver<String>,
}

impl Starting {
    /// Waits up to `timeout` for the ready line (no lock held meanwhile).
    pub(crate) fn wait(&self, timeout: Duration) -> Option<String> {
        self.ready.recv_timeout(timeout).ok()
    }
}

impl LocalWorkers {
    /// Starts a worker of `binary` per entry of `devices`, chip `i` on
    /// `devices[i]`, and waits for each one's ready line (at most
    /// `timeout` overall).
    pub(crate) fn spawn(
        binary: &Path,
        binary_args: &[std::ffi::OsString],
        devices: &[String],
        timeout: Duration,
    ) -> Result<(Self, Vec<Endpoint>), ClusterError> {
        let dir = crate::driver_dir::create()?;
        let mut me = LocalWorkers {
            spawned: Vec::new(),
            dir: Some(dir),
            binary: binary.to_path_buf(),
            binary_args: binary_args.to_vec(),
            devices: devices.to_vec(),
            ready_timeout: timeout,
        };
        let mut starting = Vec::new();
        for chip in 0..devices.len() {
            starting.push(me.start(chip)?);
        }
        let deadline = Instant::now() + timeout;
        let mut endpoints = Vec::new();
        for s in starting {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = s.wait(left);
            endpoints.push(me.endpoint_of(s.chip, line, left)?);
        }
        Ok((me, endpoints))
    }

    /// Starts (or, after it was lost, restarts) the worker of `chip` on its
    /// socket; [`Starting::wait`] then waits for it.
    pub(crate) fn start(&mut self, chip: usize) -> Result<Starting, ClusterError> {
        let Some(dir) = &self.dir else {
            return Err(ClusterError::WorkersShutDown);
        };
        let Some(device) = self.devices.get(chip) else {
            return Err(ClusterError::NoProcess { chip });
        };
        // The worker before goes first, killed and reaped before its stdin
        // closes: a worker whose stdin closes removes its socket and log,
        // which are then the new one's.
        if let Some(old) = self.spawned.get_mut(chip) {
            let _ = old.child.kill();
            let _ = old.child.wait();
            old.stdin = None;
            if let Some(d) = old.drain.take() {
                let _ = d.join();
            }
        }
        let sock = dir.path().join(format!("chip{chip}.sock"));
        let log = dir.path().join(format!("chip{chip}.log"));
        // A restarted worker appends to the log of the one before.
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|source| ClusterError::Log {
                path: log.clone(),
                source,
            })?;
        let mut cmd = Command::new(&self.binary);
        cmd.args(&self.binary_args)
            .arg("worker")
            .arg("--chip")
            .arg(chip.to_string())
            .arg("--device")
            .arg(device)
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--exit-with-stdin")
            .arg("--driver-dir")
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        let mut child = cmd.spawn().map_err(|source| ClusterError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        let stdout = child.stdout.take();
        let stdin = child.stdin.take();
        let (tx, ready) = mpsc::channel::<String>();
        // Reads the ready line, then drains stdout until the worker
        // exits, so the pipe never fills.
        let drain = std::thread::spawn(move || {
            let Some(out) = stdout else { return };
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                let _ = tx.send(line);
            }
        });
        let fresh = Spawned {
            child,
            stdin,
            log,
            drain: Some(drain),
        };
        if let Some(old) = self.spawned.get_mut(chip) {
            *old = fresh;
        } else {
            self.spawned.push(fresh);
        }
        Ok(Starting { chip, ready })
    }

    /// The endpoint a started worker's ready line names, or why there is
    /// none (`line` is `None` when it did not come within `timeout`).
    pub(crate) fn endpoint_of(
        &mut self,
        chip: usize,
        line: Option<String>,
        timeout: Duration,
    ) -> Result<Endpoint, ClusterError> {
        let line = line.ok_or_else(|| {
            let (exited, log) = match self.spawned.get_mut(chip) {
                Some(w) => (w.child.try_wait().ok().flatten(), tail(&w.log)),
                None => (None, String::new()),
            };
            ClusterError::NotReady {
                chip,
                binary: self.binary.clone(),
                exited,
                timeout,
                log,
            }
        })?;
        match line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("listen="))
            .and_then(|e| e.parse().ok())
        {
            Some(endpoint) => Ok(endpoint),
            None => Err(ClusterError::ReadyLine { chip, line }),
        }
    }

    /// How long a worker may take to be ready.
    pub(crate) fn ready_timeout(&self) -> Duration {
        self.ready_timeout
    }

    /// The log file of `chip`'s worker.
    pub(crate) fn log_path(&self, chip: usize) -> Option<PathBuf> {
        self.spawned.get(chip).map(|s| s.log.clone())
    }

    /// The pid of `chip`'s worker now.
    pub(crate) fn pid(&self, chip: usize) -> Option<u32> {
        self.spawned.get(chip).map(|s| s.child.id())
    }

    /// Process ids, in chip order.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.spawned.iter().map(|s| s.child.id()).collect()
    }

    /// Log files, in chip order.
    pub(crate) fn logs(&self) -> Vec<PathBuf> {
        self.spawned.iter().map(|s| s.log.clone()).collect()
    }

    /// The last lines of worker `i`'s log.
    pub(crate) fn log_tail(&self, i: usize) -> String {
        self.spawned
            .get(i)
            .map(|s| tail(&s.log))
            .unwrap_or_default()
    }

    /// Closes every worker's stdin (a worker then exits at once, removing
    /// its files) and sends SIGTERM, waits up to `grace` for them to exit,
    /// then SIGKILLs; reaps them all and removes the temporary directory.
    pub(crate) fn shutdown(&mut self, grace: Duration) {
        for s in &mut self.spawned {
            s.stdin = None;
            if let Ok(pid) = i32::try_from(s.child.id()) {
                if s.child.try_wait().ok().flatten().is_none() {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
                }
            }
        }
        let deadline = Instant::now() + grace;
        for s in &mut self.spawned {
            loop {
                match s.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = s.child.kill();
                        let _ = s.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            if let Some(d) = s.drain.take() {
                let _ = d.join();
            }
        }
        self.spawned.clear();
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

impl Drop for LocalWorkers {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(2));
    }
}

pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
