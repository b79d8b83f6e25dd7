//! Losing a worker, looking for the fence of each loss, and rejoining.
//!
//! A lost worker the cluster connected to (not spawned) may come back: a
//! restarted process on the same address, the same process once a cut
//! connection heals, or an in-process worker resumed. The endpoint keeps
//! dialing it (50 ms, doubling to 1 s); when a link opens and the worker
//! still offers every callable it offered at the start, the endpoint
//! starts afresh (nothing imported, nothing in flight) and reports it up
//! again. A spawned worker is restarted while the respawn budget lasts.
//!
//! Fences (docs/reliability.md, quarantine). A loss is fenced when it happens if the worker
//! cannot touch task memory any more: a staged link (it only held copies,
//! and late completions are dropped) or a spawned process the endpoint
//! killed and saw gone. Otherwise the engine quarantines what was in
//! flight, and the endpoint looks for a fence in two ways, reporting
//! an [`Event::Fenced`](strata_orchestrator_core::Event::Fenced) with the loss's number as soon as either succeeds:
//! 1. the worker process is seen dead: its pid (from `SO_PEERCRED` on the
//!    fd channel, or the one the cluster spawned) is gone, every thread of
//!    it exited ([`crate::procfs`]), or it is a different process (another
//!    start time) — checked every 20 ms on a
//!    thread of its own, off the async runtime;
//! 2. the same worker comes back (same `instance` when the link opens):
//!    the redial names the lost session, which the worker ends at once
//!    (its queued tasks never start), and the endpoint polls the session's
//!    state until the worker reports it ended with nothing running. A
//!    different instance (a restarted process) proves nothing about the
//!    old one; 1 still may.
//!
//! Killing a spawned process and waiting for it, and reading its log, also
//! happen off the runtime ([`tokio::task::spawn_blocking`]).

use rustc_hash::FxHashSet as HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::{EndpointActor, FENCE_POLL, Internal, Respawn, Spawned};
use crate::actors::Notice;
use crate::actors::fence::{Process, Unfenced};
use crate::error::ClusterError;
use crate::link::{Dialer, LinkError, LinkEvent, Memory, WorkerLink};
use strata_orchestrator_core::Event;

/// Something looking for a fence: a task on the runtime (a session poll)
/// or a thread of its own (a process watch).
pub(super) enum Fencer {
    Task(JoinHandle<()>),
    Thread(Arc<AtomicBool>),
}

impl Fencer {
    /// Stops looking.
    pub(super) fn cancel(&self) {
        match self {
            Fencer::Task(t) => t.abort(),
            Fencer::Thread(stop) => stop.store(true, Ordering::Release),
        }
    }
}

impl EndpointActor {
    /// The worker is lost (`cause` says how). Reports it down once — after
    /// killing a spawned process and waiting for it, off the runtime — and
    /// starts dialing it again.
    pub(super) fn lost(&mut self, cause: String) {
        if self.dead {
            return;
        }
        self.dead = true;
        self.life.lost();
        self.lost_at = Some(Instant::now());
        let _ = self.lost_tx.send(true);
        self.link.close();
        self.in_flight.clear();
        self.deadlines.clear();
        self.imported.clear();
        self.resident.clear();
        // A staged link only ever held copies of task bytes, and their
        // completions are dropped from here on: it cannot touch memory.
        let staged = self.link.facts().memory == Memory::Staged;
        let Some(s) = self.spawned.clone() else {
            return self.report_loss(cause, staged);
        };
        // The cluster spawned it: make sure a hung process cannot wake up
        // and write into buffers later, and wait (briefly) until it is
        // gone, which is what makes a rerun elsewhere safe. A crashed
        // worker's last words are the likeliest explanation of the loss.
        let tx = self.internal_tx.clone();
        tokio::task::spawn_blocking(move || {
            let mut fenced = staged;
            let mut cause = cause;
            if let Ok(pid) = i32::try_from(s.pid) {
                // How it ended, when it did on its own (a broken link is
                // usually a dead process, seen a moment before its exit):
                // the likeliest explanation after its last words.
                match exit_of(s.pid, Duration::from_millis(50)) {
                    Ok(Some(how)) => cause = format!("{cause}; its process {} {how}", s.pid),
                    Ok(None) => {
                        cause =
                            format!("{cause}; its process {} was still running (killed)", s.pid);
                    }
                    Err(_) => {}
                }
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                fenced |= wait_gone(s.pid, Duration::from_secs(1));
            }
            let tail = crate::local::tail(&s.log);
            let last: Vec<&str> = tail.lines().filter(|l| !l.trim().is_empty()).collect();
            let cause = if last.is_empty() {
                format!("{cause}; its log is empty")
            } else {
                let last = &last[last.len().saturating_sub(3)..];
                format!("{cause}; its log ends: {}", last.join(" | "))
            };
            let _ = tx.send(Internal::Examined { cause, fenced });
        });
    }

