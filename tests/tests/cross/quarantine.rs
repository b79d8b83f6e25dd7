//! Quarantine after a loss without a fence, with real
//! processes: a task's bytes stay reserved until the task has definitively
//! ended on its worker. The scenario of the issue — a long task on worker
//! 0 writes `x`, worker 0 hangs, a WAW successor on worker 1 overwrites
//! `x` — must never end with the overwrite reported successful and then
//! overwritten by the hung task's late write.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use strata_orchestrator::{
    Cluster, Error, FailureKind, Outcome, Quarantine, Task, TaskHandle, View, WorkerId,
};
use strata_tests::{TcpProxy, WorkerProcess};
use strata_wire::DType;

use super::faults::{TOKEN, ms, test_worker_bin, token_file, within};

const W0: WorkerId = WorkerId(0);
const W1: WorkerId = WorkerId(1);
/// How long the late task sleeps before it writes.
const LATE_MS: u64 = 1500;
/// What the late task writes, and what the overwrite writes.
const LATE: f32 = 2311.0;
const OVER: f32 = 7.0;

fn cluster_of(workers: &[(&str, Option<&str>)], policy: Quarantine, retry: u32) -> Cluster {
    let mut b = Cluster::builder().quarantine(policy).retry(retry);
    for (address, token) in workers {
        b = b.connect(address, *token).unwrap();
    }
    b.start().unwrap()
}

/// Two Unix workers the cluster connects to (workers 0 and 1).
fn two_unix_workers(policy: Quarantine, retry: u32) -> (WorkerProcess, WorkerProcess, Cluster) {
    let w0 = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let w1 = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let cluster = cluster_of(
        &[
            (&w0.endpoint.to_string(), None),
            (&w1.endpoint.to_string(), None),
        ],
        policy,
        retry,
    );
    (w0, w1, cluster)
}

fn signal(pid: u32, s: Signal) {
    kill(Pid::from_raw(i32::try_from(pid).unwrap()), s).unwrap();
}

fn all(v: &[f32], want: f32) -> bool {
    v.iter().all(|x| *x == want)
}

/// `x` (1024 F32 values) and `test.late_fill(x)` running on worker 0.
fn start_late_task(cluster: &Cluster) -> (View, TaskHandle) {
    let x = cluster
        .buffer(4096)
        .unwrap()
        .tensor(&[1024], DType::F32)
        .unwrap();
    let late = cluster
        .submit(
            Task::new("test.late_fill")
                .output(&x)
                .scalar_u64(LATE_MS)
                .scalar_u64(LATE as u64)
                .on(W0),
        )
        .unwrap();
    within(Duration::from_secs(10), || {
        cluster
            .worker_stats(W0)
            .is_ok_and(|s| s.tasks_in_flight > 0)
    })
    .expect("the late task started");
    (x, late)
}

/// `fill(x, 7)` on worker 1: a write-after-write successor of the late task.
fn overwrite(cluster: &Cluster, x: &View) -> TaskHandle {
    cluster
        .submit(
            Task::new("fill")
                .output(x)
                .scalar_f64(f64::from(OVER))
                .on(W1),
        )
        .unwrap()
}

/// The steps 1–2: `test.late_fill(x)` running on worker 0, which
/// is then stopped, and `fill(x, 7)` submitted on worker 1.
struct Scenario {
    x: View,
    late: TaskHandle,
    over: TaskHandle,
    stopped: Instant,
}

fn stop_mid_task(cluster: &Cluster, w0_pid: u32) -> Scenario {
    let (x, late) = start_late_task(cluster);
    // A running task cannot be cancelled: its successors wait for it.
    let e = cluster.cancel(late).unwrap_err().to_string();
    assert!(e.contains("running"), "{e}");
    strata_tests::hang_process(w0_pid);
    let stopped = Instant::now();
    let over = overwrite(cluster, &x);
    Scenario {
        x,
        late,
        over,
        stopped,
    }
}

