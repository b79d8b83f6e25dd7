//! Task timeouts, one test per kind of worker: a task past
//! its timeout fails with a cause saying it timed out, and because its
//! kernel cannot be trusted to stop, its bytes follow the quarantine
//! rules — a spawned worker is killed (fenced) and restarted, a connected
//! Unix worker and an in-process one keep the task's bytes quarantined
//! until the kernel really ends, and a TCP worker (copies only) is fenced
//! at once. Every test runs `test.late_fill(x)` (sleeps, then writes
//! `x`), times it out long before it writes, and checks what `x` holds
//! before and after the late write would land.

use std::time::{Duration, Instant};

use strata_orchestrator::{Cluster, Error, FailureKind, Outcome, Task, TaskHandle, View, WorkerId};
use strata_tests::{WorkerProcess, process_exited};
use strata_wire::DType;

use super::faults::{TOKEN, ms, test_worker_bin, token_file, within};

const W0: WorkerId = WorkerId(0);
const W1: WorkerId = WorkerId(1);
/// The timeout the late task is given.
const TIMEOUT: Duration = Duration::from_millis(300);
/// How long the late task sleeps before it writes.
const LATE_MS: u64 = 2000;
/// What the late task writes, and what the overwrite writes.
const LATE: f32 = 2311.0;
const OVER: f32 = 7.0;

fn all(v: &[f32], want: f32) -> bool {
    v.iter().all(|x| *x == want)
}

/// `x`: 1024 F32 zeros.
fn zeros(cluster: &Cluster) -> View {
    cluster
        .buffer(4096)
        .unwrap()
        .tensor(&[1024], DType::F32)
        .unwrap()
}

/// `test.late_fill(x)` on `on`, with [`TIMEOUT`].
fn late_task(cluster: &Cluster, x: &View, on: WorkerId) -> TaskHandle {
    cluster
        .submit(
            Task::new("test.late_fill")
                .output(x)
                .scalar_u64(LATE_MS)
                .scalar_u64(LATE as u64)
                .on(on)
                .timeout(TIMEOUT),
        )
        .unwrap()
}

/// `fill(x, value)` on `on`.
fn fill(cluster: &Cluster, x: &View, value: f32, on: WorkerId) -> TaskHandle {
    cluster
        .submit(
            Task::new("fill")
                .output(x)
                .scalar_f64(f64::from(value))
                .on(on),
        )
        .unwrap()
}

/// The cause of `task`'s failure, which must be TASK_FAILURE naming the
/// timeout, the task and its callable.
fn timed_out_cause(cluster: &Cluster, task: TaskHandle) -> String {
    let e = cluster.wait(task).unwrap_err();
    let Error::Run(run) = &e else { panic!("{e}") };
    assert_eq!(run.task, task.id());
    let Outcome::TaskFailure(cause) = &run.outcome else {
        panic!("not a TASK_FAILURE: {e}")
    };
    assert_eq!(cause.kind, FailureKind::TimedOut, "{cause}");
    let cause = &cause.message;
    assert!(
        cause.contains(&format!(
            "{} (test.late_fill@1) timed out after 300 ms on worker",
            task.id()
        )),
        "{cause}"
    );
    cause.clone()
}

/// Two Unix workers the cluster connects to (workers 0 and 1).
fn two_unix_workers() -> (WorkerProcess, WorkerProcess, Cluster) {
    let w0 = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let w1 = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let cluster = Cluster::builder()
        .connect(&w0.endpoint.to_string(), None)
        .unwrap()
        .connect(&w1.endpoint.to_string(), None)
        .unwrap()
        .start()
        .unwrap();
    (w0, w1, cluster)
}

