//! `strata-tests`: strata's cross-process tests and the helpers they share.
//!
//! The tests (in `tests/cross/`) spawn the real `strata` binary, and
//! `strata-test-worker` (this package's own worker binary, built with user
//! kernels the way users build theirs), on private sockets in temporary
//! directories, and talk to them as an orchestrator would.

#![deny(unsafe_code)]

pub mod kernels;
pub mod losing;
pub mod runs_only;

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use memmap2::MmapMut;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use strata_client::Endpoint;
use strata_wire::{Access, AddressSpace, Backing, BufferDescriptor, IdentityMint};
use tempfile::TempDir;

/// The `strata` binary: `STRATA_BIN` when it is set, else this build's
/// (next to the test executable's `deps` folder; `cargo test --workspace`
/// builds it).
///
/// # Panics
/// When it has not been built.
pub fn strata_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("STRATA_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("strata");
    assert!(
        bin.exists(),
        "the strata binary is not built at {}: run `cargo build -p strata-cli` (`cargo test --workspace` builds it)",
        bin.display()
    );
    bin
}

/// The `strata-test-worker` binary: `STRATA_TEST_WORKER` when it is set
/// (a kit of prebuilt binaries run on another machine, as
/// `scripts/gpu-check.sh` does), else `built`, the build's own
/// (`env!("CARGO_BIN_EXE_strata-test-worker")` in the caller).
pub fn test_worker(built: &'static str) -> &'static Path {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        std::env::var_os("STRATA_TEST_WORKER").map_or_else(|| PathBuf::from(built), PathBuf::from)
    })
}

/// A worker process on a private socket, killed when dropped.
pub struct WorkerProcess {
    child: Child,
    /// Where it serves.
    pub endpoint: Endpoint,
    /// Its log (stderr).
    pub log_path: PathBuf,
    _dir: TempDir,
}

impl std::fmt::Debug for WorkerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WorkerProcess({}, pid {})",
            self.endpoint,
            self.child.id()
        )
    }
}

impl WorkerProcess {
    /// Starts `binary` with `prefix` arguments (`["worker"]` for `strata`),
    /// `--listen unix:<tmp>/w.sock` and `extra`, and waits for its ready
    /// line.
    ///
    /// # Panics
    /// When it does not become ready within 20 s.
    pub fn spawn_unix(binary: &Path, prefix: &[&str], extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("w.sock");
        let listen = format!("unix:{}", sock.display());
        Self::spawn(binary, prefix, &["--listen", &listen], extra, &[], dir)
    }

    /// As [`WorkerProcess::spawn_unix`], with `env` added to the worker's
    /// environment.
    ///
    /// # Panics
    /// When it does not become ready within 20 s.
    pub fn spawn_unix_with(
        binary: &Path,
        prefix: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("w.sock");
        let listen = format!("unix:{}", sock.display());
        Self::spawn(binary, prefix, &["--listen", &listen], extra, env, dir)
    }

    /// Starts `binary` listening on TCP loopback (port chosen by the OS).
    ///
    /// # Panics
    /// When it does not become ready within 20 s.
    pub fn spawn_tcp(binary: &Path, prefix: &[&str], extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::spawn(
            binary,
            prefix,
            &["--listen", "tcp:127.0.0.1:0"],
            extra,
            &[],
            dir,
        )
    }

    /// Starts `binary` listening on `listen` (`unix:PATH` or
    /// `tcp:HOST:PORT`): a worker restarted on the address of one that
    /// died.
    ///
    /// # Panics
    /// When it does not become ready within 20 s.
    pub fn spawn_listening(binary: &Path, prefix: &[&str], listen: &str, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::spawn(binary, prefix, &["--listen", listen], extra, &[], dir)
    }

