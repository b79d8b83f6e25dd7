//! The performance models' file: what the scheduler learned of kernel
//! durations, kept across runs when the cluster is started with
//! [`crate::ClusterBuilder::perf_models`]. JSON, one record per callable
//! and size class; deleting it starts the models over.

use std::path::Path;

use strata_orchestrator_core::sched::perf::Entry;

use crate::error::ClusterError;

/// The file's format version.
const VERSION: u32 = 1;

#[derive(serde::Serialize, serde::Deserialize)]
struct File {
    strata_perf_models: u32,
    entries: Vec<Entry>,
}

/// The records in `path`; none when it does not exist yet.
///
/// # Errors
/// [`ClusterError::PerfModels`] when it exists but cannot be read or is
/// not a models file of this version.
pub(crate) fn load(path: &Path) -> Result<Vec<Entry>, ClusterError> {
    let bad = |reason: String| ClusterError::PerfModels {
        path: path.to_owned(),
        reason,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(bad(e.to_string())),
    };
    let file: File = serde_json::from_str(&text).map_err(|e| {
        bad(format!(
            "not a performance-models file ({e}); delete it to start over"
        ))
    })?;
    if file.strata_perf_models != VERSION {
        return Err(bad(format!(
            "version {} (this strata reads version {VERSION}); delete it to start over",
            file.strata_perf_models
        )));
    }
    Ok(file.entries)
}

/// Writes `entries` to `path` (through a temporary file beside it, renamed
/// over it, so that a crash leaves the old file or the new one).
///
/// # Errors
/// Creating, writing or renaming the file.
pub(crate) fn save(path: &Path, entries: Vec<Entry>) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(&File {
        strata_perf_models: VERSION,
        entries,
    })
    .map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
