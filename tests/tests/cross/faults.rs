//! Faults a running cluster meets: a worker restarted on its
//! address rejoining, a connection cut mid-stream, and a link taken down
//! between hosts in separate network namespaces. Results are checked
//! against the same job run on one worker with nothing going wrong.

use std::path::Path;
use std::time::{Duration, Instant};

use strata_orchestrator::{Cluster, Error, Outcome, Task, TaskHandle, View, WorkerId};
use strata_tests::{TcpProxy, WorkerProcess};
use strata_wire::DType;
use strata_wire::check::Rng;

pub(crate) fn test_worker_bin() -> &'static Path {
    strata_tests::test_worker(env!("CARGO_BIN_EXE_strata-test-worker"))
}

pub(crate) const TOKEN: &str = "faults-token";

pub(crate) fn token_file(dir: &Path) -> String {
    let p = dir.join("token");
    std::fs::write(&p, format!("{TOKEN}\n")).unwrap();
    p.to_str().unwrap().to_owned()
}

/// A job with a known result: `rows` rows of 64 random bytes, each hashed
/// twice in a chain (`test.hash.rw`: input row → middle row → output
/// row, so consecutive stages may run on different workers), with a
/// `ms`-long `test.sleep` beside each row to keep the workers busy. Every
/// task is placed by the scheduler and writes only OUTPUT, so the retry
/// policy may rerun it.
struct HashJob {
    out: View,
    tasks: Vec<TaskHandle>,
}

fn submit_hash_job(cluster: &Cluster, rows: u32, ms: u64, seed: u64) -> HashJob {
    let n = u64::from(rows) * 64;
    let mut rng = Rng(seed);
    let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
    let input = cluster.buffer_from_bytes(&bytes).unwrap();
    let middle = cluster.buffer(n).unwrap();
    let out = cluster.buffer(n).unwrap();
    let mut tasks = Vec::new();
    for r in 0..rows {
        let at = u64::from(r) * 64;
        let row = |b: &strata_orchestrator::Buffer| b.tensor_at(at, &[64], DType::U8).unwrap();
        tasks.push(
            cluster
                .submit(
                    Task::new("test.hash.rw")
                        .input(&row(&input))
                        .output(&row(&middle))
                        .scalar_u64(u64::from(r)),
                )
                .unwrap(),
        );
        tasks.push(
            cluster
                .submit(
                    Task::new("test.hash.rw")
                        .input(&row(&middle))
                        .output(&row(&out))
                        .scalar_u64(u64::from(rows + r)),
                )
                .unwrap(),
        );
        if ms > 0 {
            tasks.push(
                cluster
                    .submit(Task::new("test.sleep").scalar_u64(ms))
                    .unwrap(),
            );
        }
    }
    HashJob {
        out: out.tensor(&[u32::try_from(n).unwrap()], DType::U8).unwrap(),
        tasks,
    }
}

/// The job's result on one local worker with nothing going wrong.
fn reference(rows: u32, seed: u64) -> Vec<u8> {
    let c = Cluster::builder()
        .local(1)
        .worker_binary(test_worker_bin())
        .start()
        .unwrap();
    let job = submit_hash_job(&c, rows, 0, seed);
    c.wait_all().unwrap();
    job.out.read_elements().unwrap()
}

/// A connection of its own to a worker, to read its counters (one
/// session, counted among the worker's sessions).
struct Probe {
    rt: tokio::runtime::Runtime,
    client: strata_client::WorkerClient,
}

impl Probe {
    fn new(endpoint: &str, token: Option<&str>) -> Probe {
        let ep: strata_client::Endpoint = endpoint.parse().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let client = rt.block_on(async {
            let mut c = strata_client::WorkerClient::connect(&ep, token)
                .await
                .unwrap();
            c.handshake().await.unwrap();
            c
        });
        Probe { rt, client }
    }

    fn stats(&mut self) -> strata_proto::convert::WorkerStats {
        self.rt.block_on(self.client.stats()).unwrap()
    }
}