/// A task that ends in time is untouched by its timeout; one past it
/// fails saying so, and its spawned worker is killed at once (so its late
/// write never lands: `x` keeps its zeros) and restarted even with no
/// respawn budget. The task in flight beside it fails as on any loss.
#[test]
fn a_spawned_worker_running_a_timed_out_task_is_killed_and_restarted() {
    let cluster = Cluster::builder()
        .local(1)
        .worker_binary(test_worker_bin())
        .start()
        .unwrap();
    let first = cluster.worker_pid(W0).unwrap();
    let quick = cluster
        .submit(
            Task::new("test.sleep")
                .scalar_u64(20)
                .timeout(Duration::from_secs(10)),
        )
        .unwrap();
    cluster.wait(quick).unwrap();
    assert_eq!(cluster.worker_pid(W0), Some(first));
    let x = zeros(&cluster);
    let t0 = Instant::now();
    let late = late_task(&cluster, &x, W0);
    let beside = cluster
        .submit(Task::new("test.sleep").scalar_u64(LATE_MS).on(W0))
        .unwrap();
    let cause = timed_out_cause(&cluster, late);
    let failed = t0.elapsed();
    assert!(cause.contains("killed and restarted"), "{cause}");
    assert!(
        failed >= TIMEOUT && failed < Duration::from_millis(LATE_MS),
        "failed after {failed:?}"
    );
    let e = cluster.wait(beside).unwrap_err();
    assert!(
        matches!(&e, Error::Run(r) if matches!(&r.outcome, Outcome::EndpointFailure(c)
            if c.kind == FailureKind::WorkerLost && c.message.contains("timed out"))),
        "{e}"
    );
    assert!(
        process_exited(first),
        "the worker running the late task still lives"
    );
    // Fenced by the kill: nothing was quarantined.
    assert!(all(&x.read::<f32>().unwrap(), 0.0));
    cluster.wait_up(W0, Duration::from_secs(15)).unwrap();
    let back = t0.elapsed();
    let second = cluster.worker_pid(W0).unwrap();
    assert_ne!(second, first);
    std::thread::sleep(Duration::from_millis(LATE_MS + 300).saturating_sub(t0.elapsed()));
    assert!(
        all(&x.read::<f32>().unwrap(), 0.0),
        "the killed task's write landed"
    );
    cluster.wait(fill(&cluster, &x, OVER, W0)).unwrap();
    assert!(all(&x.read::<f32>().unwrap(), OVER));
    eprintln!(
        "spawned worker: the timed-out task failed {:.1} ms after submit (timeout {} ms); \
         the restarted worker was up {:.1} ms after submit",
        ms(failed),
        TIMEOUT.as_millis(),
        ms(back)
    );
}

/// A Unix worker the cluster connected to is not the cluster's to kill:
/// the task's bytes stay quarantined (the driver's reads refused, a
/// writer on another worker held back) until the worker proves the task
/// ended — when its kernel returns, its late write landed — and only then
/// does the overwrite run. The worker lives on and rejoins.
#[test]
fn a_connected_unix_worker_keeps_a_timed_out_task_s_bytes_quarantined_until_it_ended() {
    let (w0, _w1, cluster) = two_unix_workers();
    quarantined_until_the_kernel_ends(&cluster, "connected unix worker");
    assert!(!process_exited(w0.pid()), "a connected worker was killed");
    cluster
        .wait_up(W0, Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("{e}; worker 0's log:\n{}", w0.log()));
    let y = zeros(&cluster);
    cluster.wait(fill(&cluster, &y, 1.0, W0)).unwrap();
}

/// An in-process worker cannot be killed: its bytes stay quarantined
/// until the kernel really ends.
#[test]
fn an_in_process_worker_keeps_a_timed_out_task_s_bytes_quarantined_until_its_kernel_ends() {
    let cluster = Cluster::builder()
        .in_process(2)
        .kernels(strata_tests::kernels::registry().unwrap())
        .start()
        .unwrap();
    quarantined_until_the_kernel_ends(&cluster, "in-process worker");
    cluster.wait_up(W0, Duration::from_secs(15)).unwrap();
    let y = zeros(&cluster);
    cluster.wait(fill(&cluster, &y, 1.0, W0)).unwrap();
}

