//! A progress bar on runs longer than a moment: tasks done / submitted,
//! rate, failures. Drawn on stderr only when it is a terminal and the user
//! did not ask for quiet.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use strata_orchestrator::Cluster;

/// Whether to draw progress: stderr is a terminal and not `--quiet`.
pub(crate) fn wanted(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal()
}

/// Runs `job`, showing the cluster's progress meanwhile when `enabled`
/// (the bar appears after half a second, so short runs stay clean).
pub(crate) fn around<T>(cluster: &Cluster, enabled: bool, job: impl FnOnce() -> T) -> T {
    if !enabled {
        return job();
    }
    let base = cluster.totals().unwrap_or_default();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let started = Instant::now();
            let mut bar: Option<ProgressBar> = None;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                if started.elapsed() < Duration::from_millis(500) {
                    continue;
                }
                let Ok(t) = cluster.totals() else { break };
                let submitted = t.submitted - base.submitted;
                let done = (t.succeeded + t.failed + t.skipped + t.cancelled)
                    - (base.succeeded + base.failed + base.skipped + base.cancelled);
                let failed = (t.failed + t.skipped) - (base.failed + base.skipped);
                let b = bar.get_or_insert_with(|| {
                    let b = ProgressBar::new(submitted.max(1));
                    b.set_style(
                        ProgressStyle::with_template(
                            "{spinner} [{elapsed_precise}] {bar:32} {pos}/{len} tasks  {per_sec}  {msg}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar()),
                    );
                    b
                });
                b.set_length(submitted.max(1));
                b.set_position(done);
                b.set_message(if failed > 0 {
                    format!("{failed} failed or skipped")
                } else {
                    String::new()
                });
            }
            if let Some(b) = bar {
                b.finish_and_clear();
            }
        });
        let out = job();
        stop.store(true, Ordering::Relaxed);
        let _ = watcher.join();
        out
    })
}
