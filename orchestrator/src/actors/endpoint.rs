//! One endpoint actor per worker: owns the gRPC task stream, the fd side
//! channel (local workers), the set of buffers the worker imported, the
//! members in flight there, and the health deadline.
//!
//! Local workers (Unix socket) get each host buffer's memfd once, on first
//! use, and map it; remote workers (TCP) get the bytes of every view a
//! task reads with the task, and send back the bytes of every view it
//! writes, which land in the host buffer before the member counts as
//! finished.
//!
//! A worker is lost when its task stream breaks or ends unasked, its fd
//! channel fails, or no health beat arrives within the deadline. The
//! endpoint then reports it down once (the engine fails what ran there
//! with ENDPOINT_FAILURE) and kills it if the cluster spawned it (so a hung
//! process cannot write into buffers later).
//!
//! A worker the cluster connected to (not spawned) may come back: a
//! restarted process on the same address, or the same process once a cut
//! connection heals. The endpoint keeps dialing it (50 ms, doubling to
//! 1 s, each attempt bounded by [`DIAL_LIMIT`]); when the handshake
//! succeeds and the worker still offers every callable it offered at the
//! start, the endpoint starts afresh (nothing imported, nothing in flight)
//! and reports it up again. Its incarnation number, bumped at each loss,
//! tells device buffers allocated before the loss from those after.
//!
//! Fences (DESIGN §7). A loss is fenced when it happens if the worker
//! cannot touch task memory any more: a TCP worker (it only held staged
//! copies, and late completions are dropped) or a spawned one the endpoint
//! killed and saw gone. Otherwise the engine quarantines what was in
//! flight, and the endpoint looks for a fence in two ways, reporting
//! [`Notice::Fenced`] with the loss's number as soon as either succeeds:
//! 1. the worker process is seen dead: its pid (from `SO_PEERCRED` on the
//!    fd channel, or the one the cluster spawned) is gone, a zombie, or a
//!    different process (another start time) — checked every 20 ms;
//! 2. the same process comes back (same `instance` in the handshake): the
//!    redial names the lost session, which the worker ends at once (its
//!    queued tasks never start), and the endpoint polls `SessionState`
//!    until the worker reports it ended with nothing running. A different
//!    instance (a restarted process) proves nothing about the old one; 1
//!    still may.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use strata_core::WorkerId;
use strata_proto::TaskId as WireTaskId;
use strata_proto::convert::{TaskCompletion, TaskOutcome, TaskRequest};
use strata_wire::{ArgTag, BufferDescriptor, CanonicalIdentity, TaskArgs, Tensor};
use strata_worker::client::{Completions, TaskSender};
use strata_worker::fdchan::FdChannel;
use strata_worker::{ClientTls, Endpoint, HealthWatch, WorkerClient};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::fence::{Process, Unfenced};
use super::{DispatchItem, EpCmd, Notice, Report};
use crate::buffer::{Backing, HostShared};

/// A connected worker, ready to become an actor.
pub(crate) struct Connected {
    pub(crate) client: WorkerClient,
    pub(crate) sender: TaskSender,
    pub(crate) completions: Completions,
    pub(crate) fd: Option<FdChannel>,
    pub(crate) health: HealthWatch,
}

/// Longest a connection attempt may take, handshake and streams included.
pub(crate) const DIAL_LIMIT: Duration = Duration::from_secs(5);

/// Connects to a worker: handshake, fd channel (Unix sockets), task stream
/// and health stream with beats every `health_ms`.
pub(crate) async fn connect(
    endpoint: &Endpoint,
    token: Option<&str>,
    tls: Option<&ClientTls>,
    health_ms: u32,
) -> Result<Connected, String> {
    connect_after(endpoint, token, tls, health_ms, None).await
}

/// As [`connect`], naming `previous`, a session this cluster lost on the
/// worker: the worker ends it and reports on it in the handshake.
async fn connect_after(
    endpoint: &Endpoint,
    token: Option<&str>,
    tls: Option<&ClientTls>,
    health_ms: u32,
    previous: Option<strata_worker::SessionId>,
) -> Result<Connected, String> {
    let mut client = WorkerClient::connect_with(endpoint, token, tls)
        .await
        .map_err(|e| e.to_string())?;
    client
        .handshake_after(previous)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let fd = match endpoint {
        Endpoint::Unix(_) => Some(
            client
                .fd_channel()
                .await
                .map_err(|e| format!("fd channel: {e}"))?,
        ),
        Endpoint::Tcp(_) => None,
    };
    let (sender, completions) = client
        .open_tasks()
        .await
        .map_err(|e| format!("task stream: {e}"))?
        .split();
    let health = client
        .health(health_ms)
        .await
        .map_err(|e| format!("health stream: {e}"))?;
    Ok(Connected {
        client,
        sender,
        completions,
        fd,
        health,
    })
}

