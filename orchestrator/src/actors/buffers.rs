//! The buffer manager: hears when a buffer's last user (driver handle,
//! scope or unfinished task) let go, and tells the workers that hold it to
//! release their import or free the device block. A pooled buffer's memfd
//! goes back to the cluster's pool once every worker that imported it has
//! answered its release ([`crate::buffer::pool`], steps 3 to 5).
//!
//! Creating a buffer needs no actor: the driver thread mints the identity
//! and makes (or takes) the memfd. Releases are batched per worker.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use strata_orchestrator_core::WorkerId;
use strata_wire::CanonicalIdentity;
use tokio::sync::{mpsc, oneshot};

use super::EpCmd;
use crate::buffer::{Released, Returning};

/// A pooled memfd waiting for its workers' answers.
struct Waiting {
    returning: Returning,
    /// Workers yet to answer.
    left: usize,
    /// Whether every answer so far released it cleanly.
    clean: bool,
}

/// One worker's answer to a release: the buffers it released cleanly,
/// out of those asked.
struct Answer {
    asked: Vec<CanonicalIdentity>,
    clean: Vec<CanonicalIdentity>,
}

pub(crate) async fn run(
    mut released: mpsc::UnboundedReceiver<Released>,
    endpoints: Vec<mpsc::Sender<EpCmd>>,
) {
    let (answers_tx, mut answers) = mpsc::unbounded_channel::<Answer>();
    let mut waiting: FxHashMap<CanonicalIdentity, Waiting> = FxHashMap::default();
    loop {
        let first = tokio::select! {
            r = released.recv() => match r {
                Some(r) => r,
                None => return,
            },
            Some(a) = answers.recv() => {
                answer(&mut waiting, a);
                continue;
            }
        };
        let mut imports: BTreeMap<WorkerId, (Vec<CanonicalIdentity>, Vec<CanonicalIdentity>)> =
            BTreeMap::new();
        let mut frees: Vec<((WorkerId, u64), CanonicalIdentity)> = Vec::new();
        let mut next = Some(first);
        while let Some(r) = next {
            match r {
                Released::Host {
                    identity,
                    workers,
                    returning,
                } => match returning {
                    // No worker mapped it: nothing can write it any more.
                    Some(r) if workers.is_empty() => r.recycle(),
                    Some(r) => {
                        for &w in &workers {
                            imports.entry(w).or_default().1.push(identity);
                        }
                        waiting.insert(
                            identity,
                            Waiting {
                                returning: r,
                                left: workers.len(),
                                clean: true,
                            },
                        );
                    }
                    None => {
                        for w in workers {
                            imports.entry(w).or_default().0.push(identity);
                        }
                    }
                },
                Released::Device {
                    identity,
                    worker,
                    importers,
                } => {
                    frees.push((worker, identity));
                    frees.extend(importers.into_iter().map(|w| (w, identity)));
                }
            }
            next = released.try_recv().ok();
        }
        for (w, (plain, pooled)) in imports {
            let Some(ep) = endpoints.get(w.0 as usize) else {
                fail(&mut waiting, &pooled);
                continue;
            };
            let clean = if pooled.is_empty() {
                None
            } else {
                let (tx, rx) = oneshot::channel();
                let answers = answers_tx.clone();
                let asked = pooled.clone();
                tokio::spawn(async move {
                    // A dropped sender (the worker lost) released none cleanly.
                    let clean = rx.await.unwrap_or_default();
                    let _ = answers.send(Answer { asked, clean });
                });
                Some(tx)
            };
            let mut ids = plain;
            ids.extend(pooled);
            let _ = ep.send(EpCmd::Release { ids, clean }).await;
        }
        for ((w, incarnation), identity) in frees {
            if let Some(ep) = endpoints.get(w.0 as usize) {
                let _ = ep
                    .send(EpCmd::DeviceFree {
                        identity,
                        incarnation,
                    })
                    .await;
            }
        }
    }
}

/// A worker answered: each buffer it was asked about has one answer fewer
/// to wait for; one whose answers are all in goes back to the pool if
/// every one was clean, and is discarded otherwise.
fn answer(waiting: &mut FxHashMap<CanonicalIdentity, Waiting>, a: Answer) {
    let clean: rustc_hash::FxHashSet<CanonicalIdentity> = a.clean.into_iter().collect();
    for id in a.asked {
        settle(waiting, id, clean.contains(&id));
    }
}

/// Buffers whose worker cannot be asked: not released cleanly there.
fn fail(waiting: &mut FxHashMap<CanonicalIdentity, Waiting>, ids: &[CanonicalIdentity]) {
    for &id in ids {
        settle(waiting, id, false);
    }
}

fn settle(waiting: &mut FxHashMap<CanonicalIdentity, Waiting>, id: CanonicalIdentity, clean: bool) {
    let Some(w) = waiting.get_mut(&id) else {
        return;
    };
    w.left = w.left.saturating_sub(1);
    w.clean &= clean;
    if w.left == 0 {
        if let Some(w) = waiting.remove(&id) {
            if w.clean {
                w.returning.recycle();
            } else {
                tracing::debug!(buffer = %id, "a worker did not release it cleanly: discarded");
            }
        }
    }
}
