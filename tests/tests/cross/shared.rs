//! Shared device buffers through the real binaries: allocated on a
//! worker, written by tasks, handed to this process as a file descriptor
//! and mapped here to the same memory, both ways; refused for what is not
//! a shared buffer. On a simulated chip always; on `cuda:0` where a GPU
//! (or the fake CUDA) is.

use strata_chip_runtime::shared::Place;
use strata_orchestrator::{Cluster, ClusterBuilder, Task, WorkerId};
use strata_tests::{WorkerProcess, strata_bin};
use strata_wire::DType;

/// A `strata worker` process on `device`, on a Unix socket.
fn strata_worker(device: &str) -> WorkerProcess {
    WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &["--device", device])
}

/// A cluster of `builder` connected to `workers` over their Unix sockets,
/// worker `i` being `workers[i]`.
fn connected(builder: ClusterBuilder, workers: &[&WorkerProcess]) -> Cluster {
    workers
        .iter()
        .fold(builder, |b, w| {
            b.connect(&w.endpoint.to_string(), None).unwrap()
        })
        .start()
        .unwrap()
}

/// One worker process on `device`, reached over its Unix socket.
fn cluster_on(device: &str) -> (WorkerProcess, Cluster) {
    let w = strata_worker(device);
    let cluster = connected(Cluster::builder(), &[&w]);
    (w, cluster)
}

/// What the late task of the quarantine tests writes.
const LATE: f32 = 2311.0;

/// `test.late_fill(view)` (1.5 s, then [`LATE`]) on `worker`, whose process
/// `w` is stopped (SIGSTOP) once the task runs; the task and the pid to
/// wake.
fn late_fill_stopped(
    cluster: &Cluster,
    view: &strata_orchestrator::View,
    worker: WorkerId,
    w: &WorkerProcess,
) -> (strata_orchestrator::TaskHandle, nix::unistd::Pid) {
    let late = cluster
        .submit(
            Task::new("test.late_fill")
                .output(view)
                .scalar_u64(1500)
                .scalar_u64(LATE as u64)
                .on(worker),
        )
        .unwrap();
    crate::faults::within(std::time::Duration::from_secs(10), || {
        cluster
            .worker_stats(worker)
            .is_ok_and(|s| s.tasks_in_flight > 0)
    })
    .expect("the late task started");
    w.hang();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(w.pid()).unwrap());
    (late, pid)
}

fn shared_round_trip(cluster: &Cluster, place: fn(Place) -> bool) {
    let n = 1 << 16;
    let buf = cluster.shared_buffer(WorkerId(0), n * 4).unwrap();
    let v = buf.tensor(&[n as u32], DType::F32).unwrap();
    cluster
        .submit(Task::new("fill").output(&v).scalar_f64(1.5))
        .unwrap();
    cluster.wait_all().unwrap();
    assert!(cluster.worker_stats(WorkerId(0)).unwrap().shared >= n * 4);
    let shared = cluster.export_device(&buf).unwrap();
    assert!(place(shared.place()), "{:?}", shared.place());
    assert!(shared.len() >= n * 4);
    let mapped = shared.map().unwrap();
    let mut seen = vec![0u8; (n * 4) as usize];
    mapped.read(0, &mut seen).unwrap();
    assert!(
        seen.chunks(4).all(|c| c == 1.5f32.to_le_bytes()),
        "the mapping sees what the task wrote"
    );
    // Written here; a task after reads it: y = x + x.
    mapped.write(0, &3f32.to_le_bytes()).unwrap();
    let out = cluster.buffer(n * 4).unwrap();
    let o = out.tensor(&[n as u32], DType::F32).unwrap();
    cluster
        .submit(Task::new("add").input(&v).input(&v).output(&o))
        .unwrap();
    cluster.wait_all().unwrap();
    let got = o.read::<f32>().unwrap();
    assert_eq!(got[0], 6.0);
    assert!(got[1..].iter().all(|&x| x == 3.0));
    // The driver's own copies see it too.
    assert_eq!(
        cluster.read_device(&buf, 0, 4).unwrap(),
        3f32.to_le_bytes().to_vec()
    );
    // Only shared buffers leave their worker.
    let plain = cluster.device_buffer(WorkerId(0), 64).unwrap();
    let e = cluster.export_device(&plain).unwrap_err().to_string();
    assert!(e.contains("only shared blocks"), "{e}");
    let host = cluster.buffer(64).unwrap();
    assert!(cluster.export_device(&host).is_err());
    // The mapping outlives the buffer.
    drop(buf);
    cluster.wait_all().unwrap();
    mapped.read(0, &mut seen[..4]).unwrap();
    assert_eq!(seen[..4], 3f32.to_le_bytes());
}

