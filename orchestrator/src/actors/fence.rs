//! What proves that a lost worker's tasks can no longer write (see the
//! endpoint's module docs): its process seen dead, or its lost session
//! reported ended with nothing running. The endpoint keeps one
//! [`Unfenced`] per loss until its fence comes.

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
    pub(crate) fn of(pid: u32) -> Option<Process> {
        let (state, start) = proc_stat(pid)?;
        (state != 'Z' && state != 'X').then_some(Process { pid, start })
    }

    /// Whether it has ended: gone, a zombie, or its pid now names another
    /// process.
    pub(crate) fn ended(self) -> bool {
        match proc_stat(self.pid) {
            None => true,
            Some((state, start)) => state == 'Z' || state == 'X' || start != self.start,
        }
    }
}

/// State and start time of process `pid`, or `None` when there is none.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the parenthesised command name: state is the first,
    // start time the 20th (field 22 of the whole line).
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Whether process `pid` is dead: gone, or a zombie.
pub(crate) fn is_dead(pid: u32) -> bool {
    proc_stat(pid).is_none_or(|(state, _)| state == 'Z' || state == 'X')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_seen_alive_then_dead_and_a_reused_pid_is_not_it() {
        let me = Process::of(std::process::id()).expect("this process");
        assert!(!me.ended());
        assert!(!is_dead(std::process::id()));
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let it = Process::of(child.id()).expect("the child");
        assert!(!it.ended());
        child.kill().unwrap();
        // A zombie until reaped, then gone: dead either way.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(it.ended() && is_dead(child.id()));
        child.wait().unwrap();
        assert!(it.ended() && is_dead(child.id()));
        // Same pid, another start time: another process.
        let other = Process {
            pid: me.pid,
            start: me.start + 1,
        };
        assert!(other.ended());
    }
}
