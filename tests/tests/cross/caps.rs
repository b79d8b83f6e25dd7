//! Capabilities through real processes: what `strata worker` states in its
//! handshake on each kind of listener, a task requiring a feature the
//! worker does not know (sent by hand, on the task stream and on the
//! ring), a driver refusing a worker that requires a feature it does not
//! know, and a cluster of workers with different dtypes placing tasks only
//! where they can run and refusing at submit what none can.

use std::pin::Pin;
use std::time::Duration;

use strata_orchestrator::{
    BackendKinds, Cluster, DTypeSet, Error, Features, SubmitError, Task, WorkerId,
};
use strata_proto::convert::{FailureKind, TaskOutcome, TaskRequest};
use strata_proto::pb;
use strata_tests::{SharedBuffer, WorkerProcess, strata_bin};
use strata_wire::{Access, ArgTag, BackendKind, DType, Tensor};
use tonic::{Request, Response, Status, Streaming};

use crate::ring::{SMALL, attach, run_on_ring};
use crate::worker::{assert_failed, mint, run_all, session};

/// The bit no build of strata knows (the highest).
const UNKNOWN: u64 = 1 << 63;

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_states_what_each_listener_takes() {
    let unix = WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--device", "sim:mem=64MiB,dtypes=F32|F64"],
    );
    let (_c, hs) = session(&unix).await;
    let caps = hs.worker.capabilities;
    assert_eq!(
        caps.backends,
        BackendKinds::of([
            BackendKind::Memfd,
            BackendKind::PosixShm,
            BackendKind::DeviceMalloc
        ])
    );
    assert_eq!(caps.dtypes, DTypeSet::of([DType::F32, DType::F64]));
    assert_eq!(
        caps.features,
        Features::RING | Features::DEVICE_CACHE | Features::HOST_BYTES
    );
    assert!(hs.ring());
    assert_eq!(hs.worker.required_features, Features::NONE);

    let no_ring = WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--no-ring", "--device", "sim:mem=64MiB,mode=unified"],
    );
    let (_c, hs) = session(&no_ring).await;
    assert_eq!(hs.worker.capabilities.features, Features::HOST_BYTES);
    assert_eq!(hs.worker.capabilities.dtypes, DTypeSet::ALL);

    // Over TCP nothing is imported: host buffers travel as bytes.
    let tcp = WorkerProcess::spawn_tcp(
        &strata_bin(),
        &["worker"],
        &["--insecure", "--device", "sim:mem=64MiB"],
    );
    let (_c, hs) = session(&tcp).await;
    let caps = hs.worker.capabilities;
    assert_eq!(caps.backends, BackendKinds::of([BackendKind::DeviceMalloc]));
    assert_eq!(
        caps.features,
        Features::DATA_PORT | Features::DEVICE_CACHE | Features::HOST_BYTES
    );
    assert!(hs.data.is_some());
}

/// A task built by hand that requires a bit the worker does not know is
/// refused unrun, typed, on the task stream and on the ring; the session
/// runs its next task, and the worker serves another session afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_requiring_an_unknown_feature_is_refused_and_the_worker_serves_on() {
    let w = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &["--device", "sim:mem=64MiB"]);
    let (mut client, hs) = session(&w).await;
    let fill = hs.callable("fill", 1).unwrap();
    let buf = SharedBuffer::new(&mint(), 64, Access::ReadWrite);
    let mut fds = client.fd_channel().await.unwrap();
    let acks = fds
        .import(&[*buf.descriptor().identity()], &[buf.fd()])
        .await
        .unwrap();
    assert_eq!(acks, vec![Ok(())]);
    let view = Tensor::new(buf.descriptor(), 0, &[16], &[1], DType::F32).unwrap();
    let args = strata_wire::TaskArgs::new(vec![view], vec![3f64.to_bits()]).unwrap();
    let by_hand = |id: u64, required_features: u64| pb::Task {
        task_id: id,
        callable: fill.0.to_vec(),
        args: args.encode(),
        tags: vec![ArgTag::Output.code()],
        inline_inputs: vec![],
        cache: vec![],
        required_features,
        priority: 0,
    };
    let tasks: Vec<TaskRequest> = [by_hand(1, UNKNOWN | Features::RING.bits()), by_hand(2, 0)]
        .into_iter()
        .map(|t| TaskRequest::try_from(t).unwrap())
        .collect();
    let mut stream = client.open_tasks().await.unwrap();
    let done = run_all(&mut stream, &tasks).await;
    assert_failed(
        &done[&1],
        FailureKind::Unsupported,
        "the task requires features this worker does not know: bit 63 (required_features 0x8000000000000001)",
    );
    assert_eq!(done[&2].outcome, TaskOutcome::Success);
    assert_eq!(crate::worker::f32s(&buf.read(0, 64)), vec![3.0; 16]);

    // The same on the ring, where a task is a pb::Task record.
    let mem = attach(&mut fds, SMALL).await;
    let ring_tasks: Vec<TaskRequest> = [by_hand(3, UNKNOWN), by_hand(4, 0)]
        .into_iter()
        .map(|t| TaskRequest::try_from(t).unwrap())
        .collect();
    let done = run_on_ring(&mem, ring_tasks, 2).await;
    assert_failed(&done[&3], FailureKind::Unsupported, "bit 63");
    assert_eq!(done[&4].outcome, TaskOutcome::Success);
    drop((stream, fds, client));

    // Another session on the same process runs.
    let (mut again, hs2) = session(&w).await;
    assert_eq!(hs2.worker.instance, hs.worker.instance, "the same process");
    let dev = strata_wire::IdentityMint::new(*b"capstest").mint().unwrap();
    let addr = again
        .device_alloc(&dev, 64, strata_chip_runtime::Region::Persistent)
        .await
        .unwrap();
    let view = crate::worker::device_view(dev, addr, 16);
    let t = crate::worker::task(5, fill, vec![view], vec![ArgTag::Output], vec![0]);
    let mut stream = again.open_tasks().await.unwrap();
    let done = run_all(&mut stream, &[t]).await;
    assert_eq!(done[&5].outcome, TaskOutcome::Success);
}

