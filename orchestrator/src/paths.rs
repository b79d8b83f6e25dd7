//! Worker paths interned to the small ids buffer descriptors carry.
//!
//! A descriptor has room for the worker that owns its buffer
//! (`owner_worker_path_id`, a u32): the cluster gives each path it reaches
//! a worker at (`unix:/…/worker-0.sock`, `tcp:host:port`, `in-process:0`)
//! an id from 1 on, the same id for the same path, and sets it on the
//! descriptors of the buffers a worker owns: its device buffers. A host
//! buffer has no owning worker (the driver owns it and any worker may map
//! it), so its descriptors carry 0. The id is a diagnostic: `strata
//! inspect` and the driver's errors show it as `<path#N>`, and nothing
//! routes, gates or keys on it (a worker finds a buffer by its identity).

use std::fmt;
use std::sync::Arc;

/// A worker's path as this cluster knows it, with its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkerPath {
    /// The id descriptors of the buffers it owns carry (from 1).
    pub id: u32,
    /// Where the worker is reached (`unix:/…`, `tcp:…`, `in-process:N`).
    pub path: Arc<str>,
}

impl fmt::Display for WorkerPath {
    /// `unix:/run/w0.sock <path#1>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.path, strata_wire::OwnerPath(self.id))
    }
}

/// The paths a cluster has given ids, in id order.
#[derive(Debug, Default)]
pub(crate) struct PathTable {
    paths: Vec<Arc<str>>,
}

impl PathTable {
    /// `path` with its id: the one it was given before, or the next;
    /// `None` past `u32::MAX` paths (the caller says what that means).
    pub(crate) fn intern(&mut self, path: &str) -> Option<WorkerPath> {
        let index = match self.paths.iter().position(|p| &**p == path) {
            Some(i) => i,
            None => {
                self.paths.push(path.into());
                self.paths.len() - 1
            }
        };
        let id = u32::try_from(index + 1).ok()?;
        Some(WorkerPath {
            id,
            path: Arc::clone(&self.paths[index]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_keeps_its_id_and_ids_start_at_one() {
        let mut t = PathTable::default();
        let a = t.intern("unix:/tmp/a.sock").unwrap();
        let b = t.intern("tcp:127.0.0.1:7000").unwrap();
        let again = t.intern("unix:/tmp/a.sock").unwrap();
        assert_eq!((a.id, b.id, again.id), (1, 2, 1));
        assert_eq!(a, again);
        assert_eq!(b.to_string(), "tcp:127.0.0.1:7000 <path#2>");
    }
}
