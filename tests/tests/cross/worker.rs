//! `strata worker` against a test client that speaks the protocol as an
//! orchestrator would.

use crate::faults::test_worker_bin;
use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use strata_chip_runtime::KernelHandle;
use strata_client::{Handshake, TaskStream, WorkerClient};
use strata_proto::convert::{FailureKind, TaskCompletion, TaskOutcome, TaskRequest};
use strata_proto::{TaskId, pb};
use strata_tests::{SharedBuffer, WorkerProcess, strata_bin};
use strata_wire::{Access, ArgTag, DType, IdentityMint, TaskArgs, Tensor};

pub(crate) fn mint() -> IdentityMint {
    IdentityMint::new(rand_owner())
}

fn rand_owner() -> [u8; 8] {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    (t as u64 ^ u64::from(std::process::id())).to_le_bytes()
}

pub(crate) async fn session(w: &WorkerProcess) -> (WorkerClient, Handshake) {
    let mut c = WorkerClient::connect(&w.endpoint, None)
        .await
        .expect("connect");
    let hs = c.handshake().await.expect("handshake");
    (c, hs)
}

/// Sends `tasks` and collects completions until every id has one.
pub(crate) async fn run_all(
    stream: &mut TaskStream,
    tasks: &[TaskRequest],
) -> HashMap<u64, TaskCompletion> {
    stream.send(tasks).await.expect("send");
    collect(stream, tasks.len()).await
}

async fn collect(stream: &mut TaskStream, n: usize) -> HashMap<u64, TaskCompletion> {
    let mut got = HashMap::new();
    while got.len() < n {
        let batch = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("completions in time")
            .expect("stream ok")
            .expect("stream open");
        for c in batch {
            assert!(got.insert(c.id.0, c).is_none(), "a task completed twice");
        }
    }
    got
}

pub(crate) fn task(
    id: u64,
    callable: KernelHandle,
    tensors: Vec<Tensor>,
    tags: Vec<ArgTag>,
    scalars: Vec<u64>,
) -> TaskRequest {
    let n = tensors.len();
    TaskRequest {
        id: TaskId(id),
        callable,
        args: TaskArgs::new(tensors, scalars).unwrap(),
        tags,
        inline: vec![None; n],
        staged: Vec::new(),
        cache: Vec::new(),
        required_features: strata_proto::convert::Features::NONE,
        priority: 0,
    }
}

pub(crate) fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Fails unless `c` is a failure of `kind` whose cause contains `needle`.
pub(crate) fn assert_failed(c: &TaskCompletion, kind: FailureKind, needle: &str) {
    match &c.outcome {
        TaskOutcome::Failure(cause) => {
            assert_eq!(cause.kind, kind, "task {}: {cause}", c.id.0);
            assert!(
                cause.message.contains(needle),
                "cause {cause:?} lacks {needle:?}"
            )
        }
        other => panic!("expected a failure containing {needle:?}, got {other:?}"),
    }
}

/// A 64×64 F32 matrix in a memfd: `add` over strided views of it (the
/// transpose of one quadrant plus another quadrant into a third), with the
/// result read back from the test's own mapping.
#[tokio::test(flavor = "multi_thread")]
async fn add_over_memfd_views() {
    let w = WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--device", "sim:mem=64MiB,lanes=2"],
    );
    let (mut client, hs) = session(&w).await;
    assert_eq!(hs.worker.chip_id, 0);
    assert!(hs.worker.device_spec.starts_with("sim:mem=64MiB"));
    let add = hs.callable("add", 1).expect("add offered");
    let mint = mint();
    let mut buf = SharedBuffer::new(&mint, 64 * 64 * 4, Access::ReadWrite);
    let values: Vec<u8> = (0..64 * 64)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    buf.write(0, &values);
    let mut fds = client.fd_channel().await.unwrap();
    let acks = fds
        .import(&[*buf.descriptor().identity()], &[buf.fd()])
        .await
        .unwrap();
    assert_eq!(acks, vec![Ok(())]);

    let d = buf.descriptor();
    let quadrant = |r0: u64, c0: u64, transposed: bool| {
        let strides: [u32; 2] = if transposed { [1, 64] } else { [64, 1] };
        let (r0, c0) = if transposed { (c0, r0) } else { (r0, c0) };
        Tensor::new(d, (r0 * 64 + c0) * 4, &[32, 32], &strides, DType::F32).unwrap()
    };
    let a = quadrant(0, 0, true); // transpose of the top-left quadrant
    let b = quadrant(0, 32, false); // top-right
    let out = quadrant(32, 32, false); // bottom-right
    let mut stream = client.open_tasks().await.unwrap();
    let done = run_all(
        &mut stream,
        &[task(
            1,
            add,
            vec![a, b, out],
            vec![ArgTag::Input, ArgTag::Input, ArgTag::Output],
            vec![],
        )],
    )
    .await;
    assert_eq!(done[&1].outcome, TaskOutcome::Success, "{}", w.log());
    for i in 0..32usize {
        let row = f32s(&buf.read(((32 + i) * 64 + 32) * 4, 32 * 4));
        for (j, got) in row.iter().enumerate() {
            let want = (j * 64 + i) as f32 + (i * 64 + 32 + j) as f32;
            assert_eq!(*got, want, "out[{i}][{j}]");
        }
    }
    // The untouched bottom-left quadrant is as it was.
    assert_eq!(
        buf.read(32 * 64 * 4, 32 * 4),
        values[32 * 64 * 4..32 * 64 * 4 + 128]
    );
    let stats = client.stats().await.unwrap();
    assert_eq!((stats.tasks_succeeded, stats.imports), (1, 1));
}