    /// Sends SIGKILL and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn spawn(
        binary: &Path,
        prefix: &[&str],
        listen: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
        dir: TempDir,
    ) -> Self {
        let log_path = dir.path().join("worker.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let mut child = Command::new(binary)
            .args(prefix)
            .args(listen)
            .args(extra)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!(
                    "worker not ready in 20 s; log:\n{}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                )
            });
        let endpoint = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("listen="))
            .and_then(|e| e.parse().ok())
            .unwrap_or_else(|| panic!("ready line without listen=: {line}"));
        WorkerProcess {
            child,
            endpoint,
            log_path,
            _dir: dir,
        }
    }

    /// The worker's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Hangs the worker (SIGSTOP) and returns once all its threads have
    /// stopped: see [`hang_process`].
    pub fn hang(&self) {
        hang_process(self.pid());
    }

    /// Everything the worker logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Open fds of the worker process.
    pub fn fd_count(&self) -> usize {
        self.fds().len()
    }

    /// The worker's open fds and what each refers to (`readlink` of its
    /// `/proc` entry: `socket:[..]`, `/memfd:name (deleted)`, ...), sorted
    /// by number: what a leak test prints when a count does not match.
    pub fn fds(&self) -> Vec<(u32, String)> {
        let dir = format!("/proc/{}/fd", self.pid());
        let mut fds: Vec<(u32, String)> = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter_map(|e| {
                        let n = e.file_name().to_str()?.parse().ok()?;
                        let target = std::fs::read_link(e.path())
                            .map(|t| t.display().to_string())
                            .unwrap_or_else(|e| format!("? ({e})"));
                        Some((n, target))
                    })
                    .collect()
            })
            .unwrap_or_default();
        fds.sort();
        fds
    }

    /// Sends SIGTERM and waits up to `timeout` for the exit status.
    ///
    /// # Panics
    /// When the worker does not exit in time.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        let pid = Pid::from_raw(i32::try_from(self.pid()).expect("pid"));
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit within {timeout:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl WorkerProcess {
    /// Waits for the worker to exit by itself.
    ///
    /// # Panics
    /// When it has not exited within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit within {timeout:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Hangs process `pid` (SIGSTOP) and returns once every one of its threads
/// has stopped.
///
/// `kill(2)` only queues the signal: one thread takes it and stops the
/// others when it is next scheduled, and until then they run on. On a
/// loaded machine that is long enough for a worker to take a task sent
/// after the signal and run it, so a test that hangs a worker "before"
/// something waits here first.
///
/// # Panics
/// When the process does not stop within 20 s (or `pid` does not fit).
pub fn hang_process(pid: u32) {
    let target = Pid::from_raw(i32::try_from(pid).expect("pid"));
    kill(target, Signal::SIGSTOP).expect("SIGSTOP");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let states = thread_states(pid);
        // Exited threads (`Z`, `X`) take no part in the stop.
        if !states.is_empty() && states.iter().all(|s| matches!(s, 'T' | 'Z' | 'X')) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} not stopped 20 s after SIGSTOP; its threads' states: {states:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether every thread of process `pid` has exited: it is gone, or only
/// zombies (`Z`, `X`) are left of it. Not its main thread's state alone:
/// that shows a zombie as soon as the main thread exits, while the others
/// may still run.
pub fn process_exited(pid: u32) -> bool {
    thread_states(pid).iter().all(|s| matches!(s, 'Z' | 'X'))
}

/// The state letter (`R`, `S`, `T`, ...) of each thread of `pid`, from
/// `/proc`; empty when it is gone.
fn thread_states(pid: u32) -> Vec<char> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        // The state follows the command name, which is in parentheses
        // and may itself hold any character.
        .filter_map(|stat| stat[stat.rfind(')')? + 1..].trim_start().chars().next())
        .collect()
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A host buffer the way a driver makes one: an anonymous memfd, sealed
/// against shrinking and growing (a worker refuses an fd that could shrink
/// under its mapping), mapped shared here, described by a MEMFD descriptor
/// naming its inode.
pub struct SharedBuffer {
    file: std::fs::File,
    map: MmapMut,
    descriptor: BufferDescriptor,
}

impl std::fmt::Debug for SharedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBuffer({})", self.descriptor.identity())
    }
}