/// Unix workers the cluster connected to: the loss is not fenced, so the
/// overwrite waits; the worker wakes, finishes the late task (its write
/// lands), comes back proving the old session ended, and only then does
/// the overwrite run. `x` holds the overwrite's result for good.
#[test]
fn a_hung_unix_worker_s_late_write_never_lands_on_a_reported_result() {
    let (w0, _w1, cluster) = two_unix_workers(Quarantine::Wait(Duration::from_secs(30)), 0);
    let s = stop_mid_task(&cluster, w0.pid());
    let e = cluster.wait(s.late).unwrap_err();
    let detected = s.stopped.elapsed();
    let Error::Run(run) = &e else { panic!("{e}") };
    let Outcome::EndpointFailure(cause) = &run.outcome else {
        panic!("{e}")
    };
    assert_eq!(cause.kind, FailureKind::WorkerLost, "{cause}");
    assert!(cause.message.contains("quarantined"), "{cause}");
    // The driver's reads and writes of the quarantined bytes are refused.
    let e = s.x.read::<f32>().unwrap_err();
    assert!(
        matches!(&e, Error::Quarantined(q) if q.callable.contains("test.late_fill") && q.worker == WorkerId(0) && e.to_string().contains("worker 0")),
        "{e}"
    );
    assert!(matches!(
        s.x.write(&[1.0f32; 1024]),
        Err(Error::Quarantined(_))
    ));
    assert!(matches!(
        s.x.buffer().read_bytes(0, 4),
        Err(Error::Quarantined(_))
    ));
    // The overwrite is held back while the worker may still write.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        cluster.worker_stats(W1).unwrap().tasks_succeeded,
        0,
        "the WAW successor ran during the quarantine"
    );
    let woke = Instant::now();
    signal(w0.pid(), Signal::SIGCONT);
    cluster
        .wait(s.over)
        .unwrap_or_else(|e| panic!("{e}; worker 0's log:\n{}", w0.log()));
    let released = woke.elapsed();
    assert!(all(&s.x.read::<f32>().unwrap(), OVER));
    // Nothing lands afterwards: the late write came before the overwrite.
    std::thread::sleep(Duration::from_millis(LATE_MS + 500));
    assert!(
        all(&s.x.read::<f32>().unwrap(), OVER),
        "a late write landed on a result reported successful"
    );
    eprintln!(
        "hung unix worker: loss seen {:.1} ms after SIGSTOP; the overwrite ran {:.1} ms after \
         SIGCONT (the late task had up to {LATE_MS} ms left)",
        ms(detected),
        ms(released)
    );
}

/// With `Quarantine::FailAtOnce` the overwrite fails at once naming the
/// quarantine, the lost worker and the lost task; once the worker is
/// fenced the bytes (now the late write's) can be read and written again.
#[test]
fn failing_at_once_names_the_quarantine_and_the_fence_lifts_it() {
    let (w0, _w1, cluster) = two_unix_workers(Quarantine::FailAtOnce, 0);
    let s = stop_mid_task(&cluster, w0.pid());
    assert!(cluster.wait(s.late).is_err());
    let e = cluster.wait(s.over).unwrap_err();
    let failed = s.stopped.elapsed();
    let Error::Run(run) = &e else { panic!("{e}") };
    let Outcome::EndpointFailure(cause) = &run.outcome else {
        panic!("{e}")
    };
    assert_eq!(cause.kind, FailureKind::Quarantined, "{cause}");
    assert!(
        cause
            .message
            .contains(&format!("quarantined by {}", s.late.id()))
            && cause.message.contains("worker 0")
            && cause.message.contains("FailAtOnce"),
        "{cause}"
    );
    // A later writer of those bytes is refused too, at once.
    let again = cluster
        .submit(Task::new("fill").output(&s.x).scalar_f64(1.0).on(W1))
        .unwrap();
    assert!(cluster.wait(again).is_err());
    assert!(matches!(s.x.read::<f32>(), Err(Error::Quarantined(_))));
    signal(w0.pid(), Signal::SIGCONT);
    let lifted = within(Duration::from_secs(15), || s.x.read::<f32>().is_ok())
        .unwrap_or_else(|| panic!("never fenced; worker 0's log:\n{}", w0.log()));
    // The late write landed — on bytes whose overwrite was reported failed.
    assert!(all(&s.x.read::<f32>().unwrap(), LATE));
    let next = cluster
        .submit(
            Task::new("fill")
                .output(&s.x)
                .scalar_f64(f64::from(OVER))
                .on(W1),
        )
        .unwrap();
    cluster.wait(next).unwrap();
    assert!(all(&s.x.read::<f32>().unwrap(), OVER));
    eprintln!(
        "fail at once: the overwrite failed {:.1} ms after SIGSTOP; fenced {:.1} ms after SIGCONT",
        ms(failed),
        ms(lifted)
    );
}