/// 1,000 tasks in flight on one stream: every one completes exactly once,
/// and each wrote its own element.
#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_tasks_in_flight_complete_once() {
    let w = WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--device", "sim:mem=64MiB,lanes=2"],
    );
    let (mut client, hs) = session(&w).await;
    let fill = hs.callable("fill", 1).unwrap();
    let mint = mint();
    let buf = SharedBuffer::new(&mint, 1000 * 4, Access::ReadWrite);
    let mut fds = client.fd_channel().await.unwrap();
    assert_eq!(
        fds.import(&[*buf.descriptor().identity()], &[buf.fd()])
            .await
            .unwrap(),
        vec![Ok(())]
    );
    let tasks: Vec<TaskRequest> = (0..1000u64)
        .map(|i| {
            let v = Tensor::new(buf.descriptor(), i * 4, &[1], &[1], DType::F32).unwrap();
            task(
                i,
                fill,
                vec![v],
                vec![ArgTag::Output],
                vec![(i as f64 + 0.5).to_bits()],
            )
        })
        .collect();
    let mut stream = client.open_tasks().await.unwrap();
    // All 1,000 go out before any completion is read.
    for chunk in tasks.chunks(100) {
        stream.send(chunk).await.unwrap();
    }
    let done = collect(&mut stream, 1000).await;
    assert_eq!(done.len(), 1000);
    assert!(done.values().all(|c| c.outcome == TaskOutcome::Success));
    let vals = f32s(&buf.read(0, 4000));
    for (i, v) in vals.iter().enumerate() {
        assert_eq!(*v, i as f32 + 0.5);
    }
    // Nothing more arrives: no duplicates.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), stream.next())
            .await
            .is_err()
    );
}

/// Bad input is refused with a clear error, and the worker keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_refused_and_the_worker_keeps_serving() {
    let w = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &["--device", "sim:mem=64MiB"]);
    let (mut client, hs) = session(&w).await;
    let fill = hs.callable("fill", 1).unwrap();
    let mint = mint();
    let good = SharedBuffer::new(&mint, 256, Access::ReadWrite);
    let small = SharedBuffer::new(&mint, 64, Access::ReadWrite);
    let liar = SharedBuffer::new(&mint, 256, Access::ReadWrite);
    let mut fds = client.fd_channel().await.unwrap();

    // Pipes and regular files are refused when they arrive.
    let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
    let file = tempfile::tempfile().unwrap();
    let pipe_id = mint.mint().unwrap();
    let file_id = mint.mint().unwrap();
    let acks = fds
        .import(
            &[pipe_id, file_id],
            &[
                std::os::fd::AsFd::as_fd(&pipe_r),
                std::os::fd::AsFd::as_fd(&file),
            ],
        )
        .await
        .unwrap();
    assert!(
        acks[0].as_ref().unwrap_err().contains("not tmpfs/shmem"),
        "{acks:?}"
    );
    assert!(acks[1].as_ref().unwrap_err().contains("magic"), "{acks:?}");

    // The small memfd and the one whose body names another inode pass the
    // arrival check and fail at first use.
    let liar_desc = {
        let d = liar.descriptor();
        strata_wire::BufferDescriptor::new(
            *d.identity(),
            256,
            d.address_space(),
            d.access(),
            strata_wire::Backing::Memfd {
                st_dev: 1,
                st_ino: 2,
            },
        )
        .unwrap()
    };
    let small_desc = {
        let d = small.descriptor();
        strata_wire::BufferDescriptor::new(
            *d.identity(),
            256,
            d.address_space(),
            d.access(),
            *d.backing(),
        )
        .unwrap()
    };
    let ids = [
        *good.descriptor().identity(),
        *small.descriptor().identity(),
        *liar.descriptor().identity(),
    ];
    let acks = fds
        .import(&ids, &[good.fd(), small.fd(), liar.fd()])
        .await
        .unwrap();
    assert_eq!(acks, vec![Ok(()), Ok(()), Ok(())]);
    // A second import of a live identity is refused.
    let again = fds.import(&ids[..1], &[good.fd()]).await.unwrap();
    assert!(again[0].as_ref().unwrap_err().contains("already imported"));

    let ok_view = Tensor::new(good.descriptor(), 0, &[4], &[1], DType::F32).unwrap();
    let mut stream = client.open_tasks().await.unwrap();
    let good_task = |id| {
        task(
            id,
            fill,
            vec![ok_view],
            vec![ArgTag::Output],
            vec![1f64.to_bits()],
        )
    };

    // A blob with a bad magic, and one whose view runs past nbytes.
    let mut bad_magic: pb::Task = (&good_task(1)).into();
    bad_magic.args[8] ^= 0xff;
    let mut past_end: pb::Task = (&good_task(2)).into();
    past_end.args[8 + 88..8 + 96].copy_from_slice(&248u64.to_le_bytes());
    stream
        .send_raw(pb::TaskBatch {
            tasks: vec![bad_magic, past_end],
        })
        .await
        .unwrap();
    let done = collect(&mut stream, 2).await;
    assert_failed(&done[&1], FailureKind::Refused, "tensors[0].buffer.magic");
    assert_failed(&done[&2], FailureKind::Refused, "view out of bounds");

    let v = |d, n: u32| Tensor::new(d, 0, &[n], &[1], DType::F32).unwrap();
    let batch = vec![
        task(
            3,
            fill,
            vec![v(small_desc, 64)],
            vec![ArgTag::Output],
            vec![0],
        ),
        task(
            4,
            fill,
            vec![v(liar_desc, 4)],
            vec![ArgTag::Output],
            vec![0],
        ),
        task(
            5,
            KernelHandle([7; 16]),
            vec![ok_view],
            vec![ArgTag::Output],
            vec![0],
        ),
        task(
            6,
            fill,
            vec![v(pipe_desc(&mint), 4)],
            vec![ArgTag::Output],
            vec![0],
        ),
        task(7, fill, vec![ok_view], vec![ArgTag::Input], vec![0]),
        good_task(8),
    ];
    let done = run_all(&mut stream, &batch).await;
    assert_failed(
        &done[&3],
        FailureKind::ImportRefused,
        "holds 64 bytes but the buffer has nbytes 256",
    );
    assert_failed(
        &done[&4],
        FailureKind::ImportRefused,
        "but the MEMFD body names (1, 2)",
    );
    assert_failed(&done[&5], FailureKind::Refused, "unknown callable 07070707");
    assert_failed(
        &done[&6],
        FailureKind::ImportRefused,
        "was not imported by this session",
    );
    assert_failed(
        &done[&7],
        FailureKind::ImportRefused,
        "tagged INPUT, but the kernel writes it",
    );
    assert_eq!(done[&8].outcome, TaskOutcome::Success);
    assert_eq!(f32s(&good.read(0, 16)), vec![1.0; 4]);

    // A wrong protocol version is refused at the handshake.
    let mut other = WorkerClient::connect(&w.endpoint, None).await.unwrap();
    let err = other
        .handshake_with_version(99)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "protocol version 99 refused: this worker speaks version {}",
            strata_proto::PROTOCOL_VERSION
        )),
        "{err}"
    );
    // ...and the first session still works.
    let done = run_all(&mut stream, &[good_task(9)]).await;
    assert_eq!(done[&9].outcome, TaskOutcome::Success);
}