    /// Reports a loss to the DAG actor (fenced or not) and starts looking
    /// for its fence and dialing the worker again.
    pub(super) fn report_loss(&mut self, cause: String, fenced: bool) {
        warn!(worker = %self.id, name = %self.name, %cause, fenced, "worker lost");
        self.losses += 1;
        if !fenced {
            let f = self.link.facts();
            self.unfenced.push(Unfenced {
                epoch: self.losses,
                session: f.session,
                instance: f.worker.instance,
            });
            if let Some(p) = self.process {
                self.watch_process(p, self.losses);
            }
        }
        let _ = self.up.send(Notice::Event(Event::WorkerLost {
            worker: self.id,
            cause,
            fenced,
        }));
        self.redial();
    }

    /// Proof came that loss `epoch`'s tasks ended: tell the engine, once.
    pub(super) fn fenced(&mut self, epoch: u64) {
        let Some(at) = self.unfenced.iter().position(|u| u.epoch == epoch) else {
            return;
        };
        self.unfenced.remove(at);
        // The other ways of looking for this fence have nothing left to do.
        self.fencers.retain(|(e, f)| {
            if *e == epoch {
                f.cancel();
            }
            *e != epoch
        });
        info!(worker = %self.id, name = %self.name, epoch, "loss fenced");
        let _ = self.up.send(Notice::Event(Event::Fenced {
            worker: self.id,
            epoch,
        }));
    }

    /// Watches `process`, on a thread of its own, until it ends; then
    /// reports loss `epoch` fenced.
    fn watch_process(&mut self, process: Process, epoch: u64) {
        let tx = self.internal_tx.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let spawned = std::thread::Builder::new()
            .name(format!("strata-fence-{}", self.id.0))
            .spawn(move || {
                while !stopped.load(Ordering::Acquire) {
                    if process.ended() {
                        let _ = tx.send(Internal::Fenced(epoch));
                        return;
                    }
                    std::thread::sleep(FENCE_POLL);
                }
            });
        match spawned {
            Ok(_) => self.fencers.push((epoch, Fencer::Thread(stop))),
            Err(e) => warn!(worker = %self.id, error = %e, "cannot start a process watch"),
        }
    }

    /// Polls the worker (the same one, back) until it reports the session
    /// of `u` ended with nothing running, then reports `u`'s loss fenced.
    /// Gives up when the worker is lost again or no longer knows the
    /// session (which proves nothing).
    fn poll_session(&mut self, u: Unfenced) {
        let tx = self.internal_tx.clone();
        let link = Arc::clone(&self.link);
        let mut lost = self.lost_rx.clone();
        let task = tokio::spawn(async move {
            loop {
                let state = tokio::select! {
                    s = link.session_state(u.session) => s,
                    _ = lost.wait_for(|l| *l) => return,
                };
                match state {
                    Ok(s) if s.is_fenced() => {
                        let _ = tx.send(Internal::Fenced(u.epoch));
                        return;
                    }
                    Ok(s) if !s.known => return,
                    Ok(_) => {}
                    Err(e) => {
                        debug!(session = %u.session, error = %e, "session state");
                        return;
                    }
                }
                tokio::time::sleep(FENCE_POLL).await;
            }
        });
        self.fencers.push((u.epoch, Fencer::Task(task)));
    }