/// A simulated chip's shared buffer maps here as host memory.
#[test]
fn a_shared_buffer_maps_in_the_driver_on_a_simulated_chip() {
    let (_w, cluster) = cluster_on("sim");
    shared_round_trip(&cluster, |p| p == Place::Host);
    let inproc = Cluster::builder().in_process(1).start().unwrap();
    shared_round_trip(&inproc, |p| p == Place::Host);
}

/// A GPU's shared buffer maps here as device memory of the same GPU.
#[test]
fn a_shared_buffer_maps_in_the_driver_on_a_gpu() {
    if !crate::chips::gpu_here("a_shared_buffer_maps_in_the_driver_on_a_gpu") {
        return;
    }
    let (_w, cluster) = cluster_on("cuda:0,mem=256MiB");
    shared_round_trip(&cluster, |p| p == Place::Cuda(0));
}

/// When its worker is lost, a shared buffer is exported no more (what its
/// lost tasks may have left is nobody's to hand out); a mapping taken
/// before keeps the memory it maps.
#[test]
fn a_lost_workers_shared_buffer_is_exported_no_more() {
    let (mut w, cluster) = cluster_on("sim");
    let buf = cluster.shared_buffer(WorkerId(0), 4096).unwrap();
    cluster.write_device(&buf, 0, &[9u8; 4096]).unwrap();
    let mapped = cluster.export_device(&buf).unwrap().map().unwrap();
    w.kill();
    crate::faults::within(std::time::Duration::from_secs(10), || {
        !cluster.is_up(WorkerId(0))
    })
    .expect("seen down");
    let e = cluster.export_device(&buf).unwrap_err().to_string();
    assert!(e.contains("lost"), "{e}");
    let mut seen = [0u8; 16];
    mapped.read(0, &mut seen).unwrap();
    assert_eq!(seen, [9u8; 16]);
}

/// A mapping outlives its worker, and a task lost without a fence while
/// it writes the buffer may still write the mapped bytes: they are
/// refused here (reads and writes, and `check`) until the loss is fenced,
/// then readable again — with what the late task wrote, which the
/// mapping's memory received though the worker's session had ended.
#[test]
fn a_mapping_refuses_bytes_a_lost_task_may_still_write_until_the_fence() {
    use nix::sys::signal::{Signal, kill};
    use std::time::Duration;
    use strata_orchestrator::{Error, Quarantine};

    let w = WorkerProcess::spawn_unix(crate::faults::test_worker_bin(), &[], &[]);
    let cluster = connected(
        Cluster::builder().quarantine(Quarantine::Wait(Duration::from_secs(60))),
        &[&w],
    );
    // 1024 F32 values: the first 256 the lost task writes, the rest not.
    let buf = cluster.shared_buffer(WorkerId(0), 4096).unwrap();
    cluster.write_device(&buf, 0, &[0u8; 4096]).unwrap();
    let head = buf.tensor(&[256], DType::F32).unwrap();
    let mapped = cluster.export_device(&buf).unwrap().map().unwrap();
    let (late, pid) = late_fill_stopped(&cluster, &head, WorkerId(0), &w);
    let e = cluster.wait(late).unwrap_err().to_string();
    assert!(e.contains("quarantined"), "{e}");
    let mut seen = [0u8; 16];
    let e = mapped.read(0, &mut seen).unwrap_err();
    assert!(
        matches!(&e, Error::Quarantined(q) if q.callable.contains("test.late_fill") && q.bytes == (0..1024)),
        "{e}"
    );
    assert!(matches!(
        mapped.write(1020, &[1u8; 8]),
        Err(Error::Quarantined(_))
    ));
    assert!(mapped.check(0, 1).is_err());
    // Bytes the lost task does not write stay usable.
    mapped.read(1024, &mut seen).unwrap();
    assert_eq!(seen, [0u8; 16]);
    mapped.check(1024, 3072).unwrap();
    kill(pid, Signal::SIGCONT).unwrap();
    crate::faults::within(Duration::from_secs(15), || mapped.check(0, 1024).is_ok())
        .unwrap_or_else(|| panic!("never fenced; the worker's log:\n{}", w.log()));
    let mut head_bytes = vec![0u8; 1024];
    mapped.read(0, &mut head_bytes).unwrap();
    assert!(
        head_bytes.chunks(4).all(|c| c == LATE.to_le_bytes()),
        "the late write landed in the mapped memory"
    );
}