fn pipe_desc(mint: &IdentityMint) -> strata_wire::BufferDescriptor {
    strata_wire::BufferDescriptor::new(
        mint.mint().unwrap(),
        64,
        strata_wire::AddressSpace::Host,
        Access::ReadWrite,
        strata_wire::Backing::Memfd {
            st_dev: 0,
            st_ino: 0,
        },
    )
    .unwrap()
}

/// A TCP worker refuses clients with a wrong or missing token.
#[tokio::test(flavor = "multi_thread")]
async fn tcp_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let w = WorkerProcess::spawn_tcp(
        &strata_bin(),
        &["worker"],
        &["--token-file", token.to_str().unwrap()],
    );
    for bad in [None, Some("wrong-token")] {
        let mut c = WorkerClient::connect(&w.endpoint, bad).await.unwrap();
        let err = c.handshake().await.unwrap_err().to_string();
        assert!(err.contains("bearer token"), "{err}");
    }
    let mut c = WorkerClient::connect(&w.endpoint, Some("s3cret-token"))
        .await
        .unwrap();
    let hs = c.handshake().await.unwrap();
    assert_eq!(hs.fd_socket, None, "TCP workers have no fd channel");
    assert!(w.log().contains("refused a call with a wrong bearer token"));
    assert!(w.log().contains("refused a call without a bearer token"));
}

/// A TCP listener without authentication needs --insecure.
#[test]
fn tcp_without_auth_needs_insecure() {
    let out = std::process::Command::new(strata_bin())
        .args(["worker", "--listen", "tcp:127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("without authentication"));
}

/// A panicking user kernel fails its task; the next task succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_kernel_fails_only_its_task() {
    let w = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let (mut client, hs) = session(&w).await;
    let panic = hs.callable("test.panic", 1).expect("user kernel offered");
    let noop = hs.callable("noop", 1).unwrap();
    let mut stream = client.open_tasks().await.unwrap();
    let done = run_all(&mut stream, &[task(1, panic, vec![], vec![], vec![])]).await;
    assert_failed(
        &done[&1],
        FailureKind::Kernel,
        "test.panic@1 panicked: test.panic was asked to panic",
    );
    let done = run_all(&mut stream, &[task(2, noop, vec![], vec![], vec![])]).await;
    assert_eq!(done[&2].outcome, TaskOutcome::Success);
    assert_eq!(client.stats().await.unwrap().kernels_panicked, 1);
}

/// Many imports and releases leave no fd behind in the worker.
#[tokio::test(flavor = "multi_thread")]
async fn no_fd_leaks() {
    let w = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &[]);
    let (mut client, hs) = session(&w).await;
    let fill = hs.callable("fill", 1).unwrap();
    let mut fds = client.fd_channel().await.unwrap();
    let mut stream = client.open_tasks().await.unwrap();
    // The worker accepts the fd channel on its own time: an empty import is
    // answered only once it has, so the baseline counts that connection.
    assert!(fds.import(&[], &[]).await.unwrap().is_empty());
    let before = w.fds();
    let baseline = before.len();
    let mint = mint();
    for round in 0..10u64 {
        let bufs: Vec<SharedBuffer> = (0..20)
            .map(|_| SharedBuffer::new(&mint, 4096, Access::ReadWrite))
            .collect();
        let ids: Vec<_> = bufs.iter().map(|b| *b.descriptor().identity()).collect();
        let raw: Vec<_> = bufs.iter().map(SharedBuffer::fd).collect();
        assert!(
            fds.import(&ids, &raw)
                .await
                .unwrap()
                .iter()
                .all(Result::is_ok)
        );
        // Extra fds beyond the declared identities are closed on arrival.
        let extra = SharedBuffer::new(&mint, 64, Access::ReadWrite);
        let acks = fds.import(&ids[..0], &[extra.fd()]).await.unwrap();
        assert!(acks.is_empty());
        let tasks: Vec<_> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let v = Tensor::new(b.descriptor(), 0, &[1024], &[1], DType::F32).unwrap();
                task(
                    round * 100 + i as u64,
                    fill,
                    vec![v],
                    vec![ArgTag::Output],
                    vec![0],
                )
            })
            .collect();
        let done = run_all(&mut stream, &tasks).await;
        assert!(done.values().all(|c| c.outcome == TaskOutcome::Success));
        assert_eq!(client.release_imports(&ids).await.unwrap(), 20);
    }
    // Released mappings and fds go once their tasks are done.
    let mut now = w.fd_count();
    for _ in 0..500 {
        if now <= baseline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        now = w.fd_count();
    }
    assert_eq!(
        now,
        baseline,
        "fds: baseline {baseline}, after 200 imports and releases {now}\nbefore: {before:?}\nafter: {:?}",
        w.fds()
    );
    assert_eq!(client.stats().await.unwrap().imports, 0);
}

