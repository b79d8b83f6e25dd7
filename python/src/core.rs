//! What arrays, tasks and the cluster object share: [`Core`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use pyo3::prelude::*;
use strata_orchestrator::{Cluster, Error};

use crate::errors::err;
use crate::sig::Sig;

/// What arrays, tasks and the cluster object share: the cluster (until it
/// is closed) and the signatures of the callables used so far.
pub(crate) struct Core {
    pub(crate) cluster: RwLock<Option<Cluster>>,
    pub(crate) sigs: Mutex<HashMap<String, Arc<Sig>>>,
    /// Set by `close` before it takes the cluster: a wait blocked in
    /// another thread (holding the cluster's read lock) gives up at its
    /// next slice instead of keeping `close` waiting for the run.
    pub(crate) closing: AtomicBool,
}

impl Core {
    /// Runs `f` on the cluster; [`Error::Closed`] once it is closed. Call
    /// it with the GIL released when `f` can block.
    pub(crate) fn run<T>(&self, f: impl FnOnce(&Cluster) -> Result<T, Error>) -> Result<T, Error> {
        let guard = self.cluster.read().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(c) => f(c),
            None => Err(Error::Closed),
        }
    }

    /// Whether `close` has been called.
    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// The signature of `callable`, parsed once.
    pub(crate) fn sig(&self, callable: &str) -> PyResult<Arc<Sig>> {
        let mut sigs = self.sigs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = sigs.get(callable) {
            return Ok(Arc::clone(s));
        }
        let sig = Arc::new(Sig::of(
            self.run(|c| c.callable_signature(callable)).map_err(err)?,
        ));
        sigs.insert(callable.to_owned(), Arc::clone(&sig));
        Ok(sig)
    }

    /// Stops the cluster (no waiting for tasks): its workers are stopped
    /// and reaped.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        let taken = self
            .cluster
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(taken);
    }
}
