//! The buffer manager: hears when a buffer's last user (driver handle or
//! unfinished task) let go, and tells the workers that hold it to release
//! their import or free the device block.
//!
//! Creating a buffer needs no actor: the driver thread mints the identity
//! and makes the memfd. Releases are batched per worker.

use std::collections::BTreeMap;

use strata_orchestrator_core::WorkerId;
use strata_wire::CanonicalIdentity;
use tokio::sync::mpsc;

use super::EpCmd;
use crate::buffer::Released;

pub(crate) async fn run(
    mut released: mpsc::UnboundedReceiver<Released>,
    endpoints: Vec<mpsc::Sender<EpCmd>>,
) {
    while let Some(first) = released.recv().await {
        let mut imports: BTreeMap<WorkerId, Vec<CanonicalIdentity>> = BTreeMap::new();
        let mut frees: Vec<(WorkerId, CanonicalIdentity)> = Vec::new();
        let mut next = Some(first);
        while let Some(r) = next {
            match r {
                Released::Host { identity, workers } => {
                    for w in workers {
                        imports.entry(w).or_default().push(identity);
                    }
                }
                Released::Device { identity, worker } => frees.push((worker, identity)),
            }
            next = released.try_recv().ok();
        }
        for (w, ids) in imports {
            if let Some(ep) = endpoints.get(w.0 as usize) {
                let _ = ep.send(EpCmd::Release(ids)).await;
            }
        }
        for (w, id) in frees {
            if let Some(ep) = endpoints.get(w.0 as usize) {
                let _ = ep.send(EpCmd::DeviceFree(id)).await;
            }
        }
    }
}