/// When the orchestrator's connection drops, its imports and device buffers
/// are released and the worker serves the next session.
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_session_is_cleaned_up() {
    let w = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &["--device", "sim:mem=64MiB"]);
    let mint = mint();
    {
        let (mut client, _) = session(&w).await;
        let buf = SharedBuffer::new(&mint, 4096, Access::ReadWrite);
        let mut fds = client.fd_channel().await.unwrap();
        assert_eq!(
            fds.import(&[*buf.descriptor().identity()], &[buf.fd()])
                .await
                .unwrap(),
            vec![Ok(())]
        );
        let dev = mint.mint().unwrap();
        client
            .device_alloc(&dev, 1 << 20, strata_chip_runtime::Region::Persistent)
            .await
            .unwrap();
        client.copy_to_device(&dev, 0, vec![5; 100]).await.unwrap();
        assert_eq!(
            client.copy_from_device(&dev, 0, 100).await.unwrap(),
            vec![5; 100]
        );
        let _stream = client.open_tasks().await.unwrap();
        let s = client.stats().await.unwrap();
        assert_eq!((s.imports, s.persistent.in_use), (1, 1 << 20));
        // Everything of this session is dropped here.
    }
    let (mut client, _) = session(&w).await;
    let mut s = client.stats().await.unwrap();
    for _ in 0..100 {
        if s.imports == 0 && s.sessions == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        s = client.stats().await.unwrap();
    }
    assert_eq!(
        (s.imports, s.sessions, s.persistent.in_use),
        (0, 1, 0),
        "{}",
        w.log()
    );
}

/// A client that handshakes, allocates and never opens its task stream
/// loses the session after the grace period: nothing is held for ever by
/// peers that go quiet before they start.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_without_a_task_stream_is_ended_after_the_grace_period() {
    let w = WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--device", "sim:mem=64MiB", "--session-grace-ms", "300"],
    );
    let mint = mint();
    let (mut idle, _) = session(&w).await;
    let dev = mint.mint().unwrap();
    idle.device_alloc(&dev, 1 << 20, strata_chip_runtime::Region::Persistent)
        .await
        .unwrap();
    // A session with a task stream stays.
    let (mut busy, _) = session(&w).await;
    let _stream = busy.open_tasks().await.unwrap();
    let s = busy.stats().await.unwrap();
    assert_eq!((s.sessions, s.persistent.in_use), (2, 1 << 20));
    tokio::time::sleep(Duration::from_millis(700)).await;
    let s = busy.stats().await.unwrap();
    assert_eq!(
        (s.sessions, s.persistent.in_use),
        (1, 0),
        "the idle session and its device buffer are gone: {}",
        w.log()
    );
    let e = idle.stats().await.unwrap_err().to_string();
    assert!(e.contains("unknown or has ended"), "{e}");
    assert!(
        w.log()
            .contains("no task stream opened within the grace period")
    );
}

/// SIGTERM: in-flight tasks finish, the worker exits 0 and removes its
/// sockets.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_finishes_in_flight_work_and_exits_zero() {
    let mut w = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let (mut client, hs) = session(&w).await;
    let sleep = hs.callable("test.sleep", 1).unwrap();
    let mut stream = client.open_tasks().await.unwrap();
    stream
        .send(&[task(1, sleep, vec![], vec![], vec![300])])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let collector = tokio::spawn(async move { collect(&mut stream, 1).await });
    let status = tokio::task::spawn_blocking(move || {
        let s = w.terminate(Duration::from_secs(10));
        (s, w)
    })
    .await
    .unwrap();
    let done = collector.await.unwrap();
    assert_eq!(
        done[&1].outcome,
        TaskOutcome::Success,
        "the running task finished"
    );
    assert!(status.0.success(), "exit status {:?}", status.0);
    let sock = match &status.1.endpoint {
        strata_client::Endpoint::Unix(p) => p.clone(),
        other => panic!("{other}"),
    };
    assert!(!sock.exists(), "socket removed");
}

/// A CA and certificates signed by it, PEM.
pub(crate) struct Pki {
    pub(crate) ca: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    pub(crate) fn new(name: &str) -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&key).unwrap().pem();
        Pki {
            ca,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// (certificate, key) for `name`.
    pub(crate) fn leaf(&self, name: &str) -> (String, String) {
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        (
            params.signed_by(&key, &self.issuer).unwrap().pem(),
            key.serialize_pem(),
        )
    }
}