/// Whether a worker is up, and how many times it was lost; shared by its
/// endpoint (which writes) and the cluster's handles (which read).
#[derive(Debug, Default)]
pub(crate) struct Life {
    up: AtomicBool,
    incarnation: AtomicU64,
    /// The process id of a worker the cluster spawned (0: not spawned).
    pid: std::sync::atomic::AtomicU32,
}

impl Life {
    pub(crate) fn new(pid: Option<u32>) -> Self {
        Life {
            up: AtomicBool::new(true),
            incarnation: AtomicU64::new(0),
            pid: std::sync::atomic::AtomicU32::new(pid.unwrap_or(0)),
        }
    }

    /// The process id of a worker the cluster spawned, as it is now.
    pub(crate) fn pid(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::Acquire)).filter(|p| *p != 0)
    }

    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Bumped each time the worker is lost: what it held is gone.
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::Acquire)
    }

    fn set_pid(&self, pid: u32) {
        self.pid.store(pid, Ordering::Release);
    }

    fn lost(&self) {
        self.incarnation.fetch_add(1, Ordering::AcqRel);
        self.up.store(false, Ordering::Release);
    }

    fn back(&self) {
        self.up.store(true, Ordering::Release);
    }
}

/// How a spawned worker is restarted after a loss: by the cluster's
/// [`LocalWorkers`](crate::local::LocalWorkers), up to `left` more times.
#[derive(Clone)]
pub(crate) struct Respawn {
    pub(crate) local: Arc<std::sync::Mutex<crate::local::LocalWorkers>>,
    pub(crate) chip: usize,
    pub(crate) left: u32,
}

/// How to reach a worker after a loss, to rejoin it: the one the cluster
/// connected to at the same address, or one it spawned once restarted.
#[derive(Debug, Clone)]
pub(crate) struct Rejoin {
    pub(crate) endpoint: Endpoint,
    pub(crate) token: Option<String>,
    pub(crate) tls: Option<ClientTls>,
    pub(crate) health_ms: u32,
    /// The scheduler's in-flight window for it.
    pub(crate) window: usize,
}

enum Event {
    /// Loss `epoch` is fenced: proof came that its tasks ended.
    Fenced(u64),
    Completions(Vec<TaskCompletion>),
    StreamEnded(Option<String>),
    HealthLost(String),
    /// A fresh connection to the lost worker (and the new process, when
    /// the cluster restarted it).
    Redialed(Box<Connected>, Option<Spawned>),
}

struct InFlight {
    task: strata_core::TaskId,
    member: usize,
    /// Host views whose bytes travel (remote workers): argument index,
    /// view, buffer, whether the task writes it.
    staged: Vec<(u32, Tensor, Arc<HostShared>, bool)>,
    sent: u64,
}

/// A worker the cluster started: its pid and log file.
#[derive(Debug, Clone)]
pub(crate) struct Spawned {
    pub(crate) pid: u32,
    pub(crate) log: std::path::PathBuf,
}

pub(crate) struct EndpointActor {
    id: WorkerId,
    name: String,
    client: WorkerClient,
    /// The callables it offered at the start; a worker that comes back
    /// must still offer them all.
    offers: HashSet<strata_chip::KernelHandle>,
    events_tx: mpsc::UnboundedSender<Event>,
    health_deadline: Duration,
    life: Arc<Life>,
    rejoin: Option<Rejoin>,
    respawn: Option<Respawn>,
    /// The task dialing the lost worker.
    dialer: Option<JoinHandle<()>>,
    lost_at: Option<Instant>,
    /// Times it came back after a loss.
    rejoins: u64,
    sender: Option<TaskSender>,
    fd: Option<FdChannel>,
    remote: bool,
    /// The largest gRPC message both sides accept.
    max_message: usize,
    imported: HashSet<CanonicalIdentity>,
    in_flight: HashMap<u64, InFlight>,
    up: mpsc::UnboundedSender<Notice>,
    events: mpsc::UnboundedReceiver<Event>,
    tasks: Vec<JoinHandle<()>>,
    spawned: Option<Spawned>,
    dead: bool,
    /// Turns true when the worker is lost: control calls in flight give up.
    lost_tx: watch::Sender<bool>,
    lost_rx: watch::Receiver<bool>,
    /// Times it was lost.
    losses: u64,
    /// Losses waiting for their fence.
    unfenced: Vec<Unfenced>,
    /// The worker process behind the current connection, when visible.
    process: Option<Process>,
    /// Tasks looking for fences (process watches, session polls), with
    /// the loss each looks for.
    fencers: Vec<(u64, JoinHandle<()>)>,
}

