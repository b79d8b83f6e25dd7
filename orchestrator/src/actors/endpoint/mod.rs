//! One endpoint actor per worker: owns the worker's [`WorkerLink`] (one
//! session, whatever carries it), the set of buffers the worker imported,
//! the members in flight there, and what it knows of the worker's losses.
//!
//! Links with shared memory get each host buffer's memfd once, on first
//! use, and map it; links that stage bytes get the bytes of every view a
//! task reads with the task, and send back the bytes of every view it
//! writes, which land in the host buffer before the member counts as
//! finished ([`dispatch`]).
//!
//! A worker is lost when its link closes or breaks unasked, an fd import
//! fails, or the link reports it unhealthy (no health beat within the
//! deadline; an in-process worker halted). The endpoint then reports it
//! down once (the engine fails what ran there with ENDPOINT_FAILURE),
//! kills it if the cluster spawned it (so a hung process cannot write into
//! buffers later), and dials it again to rejoin ([`loss`]). A member
//! past its timeout is reported timed out and the worker is lost with
//! that cause ([`timeout`]).

mod dispatch;
mod loss;
mod timeout;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use strata_chip_runtime::KernelHandle;
use strata_orchestrator_core::WorkerId;
use strata_wire::CanonicalIdentity;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::debug;

use self::dispatch::InFlight;
use self::loss::Fencer;
use super::fence::{Process, Unfenced};
use super::{EpCmd, Notice};
use crate::link::{Dialer, LinkError, LinkEvent, WorkerLink};

/// Whether a worker is up, and how many times it was lost; shared by its
/// endpoint (which writes) and the cluster's handles (which read).
#[derive(Debug, Default)]
pub(crate) struct Life {
    up: AtomicBool,
    incarnation: AtomicU64,
    /// The process id of a worker the cluster spawned (0: not spawned).
    pid: AtomicU32,
}