/// TLS with client certificates: a client with a certificate from the
/// worker's CA gets in; one from another CA, or with none, does not.
#[tokio::test(flavor = "multi_thread")]
async fn tls_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Pki::new("strata test CA");
    let rogue = Pki::new("some other CA");
    let (server_cert, server_key) = ca.leaf("localhost");
    let write = |name: &str, pem: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, pem).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let args = [
        "--tls-cert".to_owned(),
        write("server.pem", &server_cert),
        "--tls-key".to_owned(),
        write("server.key", &server_key),
        "--tls-client-ca".to_owned(),
        write("ca.pem", &ca.ca),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let w = WorkerProcess::spawn_tcp(&strata_bin(), &["worker"], &args);
    let tls = |(cert, key): (String, String)| strata_client::ClientTls {
        ca_pem: ca.ca.clone().into_bytes(),
        cert_pem: cert.into_bytes(),
        key_pem: key.into_bytes(),
        domain: "localhost".into(),
    };
    let mut good = WorkerClient::connect_with(&w.endpoint, None, Some(&tls(ca.leaf("driver"))))
        .await
        .unwrap();
    assert_eq!(good.handshake().await.unwrap().worker.chip_id, 0);
    let outsider = tls(rogue.leaf("driver"));
    let refused = match WorkerClient::connect_with(&w.endpoint, None, Some(&outsider)).await {
        Err(_) => true,
        Ok(mut c) => c.handshake().await.is_err(),
    };
    assert!(refused, "a client certificate from another CA is refused");
    let plain = match WorkerClient::connect(&w.endpoint, None).await {
        Err(_) => true,
        Ok(mut c) => c.handshake().await.is_err(),
    };
    assert!(plain, "a client without TLS is refused");
}

/// A Unix connection from another uid is refused by its peer credentials
/// even when the socket's mode would let it in (root only: it needs to run
/// a process as another user).
#[tokio::test(flavor = "multi_thread")]
async fn unix_connections_from_other_uids_are_refused() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to connect as another uid");
        return;
    }
    let w = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &[]);
    let strata_client::Endpoint::Unix(sock) = w.endpoint.clone() else {
        panic!()
    };
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&sock).unwrap().permissions())
            & 0o777,
        0o600
    );
    // Open the socket and its directory to everyone, then connect as nobody.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        sock.parent().unwrap(),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let script = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.settimeout(30)\ntry:\n  s.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n')\n  n=len(s.recv(100))\nexcept (ConnectionResetError, BrokenPipeError):\n  n=0\nprint(n)";
    let out = std::process::Command::new("python3")
        .args(["-c", script, sock.to_str().unwrap()])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0",
        "the worker closed the connection: {out:?}"
    );
    assert!(
        w.log()
            .contains("refused a Unix connection from another user"),
        "{}",
        w.log()
    );
    // Our own uid still gets in.
    let mut c = WorkerClient::connect(&w.endpoint, None).await.unwrap();
    c.handshake().await.unwrap();
}

/// The health stream beats while the worker serves.
#[tokio::test(flavor = "multi_thread")]
async fn health_beats() {
    let w = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &[]);
    let (mut client, _) = session(&w).await;
    let mut beats = client.health(20).await.unwrap();
    let mut seqs = Vec::new();
    for _ in 0..3 {
        let b = tokio::time::timeout(Duration::from_secs(2), beats.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seqs.push(b.seq);
    }
    assert_eq!(seqs, vec![1, 2, 3]);
    assert_eq!(client.ping(b"hi".to_vec()).await.unwrap(), b"hi");
}

