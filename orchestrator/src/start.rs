//! [`ClusterBuilder`]: a cluster's settings, and how [`Cluster`] starts —
//! workers spawned, started in this process or connected to, one
//! [`WorkerLink`](crate::link::WorkerLink) each, and the actors wired
//! together on the cluster's runtime.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_chip_runtime::Registry;
use strata_client::{ClientTls, Endpoint};
use strata_orchestrator_core::{Event, WorkerId};
use strata_wire::IdentityMint;
use strata_worker_node::InProcessWorker;
use tokio::sync::mpsc;

use crate::actors::dag::{DagActor, EndpointRef};
use crate::actors::endpoint::{EndpointActor, Life, Respawn, Setup, Spawned};
use crate::actors::{Notice, buffers};
use crate::chips::Plan;
use crate::cluster::{Cluster, Offered};
use crate::error::{ClusterError, Error};
use crate::link::grpc::GrpcDialer;
use crate::link::inproc::InProcessDialer;
use crate::link::ring::RingPoller;
use crate::link::{Dialer, WorkerInfo};
use crate::local::{LocalWorkers, default_worker_binary};
use crate::policy::Quarantine;

/// How a remote worker is reached.
#[derive(Debug, Clone)]
struct Remote {
    endpoint: Endpoint,
    token: Option<String>,
    tls: Option<ClientTls>,
}

/// Settings of a [`Cluster`]; [`ClusterBuilder::start`] starts it.
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    local: usize,
    device: String,
    binary: Option<PathBuf>,
    /// Arguments before `worker …` on a spawned worker's command line.
    binary_args: Vec<std::ffi::OsString>,
    remotes: Vec<Remote>,
    window: usize,
    health_interval: Duration,
    health_deadline: Duration,
    ready_timeout: Duration,
    trace: bool,
    retries: u32,
    respawns: u32,
    max_unfinished: usize,
    quarantine: Quarantine,
    device_cache: bool,
    write_back: crate::policy::WriteBack,
    scheduler: crate::SchedulerPolicy,
    perf_models: Option<PathBuf>,
    in_process: usize,
    /// In-process workers the caller started, on devices of its own.
    started: Vec<InProcessWorker>,
    kernels: Kernels,
    ring: bool,
    data_connection: bool,
    /// Threads of the driver's runtime; `None`: chosen at the start.
    driver_threads: Option<usize>,
    /// What the pool of runtime-managed buffers keeps idle.
    pool: crate::buffer::PoolLimits,
}

/// The kernels of in-process workers.
#[derive(Clone, Default)]
struct Kernels(Option<Registry>);

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(r) => write!(f, "Kernels({} kernels)", r.len()),
            None => f.write_str("Kernels(builtins)"),
        }
    }
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            local: 0,
            device: "sim".into(),
            binary: None,
            binary_args: Vec::new(),
            remotes: Vec::new(),
            window: 64,
            health_interval: Duration::from_millis(100),
            health_deadline: Duration::from_millis(1000),
            ready_timeout: Duration::from_secs(30),
            trace: false,
            retries: 0,
            respawns: 0,
            max_unfinished: 65_536,
            quarantine: Quarantine::default(),
            device_cache: true,
            write_back: crate::policy::WriteBack::default(),
            scheduler: crate::SchedulerPolicy::default(),
            perf_models: None,
            in_process: 0,
            started: Vec::new(),
            kernels: Kernels::default(),
            ring: true,
            data_connection: true,
            driver_threads: None,
            pool: crate::buffer::PoolLimits::default(),
        }
    }
}

impl ClusterBuilder {
    /// How much the pool of runtime-managed buffers ([`Cluster::alloc`],
    /// [`crate::ScopeGuard::alloc`]) keeps for reuse: at most
    /// `idle_buffers` memfds of `idle_bytes` in all (default 256 and
    /// 4 GiB). An idle memfd holds no memory (its pages are freed when
    /// it comes back), only an open file and an address range; one
    /// coming back past either limit is closed.
    #[must_use]
    pub fn pool_limits(mut self, idle_buffers: usize, idle_bytes: u64) -> Self {
        self.pool = crate::buffer::PoolLimits {
            idle_buffers,
            idle_bytes,
        };
        self
    }

    /// Spawns `n` local workers (chips 0..n) on private Unix sockets.
    /// With the device `cuda:all`, one per GPU: `n` must then be 0 (the
    /// default) or the GPU count (see [`ClusterBuilder::device`]).
    #[must_use]
    pub fn local(mut self, n: usize) -> Self {
        self.local = n;
        self
    }

