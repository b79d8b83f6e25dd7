//! What `/proc` says about another process: its state and start time, and
//! whether every one of its threads has exited.
//!
//! A process has ended only when its last thread has. The main thread's
//! entry (`/proc/<pid>/stat`) shows a zombie (`Z`) as soon as that one
//! thread exits, while the others may still run: after a SIGKILL each
//! thread dies when it is next scheduled, a thread inside a system call
//! finishes the copy it is making into user memory first, and the last
//! thread out closes the process's files, which on a CUDA worker tears
//! down the device context (a GPU may write page-locked host memory until
//! then). So "ended" here is every thread of `/proc/<pid>/task` a zombie
//! or gone, never the main thread's state alone.

/// State and start time (clock ticks after boot) of process `pid`, from
/// its main thread's `/proc/<pid>/stat`; `None` when there is none.
pub(crate) fn stat(pid: u32) -> Option<(char, u64)> {
    parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// State and start time of a `stat` file's text.
fn parse(text: &str) -> Option<(char, u64)> {
    // The command name (field 2) is in parentheses and may hold spaces and
    // parentheses: the fields that follow start after the last ')'.
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    // Field 3 is the state; the start time is field 22.
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Whether every thread of process `pid` has exited: the process is gone,
/// or nothing but zombies (`Z`, `X`) is left of it.
pub(crate) fn exited(pid: u32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    threads.filter_map(Result::ok).all(|t| {
        // A thread that exited between the listing and this read is gone.
        std::fs::read_to_string(t.path().join("stat"))
            .map_or(true, |text| matches!(parse(&text), Some(('Z' | 'X', _))))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// Polls `f` every 2 ms for up to 10 s.
    fn eventually(mut f: impl FnMut() -> bool) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    #[test]
    fn a_process_whose_main_thread_exited_is_alive_while_another_thread_runs() {
        // The main thread ends itself (`pthread_exit`) and leaves a thread
        // sleeping: the main thread's entry says zombie, the process runs.
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import ctypes, threading, time\n\
                 threading.Thread(target=time.sleep, args=(60,)).start()\n\
                 ctypes.CDLL(None).pthread_exit(None)\n",
            ])
            .stdin(Stdio::null())
            .spawn()
            .expect("python3 (the README's test command needs it too)");
        let pid = child.id();
        assert!(
            eventually(|| stat(pid).is_some_and(|(state, _)| state == 'Z')),
            "the main thread did not exit"
        );
        assert!(!exited(pid), "a thread still runs");
        child.kill().unwrap();
        assert!(eventually(|| exited(pid)), "killed, it ended");
        child.wait().unwrap();
        assert!(exited(pid) && stat(pid).is_none());
    }

    #[test]
    fn this_process_runs_and_a_reaped_child_is_gone() {
        let me = std::process::id();
        assert!(!exited(me));
        assert!(matches!(stat(me), Some(('R' | 'S' | 'D', _))));
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(!exited(child.id()));
        child.kill().unwrap();
        // A zombie until reaped, then gone: exited either way.
        assert!(eventually(|| exited(child.id())));
        child.wait().unwrap();
        assert!(exited(child.id()));
    }
}