/// Views larger than one message travel in chunks: an input staged ahead
/// of its task (`Stage`, then a reference in the task) and a written view
/// held by the worker for one `Fetch`; small views still travel in the
/// messages. Every malformed `Stage` is refused with why, a reference to
/// bytes never staged fails only its task, and the stream goes on.
#[tokio::test(flavor = "multi_thread")]
async fn views_larger_than_a_message_are_staged_and_fetched() {
    let w = WorkerProcess::spawn_tcp(
        &strata_bin(),
        &["worker"],
        &["--insecure", "--max-message-bytes", "1048576"],
    );
    let (mut client, hs) = session(&w).await;
    let fill = hs.callable("fill", 1).unwrap();
    let copy = hs.callable("copy", 1).unwrap();
    let mut stream = client.open_tasks().await.unwrap();
    let mint = mint();
    let n = 768 * 1024u32; // 3 MiB of F32: three messages' worth
    let src = SharedBuffer::new(&mint, u64::from(n) * 4, Access::ReadWrite);
    let dst = SharedBuffer::new(&mint, u64::from(n) * 4, Access::ReadWrite);
    let small = SharedBuffer::new(&mint, 4096, Access::ReadWrite);
    let view =
        |b: &SharedBuffer, n: u32| Tensor::new(b.descriptor(), 0, &[n], &[1], DType::F32).unwrap();
    let input: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    client
        .stage(41, bytes::Bytes::from(input.clone()), 1 << 19)
        .await
        .expect("staged");

    let mut copy_task = task(
        1,
        copy,
        vec![view(&src, n), view(&dst, n)],
        vec![ArgTag::Input, ArgTag::Output],
        vec![],
    );
    copy_task.staged = vec![(0, 41)];
    copy_task.inline = vec![None, Some(Default::default())];
    let mut fill_big = task(
        2,
        fill,
        vec![view(&dst, n)],
        vec![ArgTag::Output],
        vec![2.5f64.to_bits()],
    );
    fill_big.inline = vec![Some(Default::default())];
    let mut fill_small = task(
        3,
        fill,
        vec![view(&small, 1024)],
        vec![ArgTag::Output],
        vec![1.5f64.to_bits()],
    );
    fill_small.inline = vec![Some(Default::default())];
    // Bytes staged once are used once: a second task naming them fails.
    let mut again = copy_task.clone();
    again.id = TaskId(4);
    let done = run_all(&mut stream, &[copy_task, fill_big, fill_small]).await;

    // The copy read the staged bytes; what it wrote is held, not sent.
    let c = &done[&1];
    assert_eq!(c.outcome, TaskOutcome::Success);
    assert!(
        c.outputs.is_empty(),
        "3 MiB cannot travel in a 1 MiB message"
    );
    let &[(1, id)] = &c.held[..] else {
        panic!("expected argument 1 held, got {:?}", c.held)
    };
    let back = client.fetch(id, u64::from(n) * 4).await.expect("fetched");
    assert!(back == input, "the copy's bytes came back changed");
    let e = client.fetch(id, u64::from(n) * 4).await.unwrap_err();
    assert!(e.to_string().contains("fetched already"), "{e}");

    let c = &done[&2];
    let &[(0, id)] = &c.held[..] else {
        panic!("expected argument 0 held, got {:?}", c.held)
    };
    let e = client.fetch(id, 16).await.unwrap_err();
    assert!(e.to_string().contains("more than the 16 bytes"), "{e}");
    assert_eq!(done[&3].outcome, TaskOutcome::Success);
    assert_eq!(f32s(&done[&3].outputs[0].1), vec![1.5; 1024]);

    let done = run_all(&mut stream, &[again]).await;
    assert_failed(&done[&4], FailureKind::Refused, "no staged bytes 41");

    // Malformed stages, each refused with why; the session goes on.
    let bad = |stage: u64, total: u64, data: Vec<u8>| pb::StageChunk {
        stage,
        total,
        data: data.into(),
    };
    let mut raw = client.clone();
    let mut refused =
        async |chunks: Vec<pb::StageChunk>| raw.stage_chunks(chunks).await.unwrap_err().to_string();
    assert!(
        refused(vec![bad(0, 4, vec![0; 4])])
            .await
            .contains("nonzero id")
    );
    assert!(refused(vec![bad(5, 0, vec![])]).await.contains("total 0"));
    let huge = strata_proto::MAX_INLINE_EXTENT + 1;
    assert!(
        refused(vec![bad(5, huge, vec![0; 4])])
            .await
            .contains("the largest inline view")
    );
    assert!(
        refused(vec![bad(5, 4, vec![0; 3]), bad(0, 0, vec![0; 2])])
            .await
            .contains("runs past the announced 4 bytes")
    );
    assert!(
        refused(vec![bad(5, 4, vec![0; 3])])
            .await
            .contains("3 of the announced 4 bytes")
    );
    assert!(
        refused(vec![bad(5, 4, vec![0; 2]), bad(6, 0, vec![0; 2])])
            .await
            .contains("one call stages one id")
    );
    client
        .stage(5, bytes::Bytes::from_static(&[1, 2, 3, 4]), 1 << 19)
        .await
        .expect("the id is free again");
    let e = client
        .stage(5, bytes::Bytes::from_static(&[1]), 1 << 19)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
}

/// A DEVICE_MALLOC view of `n` F32 at a device address.
pub(crate) fn device_view(identity: strata_wire::CanonicalIdentity, addr: u64, n: u32) -> Tensor {
    let desc = strata_wire::BufferDescriptor::new(
        identity,
        u64::from(n) * 4,
        strata_wire::AddressSpace::Device,
        Access::ReadWrite,
        strata_wire::Backing::DeviceMalloc {
            addr: std::num::NonZeroU64::new(addr).unwrap(),
        },
    )
    .unwrap();
    Tensor::new(desc, 0, &[n], &[1], DType::F32).unwrap()
}