/// A cluster of workers it connects to (not spawns), in order, each
/// address with its token, with the retry policy `retry`.
fn connected(workers: &[(&str, Option<&str>)], retry: u32) -> Cluster {
    let mut b = Cluster::builder().retry(retry);
    for (address, token) in workers {
        b = b.connect(address, *token).unwrap();
    }
    b.start().unwrap()
}

/// Polls `f` every 5 ms for up to `limit`; how long it took.
pub(crate) fn within(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A worker SIGKILLed under its tasks and restarted on the same address
/// rejoins: its tasks fail naming it, the job goes on without it, and once
/// it is back the cluster uses it again; device buffers it held before
/// are refused with the reason.
fn restart_and_rejoin(tcp: bool) {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let (listen, auth): (String, Vec<&str>) = if tcp {
        ("tcp:127.0.0.1:0".into(), vec!["--token-file", &token])
    } else {
        (
            format!("unix:{}", dir.path().join("w.sock").display()),
            vec![],
        )
    };
    let stay = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let mut w = WorkerProcess::spawn_listening(test_worker_bin(), &[], &listen, &auth);
    // A TCP worker restarts on the port it got the first time.
    let address = w.endpoint.to_string();
    let tok = tcp.then_some(TOKEN);
    let cluster = connected(&[(&stay.endpoint.to_string(), None), (&address, tok)], 0);
    let b = WorkerId(1);
    let held = cluster.device_buffer(b, 4096).unwrap();
    let busy: Vec<TaskHandle> = (0..2)
        .map(|_| {
            cluster
                .submit(Task::new("test.sleep").scalar_u64(400).on(b))
                .unwrap()
        })
        .collect();
    within(Duration::from_secs(5), || {
        cluster.worker_stats(b).is_ok_and(|s| s.tasks_in_flight > 0)
    })
    .expect("tasks started");
    let killed = Instant::now();
    w.kill();
    let e = cluster.wait(busy[0]).unwrap_err();
    let detected = killed.elapsed();
    let Error::Run(run) = &e else { panic!("{e}") };
    assert!(matches!(run.outcome, Outcome::EndpointFailure(_)), "{e}");
    assert!(
        run.worker.as_deref().unwrap_or("").contains(&address),
        "{e}"
    );
    assert!(!cluster.is_up(b));
    assert!(cluster.wait_all().is_err(), "the run reports the loss");
    // While it is away the job runs on the other worker.
    let want = reference(32, 7);
    let job = submit_hash_job(&cluster, 32, 0, 7);
    cluster.wait_all().expect("the job runs without it");
    assert_eq!(job.out.read_elements().unwrap(), want);
    // Back on the same address.
    w = WorkerProcess::spawn_listening(test_worker_bin(), &[], &address, &auth);
    let rejoined = within(Duration::from_secs(10), || cluster.is_up(b))
        .unwrap_or_else(|| panic!("{b} did not rejoin; its log:\n{}", w.log()));
    // What it held before is gone, and the cluster says so.
    let e = cluster
        .submit(Task::new("test.touch").input(&held.tensor(&[4096], DType::U8).unwrap()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("lost since it was allocated"), "{e}");
    let e = cluster.read_device(&held, 0, 16).unwrap_err().to_string();
    assert!(e.contains("lost since it was allocated"), "{e}");
    // A new job uses it again, with the same result.
    let job = submit_hash_job(&cluster, 64, 2, 7);
    let want = reference(64, 7);
    let s = cluster.wait_all().expect("the job after the rejoin");
    assert_eq!(s.failed + s.skipped, 0);
    assert_eq!(job.out.read_elements().unwrap()[..want.len()], want[..]);
    assert!(
        cluster.worker_stats(b).unwrap().tasks_succeeded > 0,
        "the rejoined worker ran tasks"
    );
    let fresh = cluster.device_buffer(b, 4096).unwrap();
    cluster.write_device(&fresh, 0, &[7; 16]).unwrap();
    assert_eq!(cluster.read_device(&fresh, 0, 16).unwrap(), vec![7; 16]);
    eprintln!(
        "{}: kill -9 detected in {:.1} ms; rejoined {:.1} ms after the restarted worker was ready",
        if tcp { "tcp" } else { "unix" },
        ms(detected),
        ms(rejoined)
    );
}

#[test]
fn a_worker_restarted_on_its_unix_socket_rejoins() {
    restart_and_rejoin(false);
}

#[test]
fn a_worker_restarted_on_its_tcp_port_rejoins() {
    restart_and_rejoin(true);
}

/// Two workers of one kind (`tcp`), the second hung (SIGSTOP) just before
/// `submit` places a task on it: the task must fail at the health deadline
/// (not hang), and a job must then run on the first. How long it took.
fn lost_while_hung(
    tcp: bool,
    args: &[&str],
    submit: impl FnOnce(&Cluster, WorkerId) -> TaskHandle,
) -> Duration {
    let spawn = |a: &[&str]| {
        if tcp {
            WorkerProcess::spawn_tcp(test_worker_bin(), &[], a)
        } else {
            WorkerProcess::spawn_unix(test_worker_bin(), &[], a)
        }
    };
    let (stay, w) = (spawn(args), spawn(args));
    let cluster = connected(
        &[
            (&stay.endpoint.to_string(), None),
            (&w.endpoint.to_string(), None),
        ],
        0,
    );
    let b = WorkerId(1);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(w.pid()).unwrap());
    w.hang();
    let stopped = Instant::now();
    let task = submit(&cluster, b);
    let e = cluster.wait(task).unwrap_err().to_string();
    let detected = stopped.elapsed();
    assert!(e.contains("no health beat"), "{e}");
    assert!(detected < Duration::from_secs(20), "{detected:?}");
    assert!(!cluster.is_up(b));
    assert!(cluster.wait_all().is_err());
    let want = reference(32, 3);
    let job = submit_hash_job(&cluster, 32, 0, 3);
    cluster.wait_all().expect("the job runs without it");
    assert_eq!(job.out.read_elements().unwrap(), want);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    detected
}

/// A TCP worker that hangs (SIGSTOP) while a view larger than a message is
/// staged to it with the `Stage` call (no data port) is lost at the health
/// deadline: the staging call gives up instead of holding its endpoint,
/// and the other worker runs the job.
#[test]
fn a_worker_hung_while_a_view_is_staged_to_it_is_lost_at_the_deadline() {
    let args = [
        "--insecure",
        "--max-message-bytes",
        "1048576",
        "--no-data-port",
    ];
    let detected = lost_while_hung(true, &args, touch_64_mib);
    eprintln!("hung while staging: lost in {:.1} ms", ms(detected));
}

/// A task on `b` reading 64 MiB: far more than the socket buffers hold,
/// so a hung worker leaves its bytes stuck on the way.
fn touch_64_mib(cluster: &Cluster, b: WorkerId) -> TaskHandle {
    let n = 16u32 << 20;
    let big = cluster
        .buffer(u64::from(n) * 4)
        .unwrap()
        .tensor(&[n], DType::F32)
        .unwrap();
    cluster
        .submit(Task::new("test.touch").input(&big).on(b))
        .unwrap()
}

/// A TCP worker that hangs (SIGSTOP) while a large view is on its data
/// connection is lost at the health deadline: the stage, stuck on a full
/// socket, gives up when the health watch declares the worker down, and
/// the other worker runs the job.
#[test]
fn a_worker_hung_while_a_view_is_on_its_data_connection_is_lost_at_the_deadline() {
    let detected = lost_while_hung(true, &["--insecure"], |cluster, b| {
        assert!(cluster.workers()[1].data_connection);
        touch_64_mib(cluster, b)
    });
    eprintln!(
        "hung while on the data connection: lost in {:.1} ms",
        ms(detected)
    );
}

/// A Unix-socket worker that hangs (SIGSTOP) before a task passes it a new
/// buffer by fd is lost at the health deadline: the import, which a hung
/// worker never answers, gives up instead of holding its endpoint.
#[test]
fn a_worker_hung_while_a_buffer_is_passed_to_it_is_lost_at_the_deadline() {
    let detected = lost_while_hung(false, &[], |cluster, b| {
        let fresh = cluster
            .buffer(4096)
            .unwrap()
            .tensor(&[1024], DType::F32)
            .unwrap();
        cluster
            .submit(Task::new("test.touch").input(&fresh).on(b))
            .unwrap()
    });
    eprintln!("hung while importing: lost in {:.1} ms", ms(detected));
}

/// A worker the cluster connected to that hangs (SIGSTOP) is lost at the
/// health deadline; when it wakes up (SIGCONT) it ends the old session,
/// answers the endpoint's dialing and rejoins.
#[test]
fn a_hung_worker_that_wakes_up_rejoins() {
    let stay = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let w = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let cluster = connected(
        &[
            (&stay.endpoint.to_string(), None),
            (&w.endpoint.to_string(), None),
        ],
        0,
    );
    let b = WorkerId(1);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(w.pid()).unwrap());
    let busy = cluster
        .submit(Task::new("test.sleep").scalar_u64(200).on(b))
        .unwrap();
    within(Duration::from_secs(5), || {
        cluster.worker_stats(b).is_ok_and(|s| s.tasks_in_flight > 0)
    })
    .expect("task started");
    w.hang();
    let stopped = Instant::now();
    let e = cluster.wait(busy).unwrap_err().to_string();
    let detected = stopped.elapsed();
    assert!(e.contains("no health beat"), "{e}");
    assert!(!cluster.is_up(b));
    assert!(cluster.wait_all().is_err());
    // Still hung: the endpoint's dials go unanswered, it stays down, and
    // the job runs on the other worker.
    let want = reference(32, 3);
    let job = submit_hash_job(&cluster, 32, 0, 3);
    cluster.wait_all().expect("the job runs without it");
    assert_eq!(job.out.read_elements().unwrap(), want);
    assert!(!cluster.is_up(b));
    let woke = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    cluster
        .wait_up(b, Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("{e}; its log:\n{}", w.log()));
    let rejoined = woke.elapsed();
    // Only the new session is left on it (and the probe's own).
    let mut probe = Probe::new(&w.endpoint.to_string(), None);
    within(Duration::from_secs(5), || probe.stats().sessions == 2)
        .unwrap_or_else(|| panic!("sessions: {}", probe.stats().sessions));
    let before = probe.stats().tasks_succeeded;
    let job = submit_hash_job(&cluster, 64, 2, 3);
    let want = reference(64, 3);
    cluster.wait_all().expect("the job after it woke up");
    assert_eq!(job.out.read_elements().unwrap(), want);
    assert!(probe.stats().tasks_succeeded > before, "it ran tasks again");
    eprintln!(
        "SIGSTOP detected in {:.1} ms; rejoined {:.1} ms after SIGCONT",
        ms(detected),
        ms(rejoined)
    );
}