    /// Starts `n` workers inside this process (chips 0..n): the same
    /// worker node as a `strata worker` process, reached by calls instead
    /// of gRPC. Host buffers are still passed by fd and mapped by
    /// identity, so tasks touch the driver's bytes. The mode a notebook or
    /// a test reaches for first; it mixes with spawned and connected
    /// workers (in-process ones get the ids after the spawned ones).
    #[must_use]
    pub fn in_process(mut self, n: usize) -> Self {
        self.in_process = n;
        self
    }

    /// Adds a worker the caller started in this process, such as one on
    /// a [`Device`](strata_chip_runtime::Device) of its own
    /// ([`InProcessWorker::on_device`]); it comes after the workers of
    /// [`ClusterBuilder::in_process`], in the order added. Each cluster
    /// needs a worker of its own: sessions of two clusters on one node
    /// are kept apart as two drivers' are.
    #[must_use]
    pub fn in_process_worker(mut self, worker: InProcessWorker) -> Self {
        self.started.push(worker);
        self
    }

    /// Threads of the runtime the cluster's actors run on (the DAG actor,
    /// one endpoint per worker, the ring poller). By default one when
    /// every worker is local (spawned, in-process or on a Unix socket),
    /// two when one is reached over TCP.
    ///
    /// Why one: the actors' work is a sequence (each task's completion, its
    /// step through the engine, the next dispatch), and on one thread each
    /// hand-over between them is a task switch; on two, half of them wake
    /// the other thread through the kernel. Alternated on this two-core
    /// machine, one thread gave a 26 % shorter chain hop and 24 % more
    /// no-op tasks per second, with the stencil within 6 % either way. A
    /// second thread pays where the actors copy bytes: packing and landing
    /// the views of TCP workers, where one endpoint's copy would otherwise
    /// hold back every other worker's completions.
    #[must_use]
    pub fn driver_threads(mut self, n: usize) -> Self {
        self.driver_threads = Some(n.max(1));
        self
    }

    /// Whether tasks to workers on Unix sockets (spawned or connected)
    /// travel on a shared-memory ring when the worker offers one (default
    /// `true`); with `false`, on the gRPC task stream. Either way gRPC
    /// carries the handshake, imports, control calls and health, and
    /// [`WorkerInfo::transport`](crate::WorkerInfo::transport) says what
    /// each worker got.
    #[must_use]
    pub fn ring(mut self, on: bool) -> Self {
        self.ring = on;
        self
    }

    /// Whether large view bytes to and from TCP workers travel on the
    /// worker's data connection when it offers one (default `true`): a
    /// plain TCP connection beside gRPC, authenticated by a secret the
    /// session's handshake issued, that carries the bytes from the
    /// buffer's memfd to the socket without packing them. With `false`
    /// they are staged and fetched with gRPC calls;
    /// [`WorkerInfo::data_connection`](crate::WorkerInfo::data_connection)
    /// says what each worker got.
    #[must_use]
    pub fn data_connection(mut self, on: bool) -> Self {
        self.data_connection = on;
        self
    }

    /// The kernels of in-process workers (default: the built-in ones).
    #[must_use]
    pub fn kernels(mut self, kernels: Registry) -> Self {
        self.kernels = Kernels(Some(kernels));
        self
    }

    /// The device spec of spawned and in-process workers (default `sim`), such as
    /// `sim:mem=1GiB,mode=unified,lanes=1`, `cuda:0` or `cuda:1,mem=8GiB`
    /// (the grammar: [`strata_chip_runtime::ChipSpec`]).
    ///
    /// `cuda:all` starts one worker per GPU the CUDA driver sees, worker
    /// `i` on `cuda:i` with the spec's other keys: as many local workers
    /// (when neither [`ClusterBuilder::local`] nor
    /// [`ClusterBuilder::in_process`] asks for a number and the cluster
    /// has no other worker, or `local` asks for exactly that many) or
    /// in-process ones (when `in_process` asks for exactly that many). Another number, or both kinds, fails the
    /// start naming the numbers. Any `cuda` spec fails the start at once,
    /// before a worker runs, when the CUDA driver or the GPU is not there
    /// ([`ClusterError::Device`], naming what is missing).
    #[must_use]
    pub fn device(mut self, spec: impl Into<String>) -> Self {
        self.device = spec.into();
        self
    }