/// One device, two sessions: session A's run ends while B's run buffers
/// are live. A's run buffers are refused from then on (copies, frees and
/// task arguments, each naming the run that ended); B's keep working, and
/// the run region is reset wholesale only when B's run ends too. A task
/// that still holds a retired run buffer (queued behind a long kernel)
/// keeps it valid until it finishes, and the reset waits for it.
#[tokio::test(flavor = "multi_thread")]
async fn a_sessions_run_end_retires_only_its_run_buffers() {
    let w = WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--device", "sim:mem=64MiB,run=1MiB,lanes=1"],
    );
    let mint = mint();
    let (mut a, hs) = session(&w).await;
    let (mut b, _) = session(&w).await;
    let mut a_tasks = a.open_tasks().await.unwrap();
    let mut b_tasks = b.open_tasks().await.unwrap();
    let fill = hs.callable("fill", 1).unwrap();
    let matmul = hs.callable("matmul", 1).unwrap();
    let region = strata_chip_runtime::Region::Run;
    let (ra, rb) = (mint.mint().unwrap(), mint.mint().unwrap());
    let ra_addr = a.device_alloc(&ra, 4096, region).await.unwrap();
    let rb_addr = b.device_alloc(&rb, 4096, region).await.unwrap();
    a.copy_to_device(&ra, 0, vec![1; 4096]).await.unwrap();
    b.copy_to_device(&rb, 0, vec![2; 4096]).await.unwrap();
    let before = a.stats().await.unwrap().run;
    assert_eq!(before.in_use, 8192);

    // A's run ends; B still holds a run buffer, so no reset yet.
    let end = a.end_run().await.unwrap();
    assert_eq!((end.retired, end.run, end.reset), (1, 1, false));
    let s = a.stats().await.unwrap().run;
    assert_eq!((s.in_use, s.frees), (8192, before.frees), "not reset");
    let refused = [
        a.copy_from_device(&ra, 0, 4).await.unwrap_err(),
        a.copy_to_device(&ra, 0, vec![0; 4]).await.unwrap_err(),
        a.device_free(&ra).await.unwrap_err(),
    ];
    for e in refused {
        let msg = e.to_string();
        assert!(
            msg.contains(&format!(
                "device buffer {ra} was a run-region buffer of run 0 of this session, which has ended"
            )),
            "{msg}"
        );
    }
    let done = run_all(
        &mut a_tasks,
        &[task(
            1,
            fill,
            vec![device_view(ra, ra_addr, 1024)],
            vec![ArgTag::Output],
            vec![3.0f64.to_bits()],
        )],
    )
    .await;
    assert_failed(
        &done[&1],
        FailureKind::ImportRefused,
        "run-region buffer of run 0 of this session, which has ended",
    );
    // B's buffer is intact and usable, by copies and tasks.
    assert_eq!(
        b.copy_from_device(&rb, 0, 4096).await.unwrap(),
        vec![2; 4096]
    );
    let done = run_all(
        &mut b_tasks,
        &[task(
            1,
            fill,
            vec![device_view(rb, rb_addr, 1024)],
            vec![ArgTag::Output],
            vec![4.0f64.to_bits()],
        )],
    )
    .await;
    assert!(matches!(done[&1].outcome, TaskOutcome::Success));
    assert_eq!(
        f32s(&b.copy_from_device(&rb, 0, 16).await.unwrap()),
        vec![4.0; 4]
    );

    // B's run ends while a task of B still holds its run buffer: the task
    // is queued behind a long matmul on the one lane. The lease keeps the
    // block (and the region) until the task is done.
    const M: u32 = 512;
    let mats: Vec<_> = (0..3).map(|_| mint.mint().unwrap()).collect();
    let mut views = Vec::new();
    for id in &mats {
        let addr = b
            .device_alloc(
                id,
                u64::from(M * M) * 4,
                strata_chip_runtime::Region::Persistent,
            )
            .await
            .unwrap();
        let desc = device_view(*id, addr, M * M);
        views.push(Tensor::new(*desc.buffer(), 0, &[M, M], &[M, 1], DType::F32).unwrap());
    }
    let slow = task(
        2,
        matmul,
        views.clone(),
        vec![ArgTag::Input, ArgTag::Input, ArgTag::Output],
        vec![],
    );
    let queued = task(
        3,
        fill,
        vec![device_view(rb, rb_addr, 1024)],
        vec![ArgTag::Output],
        vec![5.0f64.to_bits()],
    );
    b_tasks.send(&[slow, queued]).await.unwrap();
    // Both tasks are taken in once in flight; the fill looks its buffer
    // up (taking its lease) microseconds after it is counted, and the
    // matmul runs for far longer than the grace given here (checked below).
    for _ in 0..500 {
        if b.stats().await.unwrap().tasks_in_flight == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let end = b.end_run().await.unwrap();
    let in_flight = b.stats().await.unwrap().tasks_in_flight;
    assert_eq!((end.retired, end.run), (1, 1));
    assert!(
        !end.reset && in_flight > 0,
        "the queued task's lease holds the region (in flight {in_flight}); {}",
        w.log()
    );
    let done = collect(&mut b_tasks, 2).await;
    assert!(matches!(done[&2].outcome, TaskOutcome::Success));
    eprintln!(
        "matmul {M}: {} ms on the lane",
        done[&2].busy_ns / 1_000_000
    );
    assert!(
        matches!(done[&3].outcome, TaskOutcome::Success),
        "a retired buffer a task already holds stays valid: {:?}",
        done[&3].outcome
    );
    // Now no one holds a run buffer: the region was reset wholesale.
    let s = b.stats().await.unwrap().run;
    assert_eq!((s.in_use, s.frees), (0, before.frees + 1), "one reset");
    assert!(b.copy_from_device(&rb, 0, 4).await.is_err());

    // The next run starts at the bottom of the region again; the old
    // handle still names the old run, although the bytes are reused.
    let ra2 = mint.mint().unwrap();
    assert_eq!(a.device_alloc(&ra2, 4096, region).await.unwrap(), ra_addr);
    a.copy_to_device(&ra2, 0, vec![6; 4096]).await.unwrap();
    assert!(a.copy_from_device(&ra, 0, 4).await.is_err());
    assert_eq!(a.copy_from_device(&ra2, 0, 4).await.unwrap(), vec![6; 4]);
}