/// A worker that comes back on the address of a lost one but offers fewer
/// callables (another binary) is not taken back: the cluster says why in
/// its log and keeps dialing; the right worker on that address rejoins.
#[test]
fn a_worker_that_comes_back_with_fewer_callables_is_not_taken_back() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("unix:{}", dir.path().join("w.sock").display());
    let stay = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let mut w = WorkerProcess::spawn_listening(test_worker_bin(), &[], &listen, &[]);
    let cluster = connected(&[(&stay.endpoint.to_string(), None), (&listen, None)], 0);
    let b = WorkerId(1);
    w.kill();
    within(Duration::from_secs(5), || !cluster.is_up(b)).expect("lost");
    // `strata worker` has the built-in kernels only, not the test ones.
    let mut other =
        WorkerProcess::spawn_listening(&strata_tests::strata_bin(), &["worker"], &listen, &[]);
    // Several dials find it and turn it away.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!cluster.is_up(b), "a worker lacking callables rejoined");
    other.kill();
    let _w = WorkerProcess::spawn_listening(test_worker_bin(), &[], &listen, &[]);
    cluster
        .wait_up(b, Duration::from_secs(10))
        .expect("the right worker rejoins");
    let h = cluster
        .submit(Task::new("test.sleep").scalar_u64(1).on(b))
        .unwrap();
    cluster.wait(h).expect("runs there");
}