/// A worker (here a stand-in speaking the protocol) whose handshake
/// requires a feature this driver does not know: the client and the
/// cluster refuse it, naming the bits.
#[test]
fn a_driver_refuses_a_worker_that_requires_an_unknown_feature() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let at = listener.local_addr().unwrap();
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(pb::worker_server::WorkerServer::new(Demanding))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let endpoint = format!("tcp:{at}");
    let e = runtime.block_on(async {
        let mut c = strata_client::WorkerClient::connect(&endpoint.parse().unwrap(), None)
            .await
            .unwrap();
        c.handshake().await.unwrap_err()
    });
    assert!(
        e.to_string().contains(
            "required_features: the worker requires features this driver does not know: bit 40|bit 63"
        ),
        "{e}"
    );
    let e = Cluster::builder()
        .connect(&endpoint, None)
        .unwrap()
        .start()
        .unwrap_err();
    assert!(
        matches!(e, Error::Cluster(_)),
        "refused when the cluster starts: {e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!("worker 0 ({endpoint})"))
            && text
                .contains("the worker requires features this driver does not know: bit 40|bit 63"),
        "{text}"
    );
}

/// Two real workers, one without F64: F64 tasks all run on the other, a
/// task pinned to the first is refused at submit naming it, and a device
/// buffer's descriptor names its owner's path.
#[test]
fn tasks_go_only_where_their_dtypes_are_and_are_refused_where_none_is() {
    let no_f64 = WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--device", "sim:mem=64MiB,dtypes=F32"],
    );
    let all = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &["--device", "sim:mem=64MiB"]);
    let c = Cluster::builder()
        .connect(&no_f64.endpoint.to_string(), None)
        .unwrap()
        .connect(&all.endpoint.to_string(), None)
        .unwrap()
        .window(8)
        .start()
        .unwrap();
    assert_eq!(
        c.workers()[0].capabilities.dtypes,
        DTypeSet::of([DType::F32])
    );
    let views: Vec<_> = (0..32)
        .map(|_| c.buffer(64).unwrap().tensor(&[8], DType::F64).unwrap())
        .collect();
    for (i, v) in views.iter().enumerate() {
        c.submit(Task::new("fill").output(v).scalar_f64(i as f64))
            .unwrap();
    }
    c.wait_all().unwrap();
    for (i, v) in views.iter().enumerate() {
        assert_eq!(v.read::<f64>().unwrap(), vec![i as f64; 8]);
    }
    assert_eq!(c.worker_stats(WorkerId(0)).unwrap().tasks_succeeded, 0);
    assert_eq!(c.worker_stats(WorkerId(1)).unwrap().tasks_succeeded, 32);
    // F32 may go either way; pinned F64 to the worker without it cannot.
    let e = c
        .submit(
            Task::new("fill")
                .output(&views[0])
                .scalar_f64(1.0)
                .on(WorkerId(0)),
        )
        .unwrap_err();
    match &e {
        Error::Submit(SubmitError::Incapable { placed, lacks, .. }) => {
            assert_eq!(
                placed.as_deref(),
                Some(format!("worker 0 ({})", no_f64.endpoint).as_str())
            );
            assert_eq!(lacks.len(), 1, "{lacks:?}");
            assert_eq!(lacks[0].arg, Some(0));
        }
        other => panic!("expected Incapable, got {other:?}"),
    }
    assert!(
        e.to_string()
            .contains("argument 0 needs dtype F64, which worker 0"),
        "{e}"
    );
    let d = c.device_buffer(WorkerId(1), 64).unwrap();
    assert_eq!(d.descriptor().owner_worker_path_id(), 2);
    assert_eq!(c.workers()[1].path_id, 2);
    c.shutdown().unwrap();
}