    /// Starts dialing a lost worker the cluster connected to, or
    /// restarting one it spawned (while the respawn budget lasts, or after
    /// a timeout).
    fn redial(&mut self) {
        // A worker killed for a timeout did not crash: it is restarted
        // whatever the budget, which is left as it was.
        let timed_out = std::mem::take(&mut self.timed_out);
        let Some(dialer) = self.rejoin.clone() else {
            return;
        };
        let tx = self.internal_tx.clone();
        let (id, name) = (self.id, self.name.clone());
        if self.spawned.is_some() {
            let Some(respawn) = self.respawn.as_mut().filter(|s| timed_out || s.left > 0) else {
                return;
            };
            if !timed_out {
                respawn.left -= 1;
            }
            let respawn = respawn.clone();
            self.dialer = Some(tokio::spawn(async move {
                match restart(&respawn).await {
                    Ok((link, events, spawned)) => {
                        let _ = tx.send(Internal::Redialed(link, events, Some(spawned)));
                    }
                    Err(e) => warn!(worker = %id, %name, error = %e, "could not restart"),
                }
            }));
            return;
        }
        // The redial names the session just lost: a worker that is the
        // same one ends it at once (none of its queued tasks starts).
        let previous = self.unfenced.last().map(|u| u.session);
        self.dialer = Some(tokio::spawn(async move {
            let mut pause = Duration::from_millis(50);
            loop {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                let (etx, erx) = mpsc::unbounded_channel();
                match dialer.dial(previous, etx).await {
                    Ok(link) => {
                        let _ = tx.send(Internal::Redialed(link, erx, None));
                        return;
                    }
                    Err(e) => debug!(worker = %id, %name, error = %e, "not back yet"),
                }
            }
        }));
    }

    /// A lost worker answered again: it rejoins if it still offers the
    /// callables it offered at the start, and still has what its tasks
    /// could use then.
    pub(super) fn redialed(
        &mut self,
        link: Arc<dyn WorkerLink>,
        events: mpsc::UnboundedReceiver<LinkEvent>,
        spawned: Option<Spawned>,
    ) {
        self.dialer = None;
        if !self.dead {
            return;
        }
        if let Some(s) = spawned {
            self.life.set_pid(s.pid);
            self.spawned = Some(s);
        }
        let offered: HashSet<_> = link.facts().worker.handles().collect();
        let missing = self.offers.difference(&offered).count();
        if missing > 0 {
            warn!(
                worker = %self.id,
                name = %self.name,
                missing,
                "back but lacks callables it offered at the start; not rejoining it (dialing again)"
            );
            link.close();
            return self.redial();
        }
        let missing = link.facts().capabilities().missing(&self.capabilities);
        if !missing.is_empty() {
            warn!(
                worker = %self.id,
                name = %self.name,
                %missing,
                "back but lacks capabilities it had at the start; not rejoining it (dialing again)"
            );
            link.close();
            return self.redial();
        }
        self.process = link
            .facts()
            .pid
            .or_else(|| self.spawned.as_ref().map(|s| s.pid))
            .and_then(Process::of);
        self.link = link;
        self.link_events = events;
        self.imported.clear();
        self.resident.clear();
        self.in_flight.clear();
        self.rejoins += 1;
        self.dead = false;
        let _ = self.lost_tx.send(false);
        self.life.back();
        // The same worker is back: ask it about every session lost without
        // a fence (the redial already ended the last one).
        let instance = self.link.facts().worker.instance;
        let same: Vec<Unfenced> = self
            .unfenced
            .iter()
            .copied()
            .filter(|u| u.instance == instance)
            .collect();
        for u in same {
            self.poll_session(u);
        }
        let away = self.lost_at.take().map(|t| t.elapsed()).unwrap_or_default();
        info!(
            worker = %self.id,
            name = %self.name,
            away_ms = away.as_secs_f64() * 1e3,
            "rejoined"
        );
        let callables = self.offers.iter().copied().collect();
        let _ = self.up.send(Notice::Event(Event::WorkerUp {
            worker: self.id,
            callables,
            capabilities: self.capabilities,
            window: self.window,
        }));
    }
}