/// With `respawn(1)`, a spawned worker that crashes is restarted on its
/// socket and rejoins; the second crash exhausts the budget and it stays
/// down.
#[test]
fn a_crashed_spawned_worker_is_restarted_once_and_rejoins() {
    let cluster = Cluster::builder()
        .local(2)
        .worker_binary(test_worker_bin())
        .respawn(1)
        .start()
        .unwrap();
    let w = WorkerId(0);
    let first = cluster.worker_pid(w).unwrap();
    assert_eq!(cluster.workers()[0].pid, Some(first));
    let crashed = Instant::now();
    let h = cluster.submit(Task::new("test.abort").on(w)).unwrap();
    let e = cluster.wait(h).unwrap_err().to_string();
    assert!(e.contains("test.abort: aborting"), "{e}");
    cluster
        .wait_up(w, Duration::from_secs(20))
        .expect("restarted and rejoined");
    let back = crashed.elapsed();
    let second = cluster.worker_pid(w).unwrap();
    assert_ne!(first, second, "a new process");
    assert!(cluster.wait_all().is_err(), "the run reports the crash");
    let want = reference(64, 9);
    let job = submit_hash_job(&cluster, 64, 2, 9);
    cluster.wait_all().expect("the job after the restart");
    assert_eq!(job.out.read_elements().unwrap(), want);
    assert!(
        cluster.worker_stats(w).unwrap().tasks_succeeded > 0,
        "the restarted worker ran tasks"
    );
    // The budget is spent: the next crash leaves it down.
    let h = cluster.submit(Task::new("test.abort").on(w)).unwrap();
    assert!(cluster.wait(h).is_err());
    std::thread::sleep(Duration::from_millis(500));
    assert!(!cluster.is_up(w));
    // The run's error is the second crash; the job went to the survivor.
    let job = submit_hash_job(&cluster, 16, 0, 9);
    let e = cluster.wait_all().unwrap_err().to_string();
    assert!(e.contains("test.abort"), "{e}");
    assert!(job.tasks.iter().all(|t| cluster.wait(*t).is_ok()));
    assert_eq!(job.out.read_elements().unwrap(), reference(16, 9));
    eprintln!(
        "a crashed spawned worker was back {:.1} ms after the crashing task was submitted",
        ms(back)
    );
}