/// Two workers of `device` on this host, reached over their Unix sockets.
fn two_on(device: &str) -> (WorkerProcess, WorkerProcess, Cluster) {
    let (w0, w1) = (strata_worker(device), strata_worker(device));
    let cluster = connected(Cluster::builder(), &[&w0, &w1]);
    (w0, w1, cluster)
}

/// Worker 0's shared buffer used in place by tasks on worker 1: a fill
/// there is seen by worker 0's copies and tasks and by this process's
/// mapping, and worker 0's writes by worker 1's tasks; a task that also
/// names worker 1's own device buffer goes there, one with nothing else
/// to its owner; once the buffer is dropped worker 1 lets its mapping go.
fn shared_between_workers(cluster: &Cluster) {
    let (w0, w1) = (WorkerId(0), WorkerId(1));
    let n = 1u32 << 14;
    let buf = cluster.shared_buffer(w0, u64::from(n) * 4).unwrap();
    let v = buf.tensor(&[n], DType::F32).unwrap();
    let before = cluster.worker_stats(w1).unwrap().shared;
    cluster
        .submit(Task::new("fill").output(&v).scalar_f64(2.5).on(w1))
        .unwrap();
    cluster.wait_all().unwrap();
    assert!(
        cluster.worker_stats(w1).unwrap().shared > before,
        "worker 1 maps it"
    );
    assert_eq!(
        cluster.read_device(&buf, 0, 4).unwrap(),
        2.5f32.to_le_bytes().to_vec(),
        "worker 0 sees worker 1's write"
    );
    let mapped = cluster.export_device(&buf).unwrap().map().unwrap();
    let mut seen = [0u8; 8];
    mapped.read(u64::from(n) * 4 - 8, &mut seen).unwrap();
    assert_eq!(seen, [2.5f32.to_le_bytes(); 2].concat()[..]);
    // Worker 0's write, read by worker 1 into its own device buffer.
    cluster.write_device(&buf, 0, &7f32.to_le_bytes()).unwrap();
    let own = cluster.device_buffer(w1, u64::from(n) * 4).unwrap();
    let o = own.tensor(&[n], DType::F32).unwrap();
    let t = cluster
        .submit(Task::new("add").input(&v).input(&v).output(&o))
        .unwrap();
    cluster.wait(t).unwrap();
    let got = cluster.read_device(&own, 0, 8).unwrap();
    assert_eq!(got, [14f32.to_le_bytes(), 5f32.to_le_bytes()].concat());
    // Nothing else named: the owner runs it.
    let host = cluster.buffer(u64::from(n) * 4).unwrap();
    let h = host.tensor(&[n], DType::F32).unwrap();
    let ran0 = cluster.worker_stats(w0).unwrap().tasks_succeeded;
    cluster
        .submit(Task::new("copy").input(&v).output(&h))
        .unwrap();
    cluster.wait_all().unwrap();
    assert_eq!(cluster.worker_stats(w0).unwrap().tasks_succeeded, ran0 + 1);
    assert_eq!(h.read::<f32>().unwrap()[..2], [7.0, 2.5]);
    // Dropped: worker 1 unmaps it.
    drop((buf, v));
    cluster.wait_all().unwrap();
    crate::faults::within(std::time::Duration::from_secs(10), || {
        cluster.worker_stats(w1).unwrap().shared == before
    })
    .expect("worker 1 let its mapping go");
}

/// Between two `strata worker` processes of simulated chips, and two
/// workers in this process.
#[test]
fn a_shared_buffer_is_used_in_place_by_another_worker() {
    let (_w0, _w1, cluster) = two_on("sim");
    shared_between_workers(&cluster);
    let inproc = Cluster::builder().in_process(2).start().unwrap();
    shared_between_workers(&inproc);
}

