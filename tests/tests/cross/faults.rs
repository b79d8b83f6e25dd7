//! Faults a running cluster meets (issue 9): a worker restarted on its
//! address rejoining, a connection cut mid-stream, and a link taken down
//! between hosts in separate network namespaces. Results are checked
//! against the same job run on one worker with nothing going wrong.

use std::path::Path;
use std::time::{Duration, Instant};

use strata_orchestrator::{Cluster, Error, Outcome, Task, TaskHandle, View, WorkerId};
use strata_tests::{TcpProxy, WorkerProcess};
use strata_wire::DType;
use strata_wire::check::Rng;

fn test_worker_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_strata-test-worker"))
}

const TOKEN: &str = "faults-token";

fn token_file(dir: &Path) -> String {
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

/// A worker's counters, asked over a connection of its own.
fn direct_stats(endpoint: &str, token: Option<&str>) -> strata_proto::convert::WorkerStats {
    let ep: strata_worker::Endpoint = endpoint.parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = strata_worker::WorkerClient::connect(&ep, token)
            .await
            .unwrap();
        c.handshake().await.unwrap();
        c.stats().await.unwrap()
    })
}

/// Polls `f` every 5 ms for up to `limit`; how long it took.
fn within(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

fn ms(d: Duration) -> f64 {
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
    let cluster = Cluster::builder()
        .connect(&stay.endpoint.to_string(), None)
        .unwrap()
        .connect(&address, tok)
        .unwrap()
        .start()
        .unwrap();
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

#[test]
fn a_connection_cut_mid_stream_is_detected_and_the_work_finishes_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let auth = ["--token-file", token.as_str()];
    let w0 = WorkerProcess::spawn_tcp(test_worker_bin(), &[], &auth);
    let w1 = WorkerProcess::spawn_tcp(test_worker_bin(), &[], &auth);
    let target = match &w1.endpoint {
        strata_worker::Endpoint::Tcp(a) => *a,
        e => panic!("{e}"),
    };
    let proxy = TcpProxy::start(target);
    let cluster = Cluster::builder()
        .connect(&w0.endpoint.to_string(), Some(TOKEN))
        .unwrap()
        .connect(&proxy.endpoint(), Some(TOKEN))
        .unwrap()
        .retry(3)
        .start()
        .unwrap();
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
    let sessions = within(Duration::from_secs(5), || {
        direct_stats(&w1.endpoint.to_string(), Some(TOKEN)).sessions == 1
    });
    assert!(sessions.is_some(), "the cut session was released");
    // Once the path heals the worker rejoins and takes tasks again.
    let before = direct_stats(&w1.endpoint.to_string(), Some(TOKEN)).tasks_succeeded;
    proxy.heal();
    let healed = Instant::now();
    cluster
        .wait_up(far, Duration::from_secs(10))
        .expect("rejoined after the heal");
    let rejoined = healed.elapsed();
    let job2 = submit_hash_job(&cluster, rows, 2, 11);
    cluster.wait_all().expect("the job after the heal");
    assert_eq!(job2.out.read_elements().unwrap(), want);
    let after = direct_stats(&w1.endpoint.to_string(), Some(TOKEN)).tasks_succeeded;
    assert!(after > before, "the healed worker ran tasks");
    eprintln!(
        "cut mid-stream: detected in {:.1} ms, job finished {:.1} ms after the cut; rejoined {:.1} ms after the heal",
        ms(detected),
        ms(finished),
        ms(rejoined)
    );
}