#[test]
fn a_connection_cut_mid_stream_is_detected_and_the_work_finishes_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let auth = ["--token-file", token.as_str()];
    let w0 = WorkerProcess::spawn_tcp(test_worker_bin(), &[], &auth);
    let w1 = WorkerProcess::spawn_tcp(test_worker_bin(), &[], &auth);
    let target = match &w1.endpoint {
        strata_client::Endpoint::Tcp(a) => *a,
        e => panic!("{e}"),
    };
    let proxy = TcpProxy::start(target);
    let cluster = connected(
        &[
            (&w0.endpoint.to_string(), Some(TOKEN)),
            (&proxy.endpoint(), Some(TOKEN)),
        ],
        3,
    );
    let far = WorkerId(1);
    let rows = 96;
    let want = reference(rows, 11);
    let job = submit_hash_job(&cluster, rows, 10, 11);
    within(Duration::from_secs(5), || {
        cluster
            .worker_stats(far)
            .is_ok_and(|s| s.tasks_in_flight > 0)
    })
    .expect("tasks in flight through the proxy");
    let cut = Instant::now();
    proxy.cut();
    let detected = within(Duration::from_secs(5), || !cluster.is_up(far)).expect("cut detected");
    // Everything still finishes: what ran behind the cut reruns on the
    // other worker (it only held copies), the rest is placed there.
    let s = cluster.wait_all().expect("the job survives the cut");
    assert_eq!(s.failed + s.skipped, 0);
    assert!(job.tasks.iter().all(|t| cluster.wait(*t).is_ok()));
    assert_eq!(job.out.read_elements().unwrap(), want);
    let finished = cut.elapsed();
    // The worker behind the cut ended that session (no one else's there).
    let mut probe = Probe::new(&w1.endpoint.to_string(), Some(TOKEN));
    let sessions = within(Duration::from_secs(5), || probe.stats().sessions == 1);
    assert!(sessions.is_some(), "the cut session was released");
    // Once the path heals the worker rejoins and takes tasks again.
    let before = probe.stats().tasks_succeeded;
    proxy.heal();
    let healed = Instant::now();
    cluster
        .wait_up(far, Duration::from_secs(10))
        .expect("rejoined after the heal");
    let rejoined = healed.elapsed();
    let job2 = submit_hash_job(&cluster, rows, 2, 11);
    cluster.wait_all().expect("the job after the heal");
    assert_eq!(job2.out.read_elements().unwrap(), want);
    let after = probe.stats().tasks_succeeded;
    assert!(after > before, "the healed worker ran tasks");
    eprintln!(
        "cut mid-stream: detected in {:.1} ms, job finished {:.1} ms after the cut; rejoined {:.1} ms after the heal",
        ms(detected),
        ms(finished),
        ms(rejoined)
    );
}