/// Between two worker processes on the same GPU.
#[test]
fn a_shared_buffer_is_used_in_place_by_another_worker_on_the_same_gpu() {
    if !crate::chips::gpu_here("a_shared_buffer_is_used_in_place_by_another_worker_on_the_same_gpu")
    {
        return;
    }
    let (_w0, _w1, cluster) = two_on("cuda:0,mem=256MiB");
    shared_between_workers(&cluster);
    // A simulated chip cannot map a GPU's memory: refused at submit.
    let (gpu, sim) = (strata_worker("cuda:0,mem=256MiB"), strata_worker("sim"));
    let mixed = connected(Cluster::builder(), &[&gpu, &sim]);
    let buf = mixed.shared_buffer(WorkerId(0), 64).unwrap();
    let v = buf.tensor(&[16], DType::F32).unwrap();
    let e = mixed
        .submit(Task::new("fill").output(&v).scalar_f64(1.0).on(WorkerId(1)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("maps host memory, not memory of GPU 0"), "{e}");
}

/// Where another worker cannot map a shared buffer, the task is refused
/// at submit naming the buffer, both workers and why: a worker over TCP
/// (device memory travels only by fd).
#[test]
fn a_worker_that_cannot_map_a_shared_buffer_refuses_the_task_naming_why() {
    use crate::faults::{TOKEN, token_file};
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let w0 = strata_worker("sim");
    let w1 = WorkerProcess::spawn_tcp(
        &strata_bin(),
        &["worker"],
        &["--device", "sim", "--token-file", token.as_str()],
    );
    let cluster = Cluster::builder()
        .connect(&w0.endpoint.to_string(), None)
        .unwrap()
        .connect(&w1.endpoint.to_string(), Some(TOKEN))
        .unwrap()
        .start()
        .unwrap();
    let buf = cluster.shared_buffer(WorkerId(0), 64).unwrap();
    let v = buf.tensor(&[16], DType::F32).unwrap();
    let e = cluster
        .submit(Task::new("fill").output(&v).scalar_f64(1.0).on(WorkerId(1)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("could not be mapped on worker 1")
            && e.contains("of worker 0")
            && e.contains("over TCP"),
        "{e}"
    );
    // The owner still runs it.
    cluster
        .submit(Task::new("fill").output(&v).scalar_f64(1.0))
        .unwrap();
    cluster.wait_all().unwrap();
}

/// The quarantine across workers: worker 1 writes worker 0's shared
/// buffer in place and hangs mid-task (SIGSTOP). Until the loss is fenced
/// the mapping here refuses the bytes and worker 0's overwrite waits; when
/// worker 1 wakes, its late write lands first, and the overwrite after it
/// holds for good.
#[test]
fn a_hung_importer_s_late_write_never_lands_on_the_owner_s_later_result() {
    use nix::sys::signal::{Signal, kill};
    use std::time::Duration;
    use strata_orchestrator::{Error, Quarantine};

    let bin = crate::faults::test_worker_bin();
    let w0 = WorkerProcess::spawn_unix(bin, &[], &[]);
    let w1 = WorkerProcess::spawn_unix(bin, &[], &[]);
    let cluster = connected(
        Cluster::builder().quarantine(Quarantine::Wait(Duration::from_secs(60))),
        &[&w0, &w1],
    );
    let buf = cluster.shared_buffer(WorkerId(0), 4096).unwrap();
    let x = buf.tensor(&[1024], DType::F32).unwrap();
    let mapped = cluster.export_device(&buf).unwrap().map().unwrap();
    let (late, pid) = late_fill_stopped(&cluster, &x, WorkerId(1), &w1);
    let over = cluster
        .submit(Task::new("fill").output(&x).scalar_f64(7.0).on(WorkerId(0)))
        .unwrap();
    let e = cluster.wait(late).unwrap_err().to_string();
    assert!(e.contains("quarantined"), "{e}");
    let e = mapped.read(0, &mut [0u8; 4]).unwrap_err();
    assert!(
        matches!(&e, Error::Quarantined(q) if q.worker == WorkerId(1)),
        "{e}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        cluster.worker_stats(WorkerId(0)).unwrap().tasks_succeeded,
        0,
        "the owner's overwrite ran during the quarantine"
    );
    kill(pid, Signal::SIGCONT).unwrap();
    cluster
        .wait(over)
        .unwrap_or_else(|e| panic!("{e}; worker 1's log:\n{}", w1.log()));
    let all_seven = |m: &strata_orchestrator::DeviceMapping| {
        let mut b = vec![0u8; 4096];
        m.read(0, &mut b).unwrap();
        b.chunks(4).all(|c| c == 7f32.to_le_bytes())
    };
    assert!(all_seven(&mapped));
    std::thread::sleep(Duration::from_millis(2000));
    assert!(
        all_seven(&mapped),
        "a late write landed on a reported result"
    );
}