    /// The `strata` binary to spawn workers with (default:
    /// [`default_worker_binary`]).
    #[must_use]
    pub fn worker_binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self.binary_args.clear();
        self
    }

    /// Spawns workers as `program ARGS… worker --chip N …` instead of
    /// `strata worker --chip N …`: for a program that serves a worker
    /// behind a prefix of its own, such as `python -m strata.worker` (the
    /// Python package's workers, which also run kernels written in
    /// Python). The program must take `worker` and `strata worker`'s
    /// options after `args`, and print its ready line as `strata worker`
    /// does.
    #[must_use]
    pub fn worker_command<I, A>(mut self, program: impl Into<PathBuf>, args: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<std::ffi::OsString>,
    {
        self.binary = Some(program.into());
        self.binary_args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Connects to a running worker: `unix:PATH` (same host, buffers passed
    /// by fd) or `tcp:HOST:PORT` (bytes staged), with a bearer token.
    ///
    /// # Errors
    /// A malformed address.
    pub fn connect(mut self, address: &str, token: Option<&str>) -> Result<Self, Error> {
        let endpoint = address.parse().map_err(|reason| ClusterError::Address {
            address: address.to_owned(),
            reason,
        })?;
        self.remotes.push(Remote {
            endpoint,
            token: token.map(str::to_owned),
            tls: None,
        });
        Ok(self)
    }

    /// Connects to a running TCP worker with TLS (client certificate) and
    /// optionally a token.
    ///
    /// # Errors
    /// A malformed address.
    pub fn connect_tls(
        mut self,
        address: &str,
        token: Option<&str>,
        tls: ClientTls,
    ) -> Result<Self, Error> {
        let endpoint = address.parse().map_err(|reason| ClusterError::Address {
            address: address.to_owned(),
            reason,
        })?;
        self.remotes.push(Remote {
            endpoint,
            token: token.map(str::to_owned),
            tls: Some(tls),
        });
        Ok(self)
    }

    /// The most members in flight on one worker (default 64).
    #[must_use]
    pub fn window(mut self, n: usize) -> Self {
        self.window = n.max(1);
        self
    }

    /// Health beats every `interval`; a worker silent for `deadline` is
    /// lost (defaults 100 ms and 1 s).
    #[must_use]
    pub fn health(mut self, interval: Duration, deadline: Duration) -> Self {
        self.health_interval = interval;
        self.health_deadline = deadline;
        self
    }

    /// Records where and when every task ran, and its dependency edges,
    /// for [`Cluster::take_trace`].
    #[must_use]
    pub fn trace(mut self, on: bool) -> Self {
        self.trace = on;
        self
    }

    /// The retry policy (off by default): a task whose worker is lost
    /// while it runs is run again on another worker, up to `retries`
    /// times, when a rerun is safe — it is a plain task placed by the
    /// scheduler, every argument it writes is OUTPUT or OUTPUT_EXISTING
    /// (never INOUT, whose inputs may be half overwritten; no NO_DEP, no
    /// device buffers), and the lost worker can no longer touch memory
    /// (the cluster killed it and saw it gone, or it is a TCP worker that
    /// only held copies). Everything else fails with ENDPOINT_FAILURE.
    #[must_use]
    pub fn retry(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// Whether staged chips keep the copies they make of host bytes
    /// between tasks (default on): a task finds the bytes it reads on its
    /// chip when an earlier task there read or wrote them and nothing has
    /// changed them since, instead of copying them in again. When written
    /// bytes go back to host memory is [`ClusterBuilder::write_back`]'s
    /// choice. Off: every task copies its views in and out, as a chip
    /// without a cache does.
    #[must_use]
    pub fn device_cache(mut self, on: bool) -> Self {
        self.device_cache = on;
        self
    }

    /// When bytes a task writes on a local staged chip go back to host
    /// memory (with the device cache on): when the task ends
    /// ([`crate::policy::WriteBack::Through`], the default), or when something
    /// needs them ([`crate::policy::WriteBack::Deferred`]): a task elsewhere that
    /// touches them, a wait, an eviction. Either way a wait that returns
    /// has them in host memory; deferred, a worker lost first loses them
    /// (see [`crate::policy::WriteBack`]).
    #[must_use]
    pub fn write_back(mut self, when: crate::policy::WriteBack) -> Self {
        self.write_back = when;
        self
    }

    /// Where tasks without a named worker go (default
    /// [`SchedulerPolicy::Dmdas`](crate::SchedulerPolicy::Dmdas)): to the
    /// worker where each is expected to finish first, by performance
    /// models learned from the run's own completions (`Dmda`), with the
    /// graph's critical path first in each worker's queue (`Dmdas`); or to
    /// the least-loaded worker in ready order (`LeastLoaded`). Groups,
    /// tasks pinned with [`crate::Task::on`], windows and fault handling
    /// are the same under each.
    #[must_use]
    pub fn scheduler(mut self, policy: crate::SchedulerPolicy) -> Self {
        self.scheduler = policy;
        self
    }

    /// Keeps the performance models in `path` across runs: loaded at the
    /// start (a missing file is an empty history), written back at
    /// [`crate::Cluster::shutdown`]. A JSON file of kernel durations per
    /// callable and argument shapes; delete it to start over. Without
    /// it, each cluster learns from scratch.
    #[must_use]
    pub fn perf_models(mut self, path: impl Into<PathBuf>) -> Self {
        self.perf_models = Some(path.into());
        self
    }

    /// What happens to work that needs bytes a task lost without a fence
    /// may still write (default [`Quarantine::Wait`] 30 s; see
    /// [`Quarantine`]).
    #[must_use]
    pub fn quarantine(mut self, policy: Quarantine) -> Self {
        self.quarantine = policy;
        self
    }

    /// Restarts a worker this cluster spawned when it is lost (crashed,
    /// killed, hung), up to `n` times per worker (default 0: a lost
    /// spawned worker stays gone). The new process starts on the same
    /// socket, with nothing of the old one's, and rejoins; tasks are
    /// placed there again. Its tasks at the time of the loss fail (or
    /// rerun elsewhere under [`ClusterBuilder::retry`]).
    #[must_use]
    pub fn respawn(mut self, n: u32) -> Self {
        self.respawns = n;
        self
    }

    /// The most tasks submitted and not yet finished (default 65,536):
    /// past it, `submit` waits until a sixteenth of them (at least one)
    /// have finished, so a driver that submits faster than the workers
    /// run keeps bounded memory and is woken once per batch.
    #[must_use]
    pub fn max_unfinished(mut self, n: usize) -> Self {
        self.max_unfinished = n.max(1);
        self
    }

    /// Starts the workers, connects to every one, and starts the actors.
    ///
    /// # Errors
    /// [`Error::Cluster`] naming the worker that could not be started or
    /// reached (spawned workers are stopped again).
    pub fn start(self) -> Result<Cluster, Error> {
        start(self)
    }
}

impl Cluster {
    /// Settings for a new cluster.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }
}

/// One worker to reach at the start.
struct Target {
    dialer: Arc<dyn Dialer>,
    /// The node, for an in-process worker.
    node: Option<InProcessWorker>,
    spawned: Option<Spawned>,
    /// Its index among the spawned workers.
    local: Option<usize>,
}

/// Starts the cluster `b` describes.
fn start(b: ClusterBuilder) -> Result<Cluster, Error> {
    // A models file that cannot be used fails the start before any worker
    // is spawned.
    let models = match &b.perf_models {
        Some(path) => crate::perf_models::load(path)?,
        None => Vec::new(),
    };
    let origin = std::time::Instant::now();
    // A spec no worker accepts, or a chip that is not here, fails here, at
    // once and naming what is wrong, not as workers that exit before they
    // are ready.
    let plan = crate::chips::plan(
        &b.device,
        b.local,
        b.in_process,
        b.started.len() + b.remotes.len(),
        strata_chip_runtime::cuda::device_count,
    )?;
    if plan.local.is_empty()
        && plan.in_process.is_empty()
        && b.started.is_empty()
        && b.remotes.is_empty()
    {
        return Err(ClusterError::NoWorkers.into());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(b.driver_threads.unwrap_or_else(|| {
            if b.remotes
                .iter()
                .any(|r| matches!(r.endpoint, Endpoint::Tcp(_)))
            {
                2
            } else {
                1
            }
        }))
        .thread_name("strata-orchestrator")
        .enable_all()
        .build()
        .map_err(ClusterError::Runtime)?;
    let poller = Arc::new(RingPoller::default());
    runtime.spawn(Arc::clone(&poller).run());
    let health_ms = u32::try_from(b.health_interval.as_millis().max(1)).unwrap_or(u32::MAX);
    let grpc = |endpoint: Endpoint, token: Option<String>, tls: Option<ClientTls>| GrpcDialer {
        endpoint,
        token,
        tls,
        health_ms,
        health_deadline: b.health_deadline,
        ring: b.ring,
        data_connection: b.data_connection,
        poller: Some(Arc::clone(&poller)),
    };
    let (targets, local) = targets(&b, &plan, &grpc)?;

    // Open every link.
    let opened = runtime.block_on(async {
        let mut out = Vec::new();
        for (i, t) in targets.iter().enumerate() {
            let (tx, rx) = mpsc::unbounded_channel();
            let link = t.dialer.dial(None, tx).await.map_err(|error| {
                let log = match (&local, t.local) {
                    (Some(lw), Some(l)) => {
                        let lw = lw.lock().unwrap_or_else(|e| e.into_inner());
                        Some(lw.log_tail(l))
                    }
                    _ => None,
                };
                ClusterError::Unreachable {
                    index: i,
                    address: t.dialer.address(),
                    error,
                    log,
                }
            })?;
            out.push((link, rx));
        }
        Ok::<_, Error>(out)
    })?;

    // Endpoint actors spawn their helpers when built.
    let guard = runtime.enter();
    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let (released_tx, released_rx) = mpsc::unbounded_channel();
    let mut workers = Vec::new();
    // Looked up by name on every submit: a hash of the name, not a walk
    // of string comparisons (the test worker offers about a hundred).
    let mut callables: rustc_hash::FxHashMap<String, Vec<Offered>> = Default::default();
    let mut ep_txs = Vec::new();
    let mut ep_refs = Vec::new();
    let mut offers = Vec::new();
    let mut capabilities = Vec::new();
    let mut paths = crate::paths::PathTable::default();
    let mut owners = Vec::new();
    let mut lives = Vec::new();
    let mut in_process = Vec::new();
    for (i, (t, (link, events))) in targets.into_iter().zip(opened).enumerate() {
        let id = WorkerId(u32::try_from(i).map_err(|_| ClusterError::TooManyWorkers)?);
        let name = t.dialer.address();
        in_process.push(t.node.clone());
        let path = paths
            .intern(&name)
            .ok_or(crate::error::ClusterError::TooManyWorkers)?;
        let info = WorkerInfo::of(
            id,
            &name,
            path.id,
            link.as_ref(),
            t.spawned.as_ref().map(|s| s.pid),
        );
        owners.push(path);
        capabilities.push(info.capabilities);
        offers.push(
            link.facts()
                .worker
                .callables
                .iter()
                .map(|c| c.handle)
                .collect(),
        );
        for c in &link.facts().worker.callables {
            let v = callables.entry(c.name().to_owned()).or_default();
            if !v.iter().any(|o| o.version == c.version()) {
                v.push(Offered {
                    version: c.version(),
                    handle: c.handle,
                    qualified: c.signature.qualified_name().into(),
                    signature: c.signature.clone(),
                });
                v.sort_by_key(|o| o.version);
            }
        }
        let (tx, rx) = mpsc::channel(256);
        ep_txs.push(tx.clone());
        // A chip that keeps copies says so (a unified one reads host
        // memory in place), of mapped buffers or of bytes that came with
        // tasks alike.
        let caches = info
            .capabilities
            .features
            .contains(strata_proto::convert::Features::DEVICE_CACHE);
        ep_refs.push(EndpointRef {
            tx,
            name: name.clone(),
            rejoins: 0,
            caches,
            keeps_dirty: caches
                && info.fd_passing
                && b.device_cache
                && b.write_back == crate::policy::WriteBack::Deferred,
            kind: device_kind(&info.device),
        });
        let _ = up_tx.send(Notice::Event(Event::WorkerUp {
            worker: id,
            callables: link
                .facts()
                .worker
                .callables
                .iter()
                .map(|c| c.handle)
                .collect(),
            capabilities: info.capabilities,
            window: b.window,
        }));
        // A worker spawned here is killed when lost, and restarted on its
        // socket while the respawn budget lasts (and after a task's
        // timeout, whatever the budget: that is no crash); one the
        // cluster connected to (or started in this process) is dialed
        // again and may rejoin.
        let respawn = match (&local, t.local) {
            (Some(lw), Some(chip)) => Some(Respawn {
                local: Arc::clone(lw),
                chip,
                left: b.respawns,
                dial: grpc(Endpoint::Tcp(([127, 0, 0, 1], 0).into()), None, None),
            }),
            _ => None,
        };
        let life = Arc::new(Life::new(t.spawned.as_ref().map(|s| s.pid)));
        lives.push(Arc::clone(&life));
        let actor = EndpointActor::new(Setup {
            id,
            name,
            link,
            events,
            rejoin: Some(t.dialer),
            respawn,
            spawned: t.spawned,
            life,
            window: b.window,
            up: up_tx.clone(),
        });
        tokio::spawn(actor.run(rx));
        tracing::info!(
            worker = %info.id,
            endpoint = %info.endpoint,
            chip = info.chip,
            device = %info.device,
            callables = info.callables.len(),
            fd_passing = info.fd_passing,
            "worker up"
        );
        workers.push(info);
    }
    drop(up_tx);
    let (cmd_tx, cmd_rx) = mpsc::channel(1024);
    let gate = Arc::new(strata_orchestrator_core::Gate::new(b.max_unfinished));
    tokio::spawn(
        DagActor::new(
            ep_refs,
            b.trace,
            origin,
            Arc::clone(&gate),
            b.quarantine,
            b.device_cache,
            crate::actors::dag::Models {
                policy: b.scheduler,
                path: b.perf_models.clone(),
                loaded: models,
            },
        )
        .run(cmd_rx, up_rx),
    );
    tokio::spawn(buffers::run(released_rx, ep_txs.clone()));
    drop(guard);
    let owner: [u8; 8] = rand::random();
    Ok(Cluster {
        lives,
        offers,
        capabilities,
        owners,
        retries: b.retries,
        gate,
        next_id: Mutex::new(1),
        run: std::sync::atomic::AtomicU64::new(0),
        run_used: (0..workers.len())
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect(),
        runtime: Some(runtime),
        cmds: cmd_tx,
        endpoints: ep_txs,
        workers,
        callables,
        mint: IdentityMint::new(owner),
        released: released_tx,
        pool: Arc::new(crate::buffer::Pool::new(b.pool)),
        scopes: Mutex::new(Default::default()),
        last_scope: std::sync::atomic::AtomicU64::new(0),
        local,
        in_process,
        pending_all: Mutex::new(None),
    })
}

type LocalHandle = Option<Arc<Mutex<LocalWorkers>>>;

/// Every worker to reach: spawned ones first (started here), then
/// in-process ones (started here), then those to connect to.
fn targets(
    b: &ClusterBuilder,
    plan: &Plan,
    grpc: &dyn Fn(Endpoint, Option<String>, Option<ClientTls>) -> GrpcDialer,
) -> Result<(Vec<Target>, LocalHandle), Error> {
    let mut targets = Vec::new();
    let local = if !plan.local.is_empty() {
        let binary = b
            .binary
            .clone()
            .or_else(default_worker_binary)
            .ok_or(ClusterError::NoBinary)?;
        let (lw, eps) = LocalWorkers::spawn(&binary, &b.binary_args, &plan.local, b.ready_timeout)?;
        for (i, ((ep, pid), log)) in eps.into_iter().zip(lw.pids()).zip(lw.logs()).enumerate() {
            targets.push(Target {
                dialer: Arc::new(grpc(ep, None, None)),
                node: None,
                spawned: Some(Spawned { pid, log }),
                local: Some(i),
            });
        }
        Some(Arc::new(Mutex::new(lw)))
    } else {
        None
    };
    let mut in_process = Vec::new();
    for (i, device) in plan.in_process.iter().enumerate() {
        let kernels = b.kernels.0.clone().unwrap_or_else(Registry::with_builtins);
        let chip = u32::try_from(i).map_err(|_| ClusterError::TooManyWorkers)?;
        let worker = InProcessWorker::start(chip, device, kernels)
            .map_err(|source| ClusterError::InProcess { index: i, source })?;
        in_process.push(worker);
    }
    in_process.extend(b.started.iter().cloned());
    for (i, worker) in in_process.into_iter().enumerate() {
        targets.push(Target {
            dialer: Arc::new(InProcessDialer {
                worker: worker.clone(),
                index: i,
            }),
            node: Some(worker),
            spawned: None,
            local: None,
        });
    }
    for r in &b.remotes {
        targets.push(Target {
            dialer: Arc::new(grpc(r.endpoint.clone(), r.token.clone(), r.tls.clone())),
            node: None,
            spawned: None,
            local: None,
        });
    }
    Ok((targets, local))
}

/// A worker's device kind for the performance models: a hash of its
/// canonical device spec (the same on every run, so saved models stay
/// valid).
fn device_kind(device: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    device.hash(&mut h);
    h.finish()
}