impl EndpointActor {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: WorkerId,
        name: String,
        c: Connected,
        up: mpsc::UnboundedSender<Notice>,
        health_deadline: Duration,
        spawned: Option<Spawned>,
        life: Arc<Life>,
        rejoin: Option<Rejoin>,
        respawn: Option<Respawn>,
    ) -> Self {
        let (events_tx, events) = mpsc::unbounded_channel();
        let offers = c
            .client
            .handshake_info()
            .map(|h| h.callables.iter().map(|c| c.handle).collect())
            .unwrap_or_default();
        let (lost_tx, lost_rx) = watch::channel(false);
        let mut actor = EndpointActor {
            lost_tx,
            lost_rx,
            id,
            name,
            client: c.client.clone(),
            offers,
            events_tx,
            health_deadline,
            life,
            rejoin,
            respawn,
            dialer: None,
            lost_at: None,
            rejoins: 0,
            sender: None,
            fd: None,
            remote: false,
            max_message: strata_proto::DEFAULT_MAX_MESSAGE_BYTES,
            imported: HashSet::new(),
            in_flight: HashMap::new(),
            up,
            events,
            tasks: Vec::new(),
            spawned,
            dead: false,
            losses: 0,
            unfenced: Vec::new(),
            process: None,
            fencers: Vec::new(),
        };
        actor.attach(c);
        actor
    }

    /// Takes a connection: starts its completion reader and health watch.
    fn attach(&mut self, c: Connected) {
        let health_deadline = self.health_deadline;
        let reader = {
            let tx = self.events_tx.clone();
            let mut completions = c.completions;
            tokio::spawn(async move {
                loop {
                    match completions.next().await {
                        Ok(Some(batch)) => {
                            if tx.send(Event::Completions(batch)).is_err() {
                                return;
                            }
                        }
                        Ok(None) => {
                            let _ = tx.send(Event::StreamEnded(None));
                            return;
                        }
                        Err(e) => {
                            let _ = tx.send(Event::StreamEnded(Some(e.to_string())));
                            return;
                        }
                    }
                }
            })
        };
        let health = {
            let tx = self.events_tx.clone();
            let mut watch = c.health;
            tokio::spawn(async move {
                let cause = loop {
                    match tokio::time::timeout(health_deadline, watch.next()).await {
                        Ok(Ok(Some(_))) => {}
                        Ok(Ok(None)) => break "the worker ended its health stream".to_owned(),
                        Ok(Err(e)) => break format!("health stream broke: {e}"),
                        Err(_) => {
                            break format!(
                                "no health beat for {} ms (hung or unreachable)",
                                health_deadline.as_millis()
                            );
                        }
                    }
                };
                let _ = tx.send(Event::HealthLost(cause));
            })
        };
        self.remote = c.fd.is_none();
        self.process =
            c.fd.as_ref()
                .and_then(FdChannel::peer_pid)
                .or_else(|| self.spawned.as_ref().map(|s| s.pid))
                .and_then(Process::of);
        self.max_message = c
            .client
            .handshake_info()
            .map_or(strata_proto::DEFAULT_MAX_MESSAGE_BYTES, |h| {
                usize::try_from(h.max_message_bytes).unwrap_or(usize::MAX)
            })
            .min(strata_proto::DEFAULT_MAX_MESSAGE_BYTES);
        self.client = c.client;
        self.sender = Some(c.sender);
        self.fd = c.fd;
        self.imported.clear();
        self.in_flight.clear();
        self.tasks = vec![reader, health];
    }

    pub(crate) async fn run(mut self, mut cmds: mpsc::Receiver<EpCmd>) {
        let mut events_open = true;
        loop {
            tokio::select! {
                biased;
                ev = self.events.recv(), if events_open => match ev {
                    Some(Event::Fenced(epoch)) => self.fenced(epoch),
                    Some(Event::Completions(batch)) => self.complete(batch),
                    Some(Event::StreamEnded(None)) => {
                        self.lost("the worker closed the task stream".into());
                    }
                    Some(Event::StreamEnded(Some(e))) => {
                        self.lost(format!("task stream broke: {e}"));
                    }
                    Some(Event::HealthLost(cause)) => self.lost(cause),
                    Some(Event::Redialed(c, spawned)) => self.redialed(*c, spawned),
                    None => events_open = false,
                },
                cmd = cmds.recv() => match cmd {
                    None => break,
                    Some(EpCmd::Shutdown { reply }) => {
                        self.close();
                        if let Some(d) = self.dialer.take() {
                            d.abort();
                        }
                        for (_, f) in self.fencers.drain(..) {
                            f.abort();
                        }
                        let _ = reply.send(());
                        return;
                    }
                    Some(cmd) => self.command(cmd).await,
                },
            }
        }
        self.close();
        if let Some(d) = self.dialer.take() {
            d.abort();
        }
        for (_, f) in self.fencers.drain(..) {
            f.abort();
        }
    }

    /// Proof came that loss `epoch`'s tasks ended: tell the engine, once.
    fn fenced(&mut self, epoch: u64) {
        let Some(at) = self.unfenced.iter().position(|u| u.epoch == epoch) else {
            return;
        };
        self.unfenced.remove(at);
        // The other ways of looking for this fence have nothing left to do.
        self.fencers.retain(|(e, f)| {
            if *e == epoch {
                f.abort();
            }
            *e != epoch
        });
        info!("{} ({}): loss {epoch} fenced", self.id, self.name);
        let _ = self.up.send(Notice::Fenced {
            worker: self.id,
            epoch,
        });
    }

    /// Watches `process` until it ends, then reports loss `epoch` fenced.
    fn watch_process(&mut self, process: Process, epoch: u64) {
        let tx = self.events_tx.clone();
        self.fencers.push((
            epoch,
            tokio::spawn(async move {
                while !process.ended() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let _ = tx.send(Event::Fenced(epoch));
            }),
        ));
    }

    /// Polls the worker (the same process, back) until it reports the
    /// session of `u` ended with nothing running, then reports `u`'s loss
    /// fenced. Gives up when the worker is lost again or no longer knows
    /// the session (which proves nothing).
    fn poll_session(&mut self, u: Unfenced) {
        let tx = self.events_tx.clone();
        let mut client = self.client.clone();
        let mut lost = self.lost_rx.clone();
        self.fencers.push((
            u.epoch,
            tokio::spawn(async move {
                loop {
                    let state = tokio::select! {
                        s = client.session_state(u.session) => s,
                        _ = lost.wait_for(|l| *l) => return,
                    };
                    match state {
                        Ok(s) if s.is_fenced() => {
                            let _ = tx.send(Event::Fenced(u.epoch));
                            return;
                        }
                        Ok(s) if !s.known => return,
                        Ok(_) => {}
                        Err(e) => {
                            debug!("session state of {}: {e}", u.session);
                            return;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }),
        ));
    }

    /// Closes the task stream and the fd channel: the worker ends the
    /// session, releasing its imports and device buffers.
    fn close(&mut self) {
        self.sender = None;
        self.fd = None;
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }

    fn lost(&mut self, cause: String) {
        if self.dead {
            return;
        }
        self.dead = true;
        self.life.lost();
        self.lost_at = Some(Instant::now());
        let _ = self.lost_tx.send(true);
        self.close();
        self.in_flight.clear();
        self.imported.clear();
        let mut cause = cause;
        // A remote worker only ever held copies of task bytes, and their
        // completions are dropped from here on: it cannot touch memory.
        let mut fenced = self.remote;
        if let Some(s) = &self.spawned {
            // The cluster spawned it: make sure a hung process cannot wake
            // up and write into buffers later, and wait (briefly) until it
            // is gone, which is what makes a rerun elsewhere safe.
            if let Ok(pid) = i32::try_from(s.pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                fenced |= wait_gone(s.pid, Duration::from_secs(1));
            }
            // A crashed worker's last words are the likeliest explanation.
            let tail = crate::local::tail(&s.log);
            let last: Vec<&str> = tail.lines().filter(|l| !l.trim().is_empty()).collect();
            if !last.is_empty() {
                let last = &last[last.len().saturating_sub(3)..];
                cause = format!("{cause}; its log ends: {}", last.join(" | "));
            }
        }
        warn!("{} ({}) lost: {cause}", self.id, self.name);
        self.losses += 1;
        if !fenced {
            if let Some(h) = self.client.handshake_info() {
                self.unfenced.push(Unfenced {
                    epoch: self.losses,
                    session: h.session,
                    instance: h.instance,
                });
            }
            if let Some(p) = self.process {
                self.watch_process(p, self.losses);
            }
        }
        let _ = self.up.send(Notice::WorkerDown {
            worker: self.id,
            cause,
            fenced,
        });
        self.redial();
    }

    /// Starts dialing a lost worker the cluster connected to, or
    /// restarting one it spawned (while the respawn budget lasts).
    fn redial(&mut self) {
        let Some(r) = self.rejoin.clone() else {
            return;
        };
        let tx = self.events_tx.clone();
        let (id, name) = (self.id, self.name.clone());
        if self.spawned.is_some() {
            let Some(respawn) = self.respawn.as_mut().filter(|s| s.left > 0) else {
                return;
            };
            respawn.left -= 1;
            let respawn = respawn.clone();
            self.dialer = Some(tokio::spawn(async move {
                match restart(&respawn, &r).await {
                    Ok((c, spawned)) => {
                        let _ = tx.send(Event::Redialed(Box::new(c), Some(spawned)));
                    }
                    Err(e) => warn!("{id} ({name}) could not be restarted: {e}"),
                }
            }));
            return;
        }
        // The redial names the session just lost: a worker that is the
        // same process ends it at once (none of its queued tasks starts).
        let previous = self.unfenced.last().map(|u| u.session);
        self.dialer = Some(tokio::spawn(async move {
            let mut pause = Duration::from_millis(50);
            loop {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                let dial = connect_after(
                    &r.endpoint,
                    r.token.as_deref(),
                    r.tls.as_ref(),
                    r.health_ms,
                    previous,
                );
                match tokio::time::timeout(DIAL_LIMIT, dial).await {
                    Ok(Ok(c)) => {
                        let _ = tx.send(Event::Redialed(Box::new(c), None));
                        return;
                    }
                    Ok(Err(e)) => debug!("{id} ({name}): not back yet: {e}"),
                    Err(_) => {
                        debug!("{id} ({name}): not back yet: no answer within {DIAL_LIMIT:?}")
                    }
                }
            }
        }));
    }

    /// A lost worker answered again: it rejoins if it still offers what it
    /// offered at the start.
    fn redialed(&mut self, c: Connected, spawned: Option<Spawned>) {
        self.dialer = None;
        if !self.dead {
            return;
        }
        if let Some(s) = spawned {
            self.life.set_pid(s.pid);
            self.spawned = Some(s);
        }
        let offered: HashSet<_> = c
            .client
            .handshake_info()
            .map(|h| h.callables.iter().map(|c| c.handle).collect())
            .unwrap_or_default();
        let missing = self.offers.difference(&offered).count();
        if missing > 0 {
            warn!(
                "{} ({}) is back but lacks {missing} of the callables it offered at the start; not rejoining it (dialing again)",
                self.id, self.name
            );
            drop(c);
            return self.redial();
        }
        let callables = self
            .offers
            .iter()
            .map(|h| strata_core::CallableId(h.0))
            .collect();
        self.attach(c);
        self.rejoins += 1;
        self.dead = false;
        let _ = self.lost_tx.send(false);
        self.life.back();
        // The same process is back: ask it about every session lost
        // without a fence (the redial already ended the last one).
        let instance = self.client.handshake_info().map(|h| h.instance);
        let same: Vec<Unfenced> = self
            .unfenced
            .iter()
            .copied()
            .filter(|u| Some(u.instance) == instance)
            .collect();
        for u in same {
            self.poll_session(u);
        }
        let away = self.lost_at.take().map(|t| t.elapsed()).unwrap_or_default();
        info!(
            "{} ({}) rejoined after {:.1} ms away",
            self.id,
            self.name,
            away.as_secs_f64() * 1e3
        );
        let window = self.rejoin.as_ref().map_or(1, |r| r.window);
        let _ = self.up.send(Notice::WorkerUp {
            worker: self.id,
            callables,
            window,
        });
    }

    /// Runs one control call off the actor's loop (so health and
    /// completions keep being handled while it waits), answering `reply`
    /// with its result, or with the loss of the worker if that comes
    /// first.
    fn control<T, F>(&self, reply: oneshot::Sender<Result<T, String>>, call: F)
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, String>> + Send + 'static,
    {
        let mut lost = self.lost_rx.clone();
        let gone = format!("lost ({})", self.name);
        tokio::spawn(async move {
            let r = tokio::select! {
                r = call => r,
                _ = lost.wait_for(|l| *l) => Err(gone),
            };
            let _ = reply.send(r);
        });
    }

    /// Runs a call whose result nobody waits for, off the actor's loop.
    fn detached<F>(&self, what: String, call: F)
    where
        F: std::future::Future<Output = Result<(), String>> + Send + 'static,
    {
        let mut lost = self.lost_rx.clone();
        tokio::spawn(async move {
            tokio::select! {
                r = call => if let Err(e) = r { debug!("{what}: {e}") },
                _ = lost.wait_for(|l| *l) => {}
            }
        });
    }

    async fn command(&mut self, cmd: EpCmd) {
        if self.dead {
            let gone = format!("lost ({})", self.name);
            match cmd {
                EpCmd::DeviceAlloc { reply, .. } => drop(reply.send(Err(gone))),
                EpCmd::CopyToDevice { reply, .. } => drop(reply.send(Err(gone))),
                EpCmd::CopyFromDevice { reply, .. } => drop(reply.send(Err(gone))),
                EpCmd::EndRun { reply } => drop(reply.send(Err(gone))),
                EpCmd::Stats { reply } => drop(reply.send(Err(gone))),
                _ => {}
            }
            return;
        }
        let mut client = self.client.clone();
        match cmd {
            EpCmd::Dispatch { items, rejoins } => {
                if rejoins == self.rejoins {
                    self.dispatch(items).await;
                } else {
                    debug!(
                        "{}: dropping {} members placed before it was lost",
                        self.id,
                        items.len()
                    );
                }
            }
            EpCmd::Release(ids) => {
                for i in &ids {
                    self.imported.remove(i);
                }
                let what = format!("{}: release of {} imports", self.id, ids.len());
                self.detached(what, async move {
                    client
                        .release_imports(&ids)
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string())
                });
            }
            EpCmd::DeviceAlloc {
                identity,
                nbytes,
                region,
                reply,
            } => self.control(reply, async move {
                client
                    .device_alloc(&identity, nbytes, region)
                    .await
                    .map_err(|e| e.to_string())
            }),
            EpCmd::EndRun { reply } => self.control(reply, async move {
                client.end_run().await.map_err(|e| e.to_string())
            }),
            EpCmd::DeviceFree(identity) => {
                let what = format!("{}: device free of {identity}", self.id);
                self.detached(what, async move {
                    client
                        .device_free(&identity)
                        .await
                        .map_err(|e| e.to_string())
                });
            }
            EpCmd::CopyToDevice {
                identity,
                offset,
                data,
                reply,
            } => self.control(reply, async move {
                client
                    .copy_to_device(&identity, offset, data)
                    .await
                    .map_err(|e| e.to_string())
            }),
            EpCmd::CopyFromDevice {
                identity,
                offset,
                len,
                reply,
            } => self.control(reply, async move {
                client
                    .copy_from_device(&identity, offset, len)
                    .await
                    .map_err(|e| e.to_string())
            }),
            EpCmd::Stats { reply } => self.control(reply, async move {
                client.stats().await.map_err(|e| e.to_string())
            }),
            EpCmd::Shutdown { .. } => unreachable!("handled by run"),
        }
    }

    fn finish(&self, item: &DispatchItem, result: Result<(), String>) {
        let _ = self.up.send(Notice::Finished {
            task: item.task,
            member: item.member,
            result,
            report: Report::default(),
        });
    }

    async fn dispatch(&mut self, items: Vec<DispatchItem>) {
        let refused = match self.import_new(&items).await {
            Ok(r) => r,
            Err(cause) => return self.lost(cause),
        };
        // Batches stay under the message limit; one task over it fails
        // alone (its bytes could never travel) instead of breaking the
        // connection for everyone.
        let room = self.max_message.saturating_sub(64 * 1024);
        let mut batches: Vec<Vec<TaskRequest>> = vec![Vec::new()];
        let mut size = 0usize;
        for item in &items {
            let (req, f) = match self.request(item, &refused) {
                Ok(r) => r,
                Err(cause) => {
                    self.finish(item, Err(cause));
                    continue;
                }
            };
            let back: u64 = f
                .staged
                .iter()
                .filter(|(_, _, _, writes)| *writes)
                .map(|(_, view, _, _)| strata_chip::staging::packed_len(view))
                .sum();
            let bytes = wire_size(&req).max(usize::try_from(back).unwrap_or(usize::MAX));
            if bytes > room {
                self.finish(
                    item,
                    Err(format!(
                        "the task's arguments take {bytes} bytes on the wire, more than the {} a message to {} may hold: split the views, or use a worker on this host (buffers by fd)",
                        room, self.name
                    )),
                );
                continue;
            }
            if size + bytes > room {
                batches.push(Vec::new());
                size = 0;
            }
            size += bytes;
            self.in_flight.insert(item.task.0, f);
            batches.last_mut().expect("a batch").push(req);
        }
        for batch in batches.into_iter().filter(|b| !b.is_empty()) {
            let Some(sender) = &self.sender else { return };
            if let Err(e) = sender.send(&batch).await {
                return self.lost(format!("sending tasks: {e}"));
            }
        }
    }

    /// Passes the memfd of every host buffer these members use that the
    /// worker has not imported yet. Returns the buffers it refused, with
    /// why; an error when the channel itself failed.
    async fn import_new(
        &mut self,
        items: &[DispatchItem],
    ) -> Result<HashMap<CanonicalIdentity, String>, String> {
        let mut refused = HashMap::new();
        let Some(fd) = self.fd.as_mut() else {
            return Ok(refused);
        };
        let mut new: Vec<Arc<HostShared>> = Vec::new();
        let mut seen = HashSet::new();
        for item in items {
            for a in item.args.iter() {
                if let Backing::Host(h) = &a.backing {
                    let id = *h.descriptor().identity();
                    if !self.imported.contains(&id) && seen.insert(id) {
                        new.push(Arc::clone(h));
                    }
                }
            }
        }
        for chunk in new.chunks(strata_proto::MAX_FDS_PER_MESSAGE) {
            // Imported as the buffer's own descriptor, so that tasks may use
            // it through narrowed views whichever task comes first.
            let grants: Vec<BufferDescriptor> = chunk.iter().map(|h| *h.descriptor()).collect();
            let ids: Vec<CanonicalIdentity> = grants.iter().map(|d| *d.identity()).collect();
            let fds: Vec<_> = chunk.iter().map(|h| h.fd()).collect();
            let results = fd
                .import_as(&grants, &fds)
                .await
                .map_err(|e| format!("fd channel: {e}"))?;
            if results.len() != ids.len() {
                return Err(format!(
                    "fd channel: {} results for {} buffers",
                    results.len(),
                    ids.len()
                ));
            }
            let mut bytes = 0u64;
            for ((h, id), r) in chunk.iter().zip(&ids).zip(results) {
                match r {
                    Ok(()) => {
                        self.imported.insert(*id);
                        h.imported_by(self.id);
                        bytes += h.descriptor().nbytes();
                    }
                    Err(why) => {
                        warn!("{} refused buffer {id}: {why}", self.id);
                        refused.insert(*id, why);
                    }
                }
            }
            let _ = self.up.send(Notice::Imported { bytes });
        }
        Ok(refused)
    }

    fn request(
        &self,
        item: &DispatchItem,
        refused: &HashMap<CanonicalIdentity, String>,
    ) -> Result<(TaskRequest, InFlight), String> {
        let mut tensors = Vec::with_capacity(item.args.len());
        let mut tags = Vec::with_capacity(item.args.len());
        let mut inline = Vec::with_capacity(item.args.len());
        let mut staged = Vec::new();
        let mut sent = 0u64;
        for (i, a) in item.args.iter().enumerate() {
            tensors.push(a.tensor);
            tags.push(a.tag);
            match &a.backing {
                Backing::Host(h) if self.remote => {
                    let data = if a.tag == ArgTag::Output {
                        Vec::new()
                    } else {
                        h.pack(&a.tensor)
                            .map_err(|e| format!("argument {i}: staging: {e}"))?
                    };
                    sent += data.len() as u64;
                    inline.push(Some(data));
                    staged.push((i as u32, a.tensor, Arc::clone(h), a.tag.writes()));
                }
                Backing::Host(h) => {
                    if let Some(why) = refused.get(h.descriptor().identity()) {
                        return Err(format!(
                            "argument {i}: the worker refused buffer {}: {why}",
                            h.descriptor().identity()
                        ));
                    }
                    inline.push(None);
                }
                Backing::Device(_) => inline.push(None),
            }
        }
        let args = TaskArgs::new(tensors, item.scalars.to_vec()).map_err(|e| e.to_string())?;
        Ok((
            TaskRequest {
                id: WireTaskId(item.task.0),
                callable: item.callable,
                args,
                tags,
                inline,
            },
            InFlight {
                task: item.task,
                member: item.member,
                staged,
                sent,
            },
        ))
    }

    fn complete(&mut self, batch: Vec<TaskCompletion>) {
        if self.dead {
            return;
        }
        for c in batch {
            let Some(f) = self.in_flight.remove(&c.id.0) else {
                warn!("{}: completion for unknown task {}", self.id, c.id.0);
                continue;
            };
            let mut report = Report {
                sent: f.sent,
                returned: 0,
                staged: c.staged_in + c.staged_out,
                lane: c.lane,
                queued_ns: c.queued_ns,
                busy_ns: c.busy_ns,
                received: None,
            };
            let result = match c.outcome {
                TaskOutcome::Failure(cause) => Err(cause),
                TaskOutcome::Success => land(&f, &c.outputs, &mut report.returned),
            };
            report.received = Some(std::time::Instant::now());
            let _ = self.up.send(Notice::Finished {
                task: f.task,
                member: f.member,
                result,
                report,
            });
        }
    }
}

/// Restarts a spawned worker on its socket and connects to it.
async fn restart(respawn: &Respawn, r: &Rejoin) -> Result<(Connected, Spawned), String> {
    let (local, chip) = (Arc::clone(&respawn.local), respawn.chip);
    let (endpoint, spawned) = tokio::task::spawn_blocking(move || {
        let lock = || local.lock().unwrap_or_else(|e| e.into_inner());
        let (starting, timeout) = {
            let mut lw = lock();
            (lw.start(chip)?, lw.ready_timeout())
        };
        // No lock held while it starts: the cluster may be stopping.
        let line = starting.wait(timeout);
        let mut lw = lock();
        let endpoint = lw.endpoint_of(chip, line, timeout)?;
        let pid = lw
            .pid(chip)
            .ok_or_else(|| crate::error::Error::Cluster("no process".into()))?;
        let log = lw.log_path(chip).unwrap_or_default();
        Ok::<_, crate::error::Error>((endpoint, Spawned { pid, log }))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    let dial = connect(&endpoint, None, None, r.health_ms);
    let c = tokio::time::timeout(DIAL_LIMIT, dial)
        .await
        .map_err(|_| format!("no answer within {DIAL_LIMIT:?}"))??;
    Ok((c, spawned))
}

/// Writes the bytes a remote worker sent back into the host buffers; every
/// argument the task writes must have come back.
fn land(f: &InFlight, outputs: &[(u32, Vec<u8>)], returned: &mut u64) -> Result<(), String> {
    for (index, view, host, writes) in &f.staged {
        let out = outputs.iter().find(|(i, _)| i == index);
        match out {
            Some((_, bytes)) => {
                host.unpack(view, bytes)
                    .map_err(|e| format!("argument {index}: writing back: {e}"))?;
                *returned += bytes.len() as u64;
            }
            None if *writes => {
                return Err(format!(
                    "argument {index}: the worker sent no bytes for a view the task writes"
                ));
            }
            None => {}
        }
    }
    Ok(())
}

/// About how many bytes a task takes in a message.
fn wire_size(req: &TaskRequest) -> usize {
    let inline: usize = req.inline.iter().flatten().map(|d| d.len() + 16).sum();
    req.args.encoded_len() + req.tags.len() + inline + 64
}

/// Waits up to `limit` for process `pid` to be dead (a zombie or gone).
fn wait_gone(pid: u32, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if super::fence::is_dead(pid) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