/// A TCP worker only ever holds copies of host bytes, and its late
/// completions are dropped: its loss is fenced at once, the overwrite runs
/// without waiting, and the woken worker's late result never lands.
#[test]
fn a_hung_tcp_worker_is_fenced_at_once_and_its_late_result_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let auth = ["--token-file", token.as_str()];
    let w0 = WorkerProcess::spawn_tcp(test_worker_bin(), &[], &auth);
    let w1 = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let cluster = cluster_of(
        &[
            (&w0.endpoint.to_string(), Some(TOKEN)),
            (&w1.endpoint.to_string(), None),
        ],
        Quarantine::Wait(Duration::from_secs(30)),
        0,
    );
    let s = stop_mid_task(&cluster, w0.pid());
    let e = cluster.wait(s.late).unwrap_err().to_string();
    assert!(!e.contains("quarantined"), "{e}");
    cluster.wait(s.over).unwrap();
    let done = s.stopped.elapsed();
    assert!(all(&s.x.read::<f32>().unwrap(), OVER));
    signal(w0.pid(), Signal::SIGCONT);
    std::thread::sleep(Duration::from_millis(LATE_MS + 500));
    assert!(all(&s.x.read::<f32>().unwrap(), OVER));
    eprintln!(
        "hung tcp worker: the overwrite succeeded {:.1} ms after SIGSTOP",
        ms(done)
    );
}

/// A TCP connection cut by a proxy mid-task: fenced at once (copies only);
/// the overwrite runs; the worker behind the cut finishes its task into
/// its own copy; when the link heals it rejoins and `x` is unchanged.
#[test]
fn a_link_cut_mid_task_leaves_the_overwrite_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let auth = ["--token-file", token.as_str()];
    let w0 = WorkerProcess::spawn_tcp(test_worker_bin(), &[], &auth);
    let w1 = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let target = match &w0.endpoint {
        strata_client::Endpoint::Tcp(a) => *a,
        e => panic!("{e}"),
    };
    let proxy = TcpProxy::start(target);
    let cluster = cluster_of(
        &[
            (&proxy.endpoint(), Some(TOKEN)),
            (&w1.endpoint.to_string(), None),
        ],
        Quarantine::Wait(Duration::from_secs(30)),
        0,
    );
    let (x, late) = start_late_task(&cluster);
    let cut = Instant::now();
    proxy.cut();
    let over = overwrite(&cluster, &x);
    assert!(cluster.wait(late).is_err());
    cluster.wait(over).unwrap();
    let done = cut.elapsed();
    std::thread::sleep(Duration::from_millis(LATE_MS + 200));
    proxy.heal();
    cluster.wait_up(W0, Duration::from_secs(15)).unwrap();
    assert!(all(&x.read::<f32>().unwrap(), OVER));
    eprintln!(
        "link cut mid-task: the overwrite succeeded {:.1} ms after the cut",
        ms(done)
    );
}