impl Life {
    pub(crate) fn new(pid: Option<u32>) -> Self {
        Life {
            up: AtomicBool::new(true),
            incarnation: AtomicU64::new(0),
            pid: AtomicU32::new(pid.unwrap_or(0)),
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
    /// Dials the restarted process (its address is filled in per restart).
    pub(crate) dial: crate::link::grpc::GrpcDialer,
}

/// A worker the cluster started: its pid and log file.
#[derive(Debug, Clone)]
pub(crate) struct Spawned {
    pub(crate) pid: u32,
    pub(crate) log: std::path::PathBuf,
}

/// What the endpoint's own helpers report to its loop.
enum Internal {
    /// Loss `epoch` is fenced: proof came that its tasks ended.
    Fenced(u64),
    /// A loss, examined off the runtime (the spawned process killed and
    /// waited for, its log read): report it.
    Examined { cause: String, fenced: bool },
    /// A fresh link to the lost worker, with its events (and the new
    /// process, when the cluster restarted it).
    Redialed(
        Arc<dyn WorkerLink>,
        mpsc::UnboundedReceiver<LinkEvent>,
        Option<Spawned>,
    ),
}

/// How the endpoint is set up.
pub(crate) struct Setup {
    pub(crate) id: WorkerId,
    pub(crate) name: String,
    pub(crate) link: Arc<dyn WorkerLink>,
    pub(crate) events: mpsc::UnboundedReceiver<LinkEvent>,
    /// Dials the worker again after a loss (`None`: it never rejoins).
    pub(crate) rejoin: Option<Arc<dyn Dialer>>,
    pub(crate) respawn: Option<Respawn>,
    pub(crate) spawned: Option<Spawned>,
    pub(crate) life: Arc<Life>,
    /// The scheduler's in-flight window for it.
    pub(crate) window: usize,
    pub(crate) up: mpsc::UnboundedSender<Notice>,
}

pub(crate) struct EndpointActor {
    id: WorkerId,
    name: String,
    link: Arc<dyn WorkerLink>,
    link_events: mpsc::UnboundedReceiver<LinkEvent>,
    /// The callables it offered at the start; a worker that comes back
    /// must still offer them all.
    offers: HashSet<KernelHandle>,
    /// What its tasks could use at the start, through this link (the
    /// cluster placed and checked tasks by it); a worker that comes back
    /// must still have all of it.
    capabilities: strata_proto::convert::Capabilities,
    internal_tx: mpsc::UnboundedSender<Internal>,
    internal: mpsc::UnboundedReceiver<Internal>,
    life: Arc<Life>,
    rejoin: Option<Arc<dyn Dialer>>,
    respawn: Option<Respawn>,
    window: usize,
    /// The task dialing the lost worker.
    dialer: Option<JoinHandle<()>>,
    lost_at: Option<Instant>,
    /// Times it came back after a loss.
    rejoins: u64,
    imported: HashSet<CanonicalIdentity>,
    /// The versions of byte sets the worker's chip holds copies of, as far
    /// as this endpoint saw (staged links whose worker caches): a task
    /// reading one at that version leaves its bytes out ([`dispatch`]).
    /// Emptied with the session, and when it passes
    /// [`strata_orchestrator_core::residency::MAX_REMEMBERED`].
    resident: HashMap<strata_wire::Footprint, u64>,
    in_flight: HashMap<u64, InFlight>,
    /// Strings for packed view bytes (staged links), reused across tasks.
    recycler: crate::buffer::Recycler,
    /// The last id a view's bytes were staged under ahead of their task.
    stages: u64,
    up: mpsc::UnboundedSender<Notice>,
    spawned: Option<Spawned>,
    dead: bool,
    /// Turns true when the worker is lost: control calls in flight give up.
    lost_tx: watch::Sender<bool>,
    lost_rx: watch::Receiver<bool>,
    /// Times it was lost.
    losses: u64,
    /// Losses waiting for their fence.
    unfenced: Vec<Unfenced>,
    /// The worker process behind the current link, when visible.
    process: Option<Process>,
    /// What looks for fences (process watches, session polls), with the
    /// loss each looks for.
    fencers: Vec<(u64, Fencer)>,
    /// Deadlines of members in flight that have a timeout.
    deadlines: timeout::Deadlines,
    /// The current loss was a timeout: a spawned worker is restarted
    /// outside the respawn budget (which counts crashes).
    timed_out: bool,
}

impl EndpointActor {
    pub(crate) fn new(s: Setup) -> Self {
        let (internal_tx, internal) = mpsc::unbounded_channel();
        let (lost_tx, lost_rx) = watch::channel(false);
        let offers = s.link.facts().worker.handles().collect();
        let capabilities = s.link.facts().capabilities();
        let process = s
            .link
            .facts()
            .pid
            .or_else(|| s.spawned.as_ref().map(|p| p.pid))
            .and_then(Process::of);
        EndpointActor {
            id: s.id,
            name: s.name,
            link: s.link,
            link_events: s.events,
            offers,
            capabilities,
            internal_tx,
            internal,
            life: s.life,
            rejoin: s.rejoin,
            respawn: s.respawn,
            window: s.window,
            dialer: None,
            lost_at: None,
            rejoins: 0,
            imported: HashSet::default(),
            resident: HashMap::default(),
            in_flight: HashMap::default(),
            recycler: crate::buffer::Recycler::default(),
            stages: 0,
            up: s.up,
            spawned: s.spawned,
            dead: false,
            lost_tx,
            lost_rx,
            losses: 0,
            unfenced: Vec::new(),
            process,
            fencers: Vec::new(),
            deadlines: timeout::Deadlines::default(),
            timed_out: false,
        }
    }

    /// Serves until the DAG actor asks for shutdown or goes away.
    ///
    /// # Cancel safety
    /// Meant to be spawned and run to its end; dropped part-way, the link
    /// closes (the worker ends the session) and nothing else is left.
    pub(crate) async fn run(mut self, mut cmds: mpsc::Receiver<EpCmd>) {
        loop {
            tokio::select! {
                biased;
                Some(ev) = self.internal.recv() => match ev {
                    Internal::Fenced(epoch) => self.fenced(epoch),
                    Internal::Examined { cause, fenced } => self.report_loss(cause, fenced),
                    Internal::Redialed(link, events, spawned) => {
                        self.redialed(link, events, spawned);
                    }
                },
                Some(ev) = self.link_events.recv(), if !self.dead => match ev {
                    LinkEvent::Completions(batch) => self.complete(batch).await,
                    LinkEvent::Closed(None) => {
                        self.lost("the worker closed the task stream".into());
                    }
                    LinkEvent::Closed(Some(e)) => self.lost(format!("task stream broke: {e}")),
                    LinkEvent::Unhealthy(cause) => self.lost(cause),
                },
                // After the completions: one that came in time is taken
                // before the deadline is looked at.
                () = self.deadlines.next(), if self.deadlines.armed() && !self.dead => {
                    self.expire();
                }
                cmd = cmds.recv() => match cmd {
                    None => break,
                    Some(EpCmd::Shutdown { reply }) => {
                        self.stop();
                        let _ = reply.send(());
                        return;
                    }
                    Some(cmd) => self.command(cmd).await,
                },
            }
        }
        self.stop();
    }

    /// Closes the link (the worker ends the session, releasing its imports
    /// and device buffers) and stops every helper.
    fn stop(&mut self) {
        self.link.close();
        if let Some(d) = self.dialer.take() {
            d.abort();
        }
        for (_, f) in self.fencers.drain(..) {
            f.cancel();
        }
    }

    /// Runs one control call off the actor's loop (so health and
    /// completions keep being handled while it waits), answering `reply`
    /// with its result, or with the loss of the worker if that comes
    /// first.
    fn control<T, F>(&self, reply: oneshot::Sender<Result<T, LinkError>>, call: F)
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn WorkerLink>) -> crate::link::BoxFuture<'static, Result<T, LinkError>>,
    {
        let mut lost = self.lost_rx.clone();
        let gone = LinkError::Lost(self.name.clone());
        let call = call(Arc::clone(&self.link));
        tokio::spawn(async move {
            let r = tokio::select! {
                r = call => r,
                _ = lost.wait_for(|l| *l) => Err(gone),
            };
            let _ = reply.send(r);
        });
    }

    /// Runs a call whose result nobody waits for, off the actor's loop.
    fn detached(&self, what: String, call: crate::link::BoxFuture<'static, Result<(), LinkError>>) {
        let mut lost = self.lost_rx.clone();
        tokio::spawn(async move {
            tokio::select! {
                r = call => if let Err(e) = r { debug!(what, error = %e, "detached call failed") },
                _ = lost.wait_for(|l| *l) => {}
            }
        });
    }

    async fn command(&mut self, cmd: EpCmd) {
        if self.dead {
            let gone = LinkError::Lost(self.name.clone());
            match cmd {
                EpCmd::DeviceAlloc { reply, .. } => drop(reply.send(Err(gone))),
                EpCmd::Export { reply, .. } => drop(reply.send(Err(gone))),
                EpCmd::ImportShared { reply, .. } => drop(reply.send(Err(gone))),
                EpCmd::CopyToDevice { reply, .. } => drop(reply.send(Err(gone))),
                EpCmd::CopyFromDevice { reply, .. } => drop(reply.send(Err(gone))),
                EpCmd::EndRun { reply } => drop(reply.send(Err(gone))),
                EpCmd::Stats { reply } => drop(reply.send(Err(gone))),
                EpCmd::Flush { token, .. } => {
                    let _ = self.up.send(super::Notice::Flushed { token, bytes: None });
                }
                _ => {}
            }
            return;
        }
        match cmd {
            EpCmd::Dispatch { items, rejoins } => {
                if rejoins == self.rejoins {
                    self.dispatch(items).await;
                } else {
                    debug!(
                        worker = %self.id,
                        members = items.len(),
                        "dropping members placed before the worker was lost"
                    );
                }
            }
            EpCmd::Release { ids, clean } => {
                // Imported by this session: an id it does not hold was
                // imported by one lost since, which may not have let go.
                let ours: Vec<CanonicalIdentity> = ids
                    .iter()
                    .filter(|i| self.imported.remove(*i))
                    .copied()
                    .collect();
                let what = format!("{}: release of {} imports", self.id, ids.len());
                let link = Arc::clone(&self.link);
                self.detached(
                    what,
                    Box::pin(async move {
                        link.release_imports(ids).await?;
                        if let Some(clean) = clean {
                            let _ = clean.send(ours);
                        }
                        Ok(())
                    }),
                );
            }
            EpCmd::DeviceFree {
                identity,
                incarnation,
            } => {
                if incarnation != self.life.incarnation() {
                    tracing::debug!(
                        "{}: device free of {identity}: held by a lost session, nothing to free",
                        self.id
                    );
                    return;
                }
                let what = format!("{}: device free of {identity}", self.id);
                let link = Arc::clone(&self.link);
                self.detached(
                    what,
                    Box::pin(async move { link.device_free(identity).await }),
                );
            }
            EpCmd::DeviceAlloc {
                identity,
                nbytes,
                region,
                reply,
            } => self.control(reply, move |l| {
                Box::pin(async move { l.device_alloc(identity, nbytes, region).await })
            }),
            EpCmd::Export { identity, reply } => {
                self.control(reply, move |l| {
                    Box::pin(async move { l.export(identity).await })
                });
            }
            EpCmd::ImportShared {
                identity,
                memory,
                reply,
            } => self.control(reply, move |l| {
                Box::pin(async move { l.import_shared(identity, memory).await })
            }),
            EpCmd::EndRun { reply } => {
                self.control(reply, |l| Box::pin(async move { l.end_run().await }));
            }
            EpCmd::CopyToDevice {
                identity,
                offset,
                data,
                reply,
            } => self.control(reply, move |l| {
                Box::pin(async move { l.copy_to_device(identity, offset, data).await })
            }),
            EpCmd::CopyFromDevice {
                identity,
                offset,
                len,
                reply,
            } => self.control(reply, move |l| {
                Box::pin(async move { l.copy_from_device(identity, offset, len).await })
            }),
            EpCmd::Flush { views, token } => {
                let (tx, rx) = oneshot::channel();
                self.control(tx, move |l| Box::pin(async move { l.flush(views).await }));
                let up = self.up.clone();
                tokio::spawn(async move {
                    let bytes = match rx.await {
                        Ok(Ok(bytes)) => Some(bytes),
                        _ => None,
                    };
                    let _ = up.send(super::Notice::Flushed { token, bytes });
                });
            }
            EpCmd::Stats { reply } => {
                self.control(reply, |l| Box::pin(async move { l.stats().await }));
            }
            EpCmd::Shutdown { .. } => unreachable!("handled by run"),
        }
    }
}

/// How often a fence is looked for (a process seen dead, a session ended).
const FENCE_POLL: Duration = Duration::from_millis(20);