/// The device cache through a real worker: a second task reading the same
/// imported bytes at the same version finds them on the chip; a task
/// naming another version reads host memory again; another session never
/// finds the first one's copies; releasing the import drops its copies.
/// A write the task keeps on the chip (deferred) reaches host memory only
/// when the session asks: `Flush` names the byte sets (as views) or whole
/// buffers, writes back this session's dirty copies alone, and refuses
/// what is malformed or too much, naming it.
#[tokio::test(flavor = "multi_thread")]
async fn a_flush_writes_back_the_named_dirty_copies_only() {
    use strata_proto::convert::CacheArg;
    let w = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &["--device", "sim:mode=staged"]);
    let (mut client, hs) = session(&w).await;
    let copy = hs.callable("copy", 1).unwrap();
    let mut fds = client.fd_channel().await.unwrap();
    let mut stream = client.open_tasks().await.unwrap();
    let mint = mint();
    let mut bufs: Vec<SharedBuffer> = (0..3)
        .map(|_| SharedBuffer::new(&mint, 256, Access::ReadWrite))
        .collect();
    bufs[0].write(0, &[9u8; 256]);
    let ids: Vec<_> = bufs.iter().map(|b| *b.descriptor().identity()).collect();
    let raw: Vec<_> = bufs.iter().map(SharedBuffer::fd).collect();
    assert!(
        fds.import(&ids, &raw)
            .await
            .unwrap()
            .iter()
            .all(Result::is_ok)
    );
    let view = |b: &SharedBuffer| Tensor::new(b.descriptor(), 0, &[64], &[1], DType::F32).unwrap();
    let copy_to = |id, dst: &SharedBuffer| {
        let mut t = task(
            id,
            copy,
            vec![view(&bufs[0]), view(dst)],
            vec![ArgTag::Input, ArgTag::Output],
            vec![],
        );
        t.cache = vec![CacheArg {
            index: 1,
            version: 0,
            written: 10 + id,
            deferred: true,
            held: false,
        }];
        t
    };
    for (id, dst) in [(1, 1), (2, 2)] {
        let done = run_all(&mut stream, &[copy_to(id, &bufs[dst])]).await;
        assert_eq!(done[&id].outcome, TaskOutcome::Success);
    }
    assert_eq!(
        bufs[1].read(0, 256),
        vec![0u8; 256],
        "dirty: not yet in host memory"
    );
    // Another session's flush writes back nothing of this one's.
    let (mut other, _) = session(&w).await;
    assert_eq!(other.flush(&[], &[]).await.unwrap(), 0);
    // By view: that byte set alone.
    assert_eq!(client.flush(&[], &[view(&bufs[1])]).await.unwrap(), 256);
    assert_eq!(bufs[1].read(0, 256), vec![9u8; 256]);
    assert_eq!(bufs[2].read(0, 256), vec![0u8; 256]);
    // By buffer, then nothing is left dirty.
    assert_eq!(client.flush(&ids[2..], &[]).await.unwrap(), 256);
    assert_eq!(bufs[2].read(0, 256), vec![9u8; 256]);
    assert_eq!(client.flush(&[], &[]).await.unwrap(), 0);
    assert_eq!(client.stats().await.unwrap().cache.dirty, 0);
    // Hostile requests are refused, naming what is wrong.
    let e = client
        .flush_request(strata_proto::pb::FlushRequest {
            identities: Vec::new(),
            views: vec![1, 2, 3],
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("views:"), "{e}");
    let e = client
        .flush(&vec![ids[0]; strata_proto::MAX_FLUSH_IDENTITIES + 1], &[])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most"), "{e}");
    let e = client
        .flush_request(strata_proto::pb::FlushRequest {
            identities: vec![vec![0u8; 5]],
            views: Vec::new(),
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("identities[0]"), "{e}");
    // The worker goes on serving.
    assert_eq!(client.flush(&[], &[]).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn cached_copies_are_found_by_version_and_session() {
    use strata_proto::convert::CacheArg;
    let w = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &["--device", "sim:mode=staged"]);
    let (mut client, hs) = session(&w).await;
    let copy = hs.callable("copy", 1).unwrap();
    let mut fds = client.fd_channel().await.unwrap();
    let mut stream = client.open_tasks().await.unwrap();
    let mint = mint();
    let mut bufs: Vec<SharedBuffer> = (0..3)
        .map(|_| SharedBuffer::new(&mint, 256, Access::ReadWrite))
        .collect();
    bufs[0].write(0, &[7u8; 256]);
    let ids: Vec<_> = bufs.iter().map(|b| *b.descriptor().identity()).collect();
    let raw: Vec<_> = bufs.iter().map(SharedBuffer::fd).collect();
    assert!(
        fds.import(&ids, &raw)
            .await
            .unwrap()
            .iter()
            .all(Result::is_ok)
    );
    let view = |b: &SharedBuffer| Tensor::new(b.descriptor(), 0, &[64], &[1], DType::F32).unwrap();
    let cached = |version| CacheArg {
        index: 0,
        version,
        written: 0,
        deferred: false,
        held: false,
    };
    let copy_to = |id, dst: &SharedBuffer, version| {
        let mut t = task(
            id,
            copy,
            vec![view(&bufs[0]), view(dst)],
            vec![ArgTag::Input, ArgTag::Output],
            vec![],
        );
        t.cache = vec![cached(version)];
        t
    };
    for (id, dst, version) in [(1, 1, 5), (2, 2, 5), (3, 1, 6)] {
        let done = run_all(&mut stream, &[copy_to(id, &bufs[dst], version)]).await;
        assert_eq!(done[&id].outcome, TaskOutcome::Success);
    }
    let c = client.stats().await.unwrap().cache;
    assert_eq!((c.hits, c.misses, c.entries), (1, 2, 1), "{c:?}");
    assert_eq!(c.hit_bytes, 256);
    assert_eq!(bufs[2].read(0, 256), vec![7u8; 256]);
    // Another session, same identities and version: its own copies only.
    let (mut other, _) = session(&w).await;
    let mut other_fds = other.fd_channel().await.unwrap();
    let mut other_stream = other.open_tasks().await.unwrap();
    assert!(
        other_fds
            .import(&ids, &raw)
            .await
            .unwrap()
            .iter()
            .all(Result::is_ok)
    );
    let done = run_all(&mut other_stream, &[copy_to(4, &bufs[2], 6)]).await;
    assert_eq!(done[&4].outcome, TaskOutcome::Success);
    let c = other.stats().await.unwrap().cache;
    assert_eq!((c.hits, c.misses, c.entries), (1, 3, 2), "{c:?}");
    // Releasing an import drops that session's copies of it.
    assert_eq!(client.release_imports(&ids).await.unwrap(), 3);
    let c = other.stats().await.unwrap().cache;
    assert_eq!(c.entries, 1, "{c:?}");
}