/// A worker that comes back on the address of a lost one without a dtype
/// it had (a chip without F64) is not taken back: tasks were placed by
/// what it had. The same worker as before rejoins.
#[test]
fn a_worker_that_comes_back_with_fewer_capabilities_is_not_taken_back() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("unix:{}", dir.path().join("w.sock").display());
    let full = ["--device", "sim:mem=64MiB"];
    let mut w = WorkerProcess::spawn_listening(&strata_bin(), &["worker"], &listen, &full);
    let c = Cluster::builder()
        .connect(&listen, None)
        .unwrap()
        .start()
        .unwrap();
    let b = WorkerId(0);
    w.kill();
    crate::faults::within(Duration::from_secs(5), || !c.is_up(b)).expect("lost");
    let mut narrower = WorkerProcess::spawn_listening(
        &strata_bin(),
        &["worker"],
        &listen,
        &["--device", "sim:mem=64MiB,dtypes=F32"],
    );
    // Several dials find it and turn it away.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!c.is_up(b), "a worker without F64 rejoined");
    narrower.kill();
    let _w = WorkerProcess::spawn_listening(&strata_bin(), &["worker"], &listen, &full);
    c.wait_up(b, Duration::from_secs(10))
        .expect("the same kind of worker rejoins");
    let x = c.buffer(64).unwrap().tensor(&[8], DType::F64).unwrap();
    c.submit(Task::new("fill").output(&x).scalar_f64(4.0))
        .unwrap();
    c.wait_all().unwrap();
    assert_eq!(x.read::<f64>().unwrap(), vec![4.0; 8]);
}

/// A stand-in worker whose handshake requires features no driver knows;
/// it answers nothing else.
struct Demanding;

type Boxed<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

fn no<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("a stand-in"))
}

#[tonic::async_trait]
impl pb::worker_server::Worker for Demanding {
    async fn handshake(
        &self,
        _: Request<pb::HandshakeRequest>,
    ) -> Result<Response<pb::HandshakeReply>, Status> {
        let sig: strata_chip_runtime::kernel::Signature = "noop@1(;)".parse().unwrap();
        Ok(Response::new(pb::HandshakeReply {
            protocol_version: strata_proto::PROTOCOL_VERSION,
            session_id: 1,
            device_kind: "sim".into(),
            device_spec: "sim".into(),
            lanes: 1,
            callables: vec![pb::Callable::from(
                &strata_proto::convert::CallableOffer::of(sig),
            )],
            instance: 5,
            dtypes: vec![DType::F32.code()],
            features: Features::HOST_BYTES.bits(),
            required_features: Features::HOST_BYTES.bits() | 1 << 40 | UNKNOWN,
            ..pb::HandshakeReply::default()
        }))
    }
    type TasksStream = Boxed<pb::CompletionBatch>;
    async fn tasks(
        &self,
        _: Request<Streaming<pb::TaskBatch>>,
    ) -> Result<Response<Self::TasksStream>, Status> {
        no()
    }
    async fn device_alloc(
        &self,
        _: Request<pb::DeviceAllocRequest>,
    ) -> Result<Response<pb::DeviceAllocReply>, Status> {
        no()
    }
    async fn device_free(
        &self,
        _: Request<pb::DeviceFreeRequest>,
    ) -> Result<Response<pb::DeviceFreeReply>, Status> {
        no()
    }
    async fn end_run(
        &self,
        _: Request<pb::EndRunRequest>,
    ) -> Result<Response<pb::EndRunReply>, Status> {
        no()
    }
    async fn copy_to_device(
        &self,
        _: Request<pb::CopyToDeviceRequest>,
    ) -> Result<Response<pb::CopyToDeviceReply>, Status> {
        no()
    }
    async fn copy_from_device(
        &self,
        _: Request<pb::CopyFromDeviceRequest>,
    ) -> Result<Response<pb::CopyFromDeviceReply>, Status> {
        no()
    }
    async fn release_import(
        &self,
        _: Request<pb::ReleaseImportRequest>,
    ) -> Result<Response<pb::ReleaseImportReply>, Status> {
        no()
    }
    async fn flush(
        &self,
        _: Request<pb::FlushRequest>,
    ) -> Result<Response<pb::FlushReply>, Status> {
        no()
    }
    async fn stats(
        &self,
        _: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsReply>, Status> {
        no()
    }
    type HealthStream = Boxed<pb::HealthBeat>;
    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<Self::HealthStream>, Status> {
        no()
    }
    async fn ping(&self, _: Request<pb::PingRequest>) -> Result<Response<pb::PingReply>, Status> {
        no()
    }
    async fn session_state(
        &self,
        _: Request<pb::SessionStateRequest>,
    ) -> Result<Response<pb::SessionStateReply>, Status> {
        no()
    }
    async fn stage(
        &self,
        _: Request<Streaming<pb::StageChunk>>,
    ) -> Result<Response<pb::StageReply>, Status> {
        no()
    }
    type FetchStream = Boxed<pb::FetchChunk>;
    async fn fetch(
        &self,
        _: Request<pb::FetchRequest>,
    ) -> Result<Response<Self::FetchStream>, Status> {
        no()
    }
}