/// The late task times out on worker 0 and an overwrite of its bytes
/// waits on worker 1 until the kernel on worker 0 has ended.
fn quarantined_until_the_kernel_ends(cluster: &Cluster, kind: &str) {
    let x = zeros(cluster);
    let t0 = Instant::now();
    let late = late_task(cluster, &x, W0);
    let over = fill(cluster, &x, OVER, W1);
    let cause = timed_out_cause(cluster, late);
    let failed = t0.elapsed();
    assert!(cause.contains("quarantined"), "{cause}");
    assert!(failed < Duration::from_millis(LATE_MS), "{failed:?}");
    let e = x.read::<f32>().unwrap_err();
    assert!(
        matches!(&e, Error::Quarantined(q) if q.callable.contains("test.late_fill") && q.worker == W0),
        "{e}"
    );
    assert!(matches!(
        x.write(&[1.0f32; 1024]),
        Err(Error::Quarantined(_))
    ));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        cluster.worker_stats(W1).unwrap().tasks_succeeded,
        0,
        "the overwrite ran while the timed-out kernel could still write"
    );
    cluster.wait(over).unwrap();
    let released = t0.elapsed();
    assert!(
        released >= Duration::from_millis(LATE_MS),
        "the quarantine lifted {released:?} after submit, before the kernel ended"
    );
    assert!(all(&x.read::<f32>().unwrap(), OVER));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        all(&x.read::<f32>().unwrap(), OVER),
        "a late write landed on a result reported successful"
    );
    eprintln!(
        "{kind}: the timed-out task failed {:.1} ms after submit (timeout {} ms); its bytes \
         were released {:.1} ms after submit (the kernel sleeps {LATE_MS} ms)",
        ms(failed),
        TIMEOUT.as_millis(),
        ms(released)
    );
}

/// A TCP worker only ever holds copies of host bytes and its late results
/// are dropped: the timeout fences it at once, the overwrite runs without
/// waiting, and the late write never lands. The worker rejoins.
#[test]
fn a_tcp_worker_s_timed_out_task_is_fenced_at_once_and_its_late_result_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let w0 = WorkerProcess::spawn_tcp(test_worker_bin(), &[], &["--token-file", token.as_str()]);
    let w1 = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let cluster = Cluster::builder()
        .connect(&w0.endpoint.to_string(), Some(TOKEN))
        .unwrap()
        .connect(&w1.endpoint.to_string(), None)
        .unwrap()
        .start()
        .unwrap();
    let x = zeros(&cluster);
    let t0 = Instant::now();
    let late = late_task(&cluster, &x, W0);
    let over = fill(&cluster, &x, OVER, W1);
    let cause = timed_out_cause(&cluster, late);
    assert!(
        !cause.contains("quarantined") && cause.contains("copies"),
        "{cause}"
    );
    cluster.wait(over).unwrap();
    let done = t0.elapsed();
    assert!(done < Duration::from_millis(LATE_MS), "{done:?}");
    assert!(all(&x.read::<f32>().unwrap(), OVER));
    std::thread::sleep(Duration::from_millis(LATE_MS + 500).saturating_sub(t0.elapsed()));
    assert!(all(&x.read::<f32>().unwrap(), OVER));
    within(Duration::from_secs(15), || cluster.is_up(W0))
        .unwrap_or_else(|| panic!("worker 0 never rejoined; its log:\n{}", w0.log()));
    assert!(!process_exited(w0.pid()));
    eprintln!(
        "tcp worker: the overwrite succeeded {:.1} ms after submit (timeout {} ms)",
        ms(done),
        TIMEOUT.as_millis()
    );
}

/// A zero timeout is refused at submit, naming the task's callable.
#[test]
fn a_zero_timeout_is_refused_at_submit() {
    let cluster = Cluster::builder()
        .in_process(1)
        .kernels(strata_tests::kernels::registry().unwrap())
        .start()
        .unwrap();
    let e = cluster
        .submit(
            Task::new("test.sleep")
                .scalar_u64(1)
                .timeout(Duration::ZERO),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::Submit(_)) && e.to_string().contains("test.sleep@1: a timeout of zero"),
        "{e}"
    );
}