/// A unix worker the cluster connected to, killed mid-task: the loss is
/// not fenced by the stream break itself, but the endpoint sees the
/// process (known from the fd channel's peer credentials) dead at once.
#[test]
fn a_killed_unix_worker_is_fenced_when_its_process_is_seen_dead() {
    let (mut w0, _w1, cluster) = two_unix_workers(Quarantine::Wait(Duration::from_secs(30)), 0);
    let (x, late) = start_late_task(&cluster);
    let over = overwrite(&cluster, &x);
    let killed = Instant::now();
    signal(w0.pid(), Signal::SIGKILL);
    assert!(cluster.wait(late).is_err());
    cluster.wait(over).unwrap();
    let done = killed.elapsed();
    w0.kill();
    assert!(all(&x.read::<f32>().unwrap(), OVER));
    eprintln!(
        "killed unix worker: fenced and the overwrite succeeded {:.1} ms after SIGKILL",
        ms(done)
    );
}

/// A task allowed to retry, lost without a fence, is not rerun until the
/// fence: its bytes are quarantined meanwhile, and once the stopped worker
/// wakes and proves the task ended, it reruns and succeeds.
#[test]
fn a_retry_of_a_quarantined_task_waits_for_the_fence() {
    let (w0, _w1, cluster) = two_unix_workers(Quarantine::Wait(Duration::from_secs(30)), 1);
    // Worker 1 is busy, so the scheduler places the late task on worker 0.
    let busy = cluster
        .submit(Task::new("test.sleep").scalar_u64(400).on(W1))
        .unwrap();
    let x = cluster
        .buffer(4096)
        .unwrap()
        .tensor(&[1024], DType::F32)
        .unwrap();
    let late = cluster
        .submit(
            Task::new("test.late_fill")
                .output(&x)
                .scalar_u64(LATE_MS)
                .scalar_u64(LATE as u64),
        )
        .unwrap();
    within(Duration::from_secs(10), || {
        cluster
            .worker_stats(W0)
            .is_ok_and(|s| s.tasks_in_flight > 0)
    })
    .expect("the late task started on worker 0");
    w0.hang();
    within(Duration::from_secs(5), || !cluster.is_up(W0)).expect("loss seen");
    cluster.wait(busy).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Not rerun on the idle worker 1 while worker 0 may still write.
    assert_eq!(cluster.worker_stats(W1).unwrap().tasks_succeeded, 1);
    assert!(matches!(x.read::<f32>(), Err(Error::Quarantined(_))));
    let woke = Instant::now();
    signal(w0.pid(), Signal::SIGCONT);
    cluster.wait(late).unwrap();
    let rerun = woke.elapsed();
    assert!(all(&x.read::<f32>().unwrap(), LATE));
    eprintln!(
        "retry after a fence: the rerun finished {:.1} ms after SIGCONT",
        ms(rerun)
    );
}

/// The differential test with faults: random programs over a spawned
/// worker (unified), a connected Unix worker (staged, each hash task
/// sleeping 20 ms between its reads and its writes) and a TCP worker; the
/// Unix one is stopped part-way through each program and woken later —
/// before the quarantine deadline on even seeds (the fence lifts it), after
/// it on odd ones (what waited fails). Every byte whose last writer in
/// submission order succeeded, or that nobody writes, must equal one-by-one
/// execution of the tasks that succeeded: never a reported success with
/// different bytes.
#[test]
fn differential_with_a_stopped_worker_never_reports_success_with_different_bytes() {
    stopped_worker_differential(strata_orchestrator::WriteBack::Through);
}

/// The same with deferred write-back: the stopped chip also holds bytes
/// dirty that no other copy has. Whatever it held dirty when it was lost
/// is lost (the tasks that wrote it are reported, readers fail), and still
/// no task that reports success left different bytes.
#[test]
fn differential_with_a_stopped_worker_holding_dirty_bytes_never_reports_success_with_different_bytes()
 {
    stopped_worker_differential(strata_orchestrator::WriteBack::Deferred);
}

