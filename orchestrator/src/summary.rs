//! What a run did, in figures: [`RunSummary`], for one run (since the
//! previous `wait_all`) or for the cluster's life.

use strata_orchestrator_core::FailureKind;

/// Figures of a run (since the previous `wait_all`) or of the cluster's
/// life ([`crate::Cluster::totals`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Tasks submitted.
    pub submitted: u64,
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Tasks that failed (TASK_FAILURE or ENDPOINT_FAILURE).
    pub failed: u64,
    /// Tasks skipped because a producer failed.
    pub skipped: u64,
    /// Tasks cancelled.
    pub cancelled: u64,
    /// The tasks that did not succeed (failed, skipped or cancelled), by
    /// kind of failure: only kinds that happened appear.
    pub by_kind: std::collections::BTreeMap<FailureKind, u64>,
    /// Dependency edges inferred (one per predecessor of a task).
    pub edges: u64,
    /// Bytes of host buffers passed to local workers by fd (each buffer
    /// counted once per worker): not copied.
    pub fd_bytes: u64,
    /// View bytes sent to remote workers with tasks.
    pub sent_bytes: u64,
    /// View bytes remote workers sent back.
    pub returned_bytes: u64,
    /// Bytes workers staged between host and device memory
    /// (`to_device_bytes + from_device_bytes`).
    pub staged_bytes: u64,
    /// Of those, bytes copied host → device (into chips' cached copies or
    /// scratch).
    pub to_device_bytes: u64,
    /// Of those, bytes copied device → host (written arguments).
    pub from_device_bytes: u64,
    /// Of `to_device_bytes`, bytes copied in ahead of their task while it
    /// waited for its chip (prefetch).
    pub prefetched_bytes: u64,
    /// Bytes copied on the chips, from a cached copy into the block a
    /// writing kernel works on.
    pub on_chip_bytes: u64,
    /// Arguments whose bytes a chip held at the version the task needed.
    pub cache_hits: u64,
    /// Arguments whose bytes a chip had to copy in.
    pub cache_misses: u64,
    /// Dirty cached copies written back (flushes and evictions).
    pub write_backs: u64,
    /// Cached copies evicted to make room.
    pub evictions: u64,
    /// View bytes left out of tasks sent to remote workers because their
    /// chip held them.
    pub held_bytes: u64,
    /// Members sent again because the chip no longer held bytes left out
    /// of them.
    pub resent: u64,
    /// Completions whose kernel time the performance models had predicted
    /// when placing them.
    pub predicted: u64,
    /// Their measured kernel time, in all (ns).
    pub predicted_measured_ns: u64,
    /// The sum of |predicted − measured| over them (ns): divided by
    /// `predicted_measured_ns`, the models' relative error.
    pub prediction_error_ns: u64,
}

impl RunSummary {
    /// The performance models' relative error over the run's completions
    /// they predicted (time-weighted: Σ|predicted − measured| / Σ measured),
    /// or `None` when they predicted none.
    pub fn prediction_error(&self) -> Option<f64> {
        (self.predicted_measured_ns > 0)
            .then(|| self.prediction_error_ns as f64 / self.predicted_measured_ns as f64)
    }
}