type Restarted = (
    Arc<dyn WorkerLink>,
    mpsc::UnboundedReceiver<LinkEvent>,
    Spawned,
);

/// Restarts a spawned worker on its socket and opens a link to it.
async fn restart(respawn: &Respawn) -> Result<Restarted, RestartError> {
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
        let pid = lw.pid(chip).ok_or(ClusterError::NoProcess { chip })?;
        let log = lw.log_path(chip).unwrap_or_default();
        Ok::<_, ClusterError>((endpoint, Spawned { pid, log }))
    })
    .await??;
    let mut dial = respawn.dial.clone();
    dial.endpoint = endpoint;
    let (tx, rx) = mpsc::unbounded_channel();
    let link = dial.dial(None, tx).await?;
    Ok((link, rx, spawned))
}

/// Why a spawned worker could not be restarted.
#[derive(Debug, thiserror::Error)]
enum RestartError {
    /// The process did not start, or was not ready.
    #[error(transparent)]
    Start(#[from] ClusterError),
    /// The blocking task that starts it panicked or was cancelled.
    #[error("the restart task: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// The new process did not answer the dial.
    #[error(transparent)]
    Dial(#[from] LinkError),
}

/// How child `pid` ended ("exited with status 3", "was killed by signal
/// 9 (SIGKILL)"), looking for up to `limit`; `Ok(None)` while it still
/// runs then, `Err` when it cannot be told (not this process's child, or
/// reaped already). Peeks without reaping (`WNOWAIT`): the process's owner
/// still reaps it.
fn exit_of(pid: u32, limit: Duration) -> nix::Result<Option<String>> {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).map_err(|_| nix::Error::EINVAL)?);
    let deadline = Instant::now() + limit;
    loop {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pid), flags) {
            Ok(WaitStatus::Exited(_, code)) => {
                return Ok(Some(format!("exited with status {code}")));
            }
            Ok(WaitStatus::Signaled(_, signal, core)) => {
                let core = if core { " (core dumped)" } else { "" };
                return Ok(Some(format!(
                    "was killed by signal {} ({}){core}",
                    signal as i32,
                    signal.as_str()
                )));
            }
            Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(_) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

/// Waits up to `limit` for every thread of process `pid` to have exited
/// ([`crate::procfs::exited`]). Blocks: call it off the async runtime.
fn wait_gone(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if crate::procfs::exited(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_end_is_told_without_reaping_it() {
        let mut exited = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .unwrap();
        assert_eq!(
            exit_of(exited.id(), Duration::from_secs(5))
                .unwrap()
                .as_deref(),
            Some("exited with status 3")
        );
        // Not reaped: its owner still collects the status.
        assert_eq!(exited.wait().unwrap().code(), Some(3));

        let mut running = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert_eq!(
            exit_of(running.id(), Duration::from_millis(20)).unwrap(),
            None
        );
        running.kill().unwrap();
        assert_eq!(
            exit_of(running.id(), Duration::from_secs(5))
                .unwrap()
                .as_deref(),
            Some("was killed by signal 9 (SIGKILL)")
        );
        running.wait().unwrap();
        // Reaped now, and pid 1 was never ours: nothing to tell.
        assert!(exit_of(running.id(), Duration::ZERO).is_err());
        assert!(exit_of(1, Duration::ZERO).is_err());
    }
}
