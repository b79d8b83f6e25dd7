//! The private folder of the workers a driver spawns, and the sweep of
//! folders that dead drivers left behind.
//!
//! Each driver that spawns workers makes one folder `strata-XXXXXX` in the
//! temporary directory (mode 0700) for their sockets and logs, and puts
//! its marker [`DRIVER_MARKER`] in it: `pid=<pid> start=<start time>`, the
//! start time being the process's (in clock ticks since boot, from
//! `/proc/<pid>/stat`), so that a pid reused by another process does not
//! pass for the driver.
//!
//! Normally nothing is left: the driver removes the folder when its
//! cluster stops, and when the driver dies the workers remove their own
//! files and the last one out the folder. What a crash still leaves (a
//! worker killed before it could clean up) the next driver removes when
//! it starts its workers: every folder of the temporary directory named
//! `strata-*`, owned by this user, holding a marker whose driver is no
//! longer running. A folder without a readable marker is not a strata
//! driver's and is never touched.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::unistd::geteuid;
use strata_boundary::DRIVER_MARKER;
use tempfile::TempDir;
use tracing::{debug, info};

use crate::error::ClusterError;
use crate::procfs;

const PREFIX: &str = "strata-";

/// Sweeps the temporary directory, then makes this driver's folder and
/// marks it.
pub(crate) fn create() -> Result<TempDir, ClusterError> {
    let base = std::env::temp_dir();
    sweep(&base);
    let dir = tempfile::Builder::new()
        .prefix(PREFIX)
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(&base)
        .map_err(ClusterError::TempDir)?;
    let marker = dir.path().join(DRIVER_MARKER);
    let me = std::process::id();
    let text = match start_time(me) {
        Some(start) => format!("pid={me} start={start}\n"),
        // Without /proc, no sweep can ever tell it stale: leave it unmarked
        // rather than mark it wrongly.
        None => return Ok(dir),
    };
    std::fs::write(&marker, text).map_err(|source| ClusterError::DriverMarker {
        path: marker,
        source,
    })?;
    Ok(dir)
}

/// Removes the folders under `base` that drivers no longer running left
/// behind; returns how many.
pub(crate) fn sweep(base: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let uid = geteuid().as_raw();
    let mut removed = 0;
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let path = entry.path();
        // Not following links: a link named strata-* is not a folder of ours.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != uid {
            continue;
        }
        let Some((pid, start)) = read_marker(&path.join(DRIVER_MARKER)) else {
            continue;
        };
        if running(pid, start) {
            continue;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                info!(folder = %path.display(), driver_pid = pid, "removed a dead driver's worker folder");
                removed += 1;
            }
            // Its workers may be removing their files at the same moment.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                debug!(folder = %path.display(), error = %e, "could not remove a dead driver's worker folder");
            }
        }
    }
    removed
}

/// The driver a marker names: `pid=<pid> start=<ticks>`.
fn read_marker(path: &Path) -> Option<(u32, u64)> {
    // A marker is a line; anything large is not one.
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > 256 {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let mut pid = None;
    let mut start = None;
    for word in text.split_whitespace() {
        if let Some(v) = word.strip_prefix("pid=") {
            pid = v.parse().ok();
        } else if let Some(v) = word.strip_prefix("start=") {
            start = v.parse().ok();
        }
    }
    Some((pid?, start?))
}

/// Whether process `pid` runs and is the one that started at `start`
/// (one whose every thread exited runs nothing and holds no pipe; its
/// main thread's zombie alone proves nothing: see [`crate::procfs`]).
fn running(pid: u32, start: u64) -> bool {
    procfs::stat(pid).is_some_and(|(_, s)| s == start) && !procfs::exited(pid)
}

/// The start time of process `pid` (clock ticks after boot).
fn start_time(pid: u32) -> Option<u64> {
    procfs::stat(pid).map(|(_, start)| start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(base: &Path, name: &str, marker: Option<&str>) -> std::path::PathBuf {
        let d = base.join(name);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("chip0.log"), "a log").unwrap();
        if let Some(m) = marker {
            std::fs::write(d.join(DRIVER_MARKER), m).unwrap();
        }
        d
    }

    /// A pid no process has now: a child that has been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn only_folders_of_drivers_no_longer_running_are_swept() {
        let base = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let start = start_time(me).expect("this process's start time");
        let live = folder(
            base.path(),
            "strata-live",
            Some(&format!("pid={me} start={start}")),
        );
        let dead = folder(
            base.path(),
            "strata-dead",
            Some(&format!("pid={} start=1", dead_pid())),
        );
        // This pid, but another process's start: the pid was reused.
        let reused = folder(
            base.path(),
            "strata-reused",
            Some(&format!("pid={me} start={}", start + 1)),
        );
        let unmarked = folder(base.path(), "strata-other", None);
        let garbled = folder(base.path(), "strata-garbled", Some("pid=x"));
        let other_name = folder(
            base.path(),
            "other-dead",
            Some(&format!("pid={} start=1", dead_pid())),
        );
        assert_eq!(sweep(base.path()), 2);
        assert!(live.exists(), "a running driver's folder is kept");
        assert!(!dead.exists(), "a dead driver's folder is removed");
        assert!(!reused.exists(), "a reused pid is not the driver");
        assert!(unmarked.exists(), "a folder without marker is not ours");
        assert!(garbled.exists(), "an unreadable marker is not ours");
        assert!(other_name.exists(), "only strata-* folders are looked at");
    }

    #[test]
    fn a_created_folder_is_marked_with_this_process() {
        let dir = create().unwrap();
        let (pid, start) = read_marker(&dir.path().join(DRIVER_MARKER)).unwrap();
        assert_eq!(pid, std::process::id());
        assert!(running(pid, start));
        let mode = std::fs::metadata(dir.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }
}
