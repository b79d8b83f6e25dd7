//! What proves that a lost worker's tasks can no longer write (see the
//! endpoint's module docs): its process seen dead, or its lost session
//! reported ended with nothing running. The endpoint keeps one
//! [`Unfenced`] per loss until its fence comes.

use crate::procfs;

/// A loss not fenced when it happened, until its fence comes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unfenced {
    /// The endpoint's loss count at that loss.
    pub(crate) epoch: u64,
    /// The session that was lost.
    pub(crate) session: strata_client::SessionId,
    /// The worker process that served it.
    pub(crate) instance: strata_client::InstanceId,
}

/// A worker process as seen from here: pid and start time (clock ticks
/// after boot, from `/proc/PID/stat`), so a reused pid is not mistaken
/// for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Process {
    pid: u32,
    start: u64,
}

impl Process {
    /// Process `pid`, when it runs.
    pub(crate) fn of(pid: u32) -> Option<Process> {
        let (_, start) = procfs::stat(pid)?;
        (!procfs::exited(pid)).then_some(Process { pid, start })
    }

    /// Whether it has ended: gone, every thread of it exited (its main
    /// thread's zombie alone is not enough: see [`procfs`]), or its pid
    /// now names another process.
    pub(crate) fn ended(self) -> bool {
        match procfs::stat(self.pid) {
            None => true,
            Some((_, start)) => start != self.start || procfs::exited(self.pid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_seen_alive_then_dead_and_a_reused_pid_is_not_it() {
        let me = Process::of(std::process::id()).expect("this process");
        assert!(!me.ended());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let it = Process::of(child.id()).expect("the child");
        assert!(!it.ended());
        child.kill().unwrap();
        // A zombie until reaped, then gone: dead either way.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(it.ended());
        child.wait().unwrap();
        assert!(it.ended());
        // Same pid, another start time: another process.
        let other = Process {
            pid: me.pid,
            start: me.start + 1,
        };
        assert!(other.ended());
    }
}
