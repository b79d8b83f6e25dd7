//! The names a driver and a worker both use for a session and for a
//! worker process.

use std::fmt;

/// A session: one driver's connection to a worker, which owns what that
/// driver imported and allocated there. The default, 0, is no live
/// session's id (a worker draws odd ones).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A worker process, as its handshake names it: random and nonzero, drawn
/// once when the process starts. Equal instances across two handshakes
/// mean the same process answered both; a restarted worker on the same
/// address has another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InstanceId(pub u64);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "instance {:016x}", self.0)
    }
}