fn stopped_worker_differential(write_back: strata_orchestrator::WriteBack) {
    use strata_orchestrator_core::sim;
    use strata_wire::check::Rng;
    let seeds: u64 = std::env::var("STRATA_QUARANTINE_DIFF_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let tcp = WorkerProcess::spawn_tcp(test_worker_bin(), &[], &["--token-file", token.as_str()]);
    let stopped = WorkerProcess::spawn_unix(
        test_worker_bin(),
        &[],
        &["--device", "sim:mode=staged", "--hash-delay-ms", "20"],
    );
    let deadline = Duration::from_millis(1500);
    let cluster = Cluster::builder()
        .local(1)
        .worker_binary(test_worker_bin())
        .device("sim:mode=unified")
        .connect(&stopped.endpoint.to_string(), None)
        .unwrap()
        .connect(&tcp.endpoint.to_string(), Some(TOKEN))
        .unwrap()
        .window(3)
        .quarantine(Quarantine::Wait(deadline))
        .write_back(write_back)
        .start()
        .unwrap();
    let b = WorkerId(1);
    let (mut tasks, mut succeeded, mut quarantined, mut checked) = (0, 0, 0, 0);
    for seed in 0..seeds {
        let mut rng = Rng(0x0a11_0000 + seed);
        let program = super::cluster::without_fp4(sim::random_program(&mut rng, 60));
        let (buffers, members) = super::cluster::remap(&program, &cluster);
        let stop_at = members.len() / 3;
        let ids = super::cluster::submit_program(&cluster, &program, members, |i| {
            if i == stop_at {
                // Let worker 1 take some of the work, then stop it.
                within(Duration::from_secs(5), || {
                    cluster.worker_stats(b).is_ok_and(|s| s.tasks_in_flight > 0)
                });
                stopped.hang();
            }
        });
        // Even seeds wake it within the deadline, odd ones after it.
        let pause = if seed % 2 == 0 {
            Duration::from_millis(300)
        } else {
            deadline + Duration::from_millis(1500)
        };
        std::thread::sleep(pause);
        signal(stopped.pid(), Signal::SIGCONT);
        let _ = cluster.wait_all();
        cluster
            .wait_up(b, Duration::from_secs(15))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}; its log:\n{}", stopped.log()));
        // Once fenced, every byte can be read again.
        within(Duration::from_secs(15), || {
            buffers.iter().all(|buf| buf.to_bytes().is_ok())
        })
        .unwrap_or_else(|| panic!("seed {seed}: still quarantined after the worker rejoined"));
        let mut ok = std::collections::HashSet::new();
        for (pid, h) in &ids {
            match cluster.wait(*h) {
                Ok(()) => {
                    ok.insert(*pid);
                }
                Err(e) => {
                    if e.to_string().contains("quarantined") {
                        quarantined += 1;
                    }
                }
            }
        }
        let got: sim::Memory = program
            .buffers
            .iter()
            .zip(&buffers)
            .map(|(d, buf)| (*d.identity(), buf.to_bytes().unwrap()))
            .collect();
        checked += sim::check_after_faults(&program, &got, &|t| ok.contains(&t.0))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        tasks += program.tasks.len();
        succeeded += ok.len();
    }
    assert!(
        quarantined > 0,
        "nothing was quarantined: the test has no teeth"
    );
    let totals = cluster.totals().unwrap();
    if write_back == strata_orchestrator::WriteBack::Deferred {
        assert!(totals.write_backs > 0, "nothing was kept dirty: {totals:?}");
    }
    eprintln!(
        "differential with a stopped worker ({write_back:?} write-back): {seeds} seeds, {tasks} \
         tasks, {succeeded} succeeded, {quarantined} failed naming a quarantine, {checked} bytes \
         checked, {} dirty byte sets written back",
        totals.write_backs
    );
}