/// Three hosts on one machine: network namespaces `d` (the driver), `a`
/// and `b` (one worker each), `d` joined to each worker host by its own
/// veth pair (10.199.1.0/24 to `a`, 10.199.2.0/24 to `b`). Removed when
/// dropped.
struct Hosts {
    names: [String; 3],
}

const DRIVER: usize = 0;

impl Hosts {
    /// Why multi-host tests cannot run here, if they cannot.
    fn unavailable() -> Option<String> {
        if !nix::unistd::geteuid().is_root() {
            return Some("not root (network namespaces need CAP_SYS_ADMIN)".into());
        }
        match std::process::Command::new("ip").arg("-V").output() {
            Ok(o) if o.status.success() => None,
            _ => Some("the `ip` command (iproute2) is not installed".into()),
        }
    }

    fn new() -> Result<Hosts, String> {
        let tag = std::process::id();
        let hosts = Hosts {
            names: ["d", "a", "b"].map(|h| format!("strata-{tag}-{h}")),
        };
        let [d, a, b] = &hosts.names;
        for n in &hosts.names {
            ip(&["netns", "add", n])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        for (peer, net, dev) in [(a, 1, "to-a"), (b, 2, "to-b")] {
            ip(&[
                "-n", d, "link", "add", dev, "type", "veth", "peer", "name", "to-d", "netns", peer,
            ])?;
            ip(&[
                "-n",
                d,
                "addr",
                "add",
                &format!("10.199.{net}.1/24"),
                "dev",
                dev,
            ])?;
            ip(&[
                "-n",
                peer,
                "addr",
                "add",
                &format!("10.199.{net}.2/24"),
                "dev",
                "to-d",
            ])?;
            ip(&["-n", d, "link", "set", dev, "up"])?;
            ip(&["-n", peer, "link", "set", "to-d", "up"])?;
        }
        Ok(hosts)
    }

    /// Takes worker host `h`'s link (1 or 2) down or up, on its side.
    fn link(&self, h: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.names[h], "link", "set", "to-d", state]).unwrap();
    }

    /// Runs `f` on a thread inside host `h`'s network namespace.
    fn on<T: Send + 'static>(&self, h: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
        let ns = std::fs::File::open(format!("/var/run/netns/{}", self.names[h])).unwrap();
        std::thread::spawn(move || {
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    /// A `strata-test-worker` serving TCP with the token in host `h`.
    fn worker(&self, h: usize, address: &str, token: &str) -> WorkerProcess {
        let bin = test_worker_bin().to_str().unwrap();
        WorkerProcess::spawn_listening(
            Path::new("ip"),
            &["netns", "exec", &self.names[h], bin],
            &format!("tcp:{address}"),
            &["--token-file", token, "--peer-timeout-ms", "2000"],
        )
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let o = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// The multi-host test: the driver and two workers in separate
/// network namespaces, a job over TCP with a token, one link taken down
/// mid-run. The driver notices at its health deadline, the work behind
/// the dead link reruns on the other host, the cut-off worker ends the
/// orphaned session on its own, and once the link is back the worker
/// rejoins. Skipped, saying why, where namespaces cannot be made.
#[test]
fn hosts_in_network_namespaces_survive_a_link_going_down() {
    if let Some(why) = Hosts::unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let hosts = match Hosts::new() {
        Ok(h) => h,
        Err(why) => {
            eprintln!("skipped: cannot make network namespaces here: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let wa = hosts.worker(1, "10.199.1.2:7420", &token);
    let wb = hosts.worker(2, "10.199.2.2:7420", &token);
    let rows = 96;
    let want = reference(rows, 5);
    let (a_ep, b_ep) = (wa.endpoint.to_string(), wb.endpoint.to_string());
    // The driver, in host d.
    let (cluster, job) = hosts.on(DRIVER, move || {
        let cluster = connected(&[(&a_ep, Some(TOKEN)), (&b_ep, Some(TOKEN))], 3);
        // Every task needs the network: host d cannot reach the workers'
        // loopback, so the cluster's links are the veth pairs.
        let job = submit_hash_job(&cluster, rows, 10, 5);
        (cluster, job)
    });
    let a = WorkerId(0);
    within(Duration::from_secs(5), || {
        cluster.worker_stats(a).is_ok_and(|s| s.tasks_in_flight > 0)
    })
    .expect("tasks in flight on host a");
    let down = Instant::now();
    hosts.link(1, false);
    let detected =
        within(Duration::from_secs(5), || !cluster.is_up(a)).expect("the dead link is detected");
    let s = cluster
        .wait_all()
        .expect("the job survives the link going down");
    assert_eq!(s.failed + s.skipped, 0);
    assert_eq!(job.out.read_elements().unwrap(), want);
    let finished = down.elapsed();
    // Host a's worker, cut off, ends the orphaned session by itself
    // (asked from inside host a, which can still reach it).
    let a_ep = wa.endpoint.to_string();
    let released = hosts.on(1, move || {
        let mut probe = Probe::new(&a_ep, Some(TOKEN));
        within(Duration::from_secs(10), || probe.stats().sessions == 1)
    });
    let released = released.expect("the orphaned session was ended on host a");
    let since_down = down.elapsed();
    // The link comes back; the worker rejoins and takes work again.
    hosts.link(1, true);
    let up = Instant::now();
    cluster
        .wait_up(a, Duration::from_secs(20))
        .expect("host a rejoined");
    let rejoined = up.elapsed();
    let before = cluster.worker_stats(a).unwrap().tasks_succeeded;
    let job2 = submit_hash_job(&cluster, rows, 2, 5);
    cluster.wait_all().expect("the job after the link is back");
    assert_eq!(job2.out.read_elements().unwrap(), want);
    assert!(cluster.worker_stats(a).unwrap().tasks_succeeded > before);
    eprintln!(
        "netns: link down detected in {:.1} ms, job finished {:.1} ms after; orphaned session ended on the worker {:.0} ms after the link went down (polled for {:.0} ms); rejoined {:.1} ms after the link came back",
        ms(detected),
        ms(finished),
        ms(since_down),
        ms(released),
        ms(rejoined)
    );
}

/// An address that accepts connections and never answers (a wedged
/// process, a black-holing middlebox) fails the cluster's start within the
/// dial limit, naming the worker, instead of hanging the driver.
#[test]
fn a_worker_that_never_answers_fails_the_start_instead_of_hanging() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("tcp:{}", silent.local_addr().unwrap());
    let t0 = Instant::now();
    let e = Cluster::builder()
        .connect(&address, Some(TOKEN))
        .unwrap()
        .start()
        .unwrap_err()
        .to_string();
    let took = t0.elapsed();
    assert!(
        e.contains(&address) && e.contains("no answer within"),
        "{e}"
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
    eprintln!(
        "a silent worker failed the start after {:.0} ms: {e}",
        ms(took)
    );
}