impl SharedBuffer {
    /// `nbytes` zero bytes with a fresh identity from `mint`.
    ///
    /// # Panics
    /// When the memfd cannot be made or mapped.
    pub fn new(mint: &IdentityMint, nbytes: u64, access: Access) -> Self {
        let mfd = memfd::MemfdOptions::default()
            .close_on_exec(true)
            .allow_sealing(true)
            .create("strata-test")
            .expect("memfd");
        mfd.as_file().set_len(nbytes).expect("set_len");
        mfd.add_seals(&[
            memfd::FileSeal::SealShrink,
            memfd::FileSeal::SealGrow,
            memfd::FileSeal::SealSeal,
        ])
        .expect("seals");
        let file = mfd.into_file();
        let meta = file.metadata().expect("fstat");
        let descriptor = BufferDescriptor::new(
            mint.mint().expect("identity"),
            nbytes,
            AddressSpace::Host,
            access,
            Backing::Memfd {
                st_dev: meta.dev(),
                st_ino: meta.ino(),
            },
        )
        .expect("descriptor");
        let map = map_shared(&file);
        SharedBuffer {
            file,
            map,
            descriptor,
        }
    }

    /// The descriptor.
    pub fn descriptor(&self) -> BufferDescriptor {
        self.descriptor
    }

    /// The memfd, to pass to a worker.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Writes `bytes` at `offset`.
    pub fn write(&mut self, offset: usize, bytes: &[u8]) {
        self.map[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    /// Reads `len` bytes at `offset`.
    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        self.map[offset..offset + len].to_vec()
    }
}

#[allow(unsafe_code)]
fn map_shared(file: &std::fs::File) -> MmapMut {
    // SAFETY: the file is a memfd this process created; other processes
    // that map it write only while we wait for their completions.
    unsafe { MmapMut::map_mut(file).expect("mmap") }
}

/// A TCP forwarder on loopback between a driver and a worker, whose
/// connections can be cut mid-stream (both directions shut down at once,
/// as when a link or a middlebox dies) and which refuses new ones until
/// healed.
pub struct TcpProxy {
    addr: std::net::SocketAddr,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl std::fmt::Debug for TcpProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TcpProxy({})", self.addr)
    }
}

impl TcpProxy {
    /// Forwards a fresh loopback port to `target`.
    ///
    /// # Panics
    /// When no port can be bound.
    pub fn start(target: std::net::SocketAddr) -> Self {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy port");
        let addr = listener.local_addr().expect("proxy address");
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (o, st, cs) = (open.clone(), stop.clone(), conns.clone());
        std::thread::spawn(move || {
            for down in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(down) = down else { continue };
                if !o.load(Ordering::SeqCst) {
                    let _ = down.shutdown(std::net::Shutdown::Both);
                    continue;
                }
                let Ok(up) = std::net::TcpStream::connect(target) else {
                    continue;
                };
                let _ = down.set_nodelay(true);
                let _ = up.set_nodelay(true);
                let mut keep = cs.lock().unwrap_or_else(|e| e.into_inner());
                for (from, to) in [(&down, &up), (&up, &down)] {
                    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
                        continue;
                    };
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                    });
                }
                keep.push(down);
                keep.push(up);
            }
        });
        TcpProxy {
            addr,
            open,
            stop,
            conns,
        }
    }

    /// Its endpoint, `tcp:127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("tcp:{}", self.addr)
    }

    /// Cuts every connection through it and refuses new ones.
    pub fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        let conns: Vec<_> = self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for c in conns {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Lets new connections through again.
    pub fn heal(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.cut();
        // Wakes the accept loop so that it sees `stop`.
        let _ = std::net::TcpStream::connect(self.addr);
    }
}
