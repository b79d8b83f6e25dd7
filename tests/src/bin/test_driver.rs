//! `strata-test-driver`: a driver for a test to kill. It starts a cluster
//! of two workers it spawns (`strata-test-worker`, next to it), runs
//! `test.sleep` on the first and `test.spin` on the second (an hour
//! each), prints `pids=<first>,<second>` and waits for ever, holding the
//! cluster. The workers inherit its environment (`TMPDIR`, and
//! `STRATA_TEST_STARTED`, where the kernels say they started).

use std::process::ExitCode;

use strata_orchestrator::{Cluster, Task};

const HOUR_MS: u64 = 3_600_000;

fn main() -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("strata-test-driver: no path to this program: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cluster = match Cluster::builder()
        .local(2)
        .worker_binary(exe.with_file_name("strata-test-worker"))
        .start()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("strata-test-driver: cluster: {e}");
            return ExitCode::FAILURE;
        }
    };
    let workers = cluster.workers();
    let mut pids = Vec::new();
    let mut running = Vec::new();
    for (w, kernel) in workers.iter().zip(["test.sleep", "test.spin"]) {
        let Some(pid) = w.pid else {
            eprintln!("strata-test-driver: worker {} has no pid", w.id);
            return ExitCode::FAILURE;
        };
        pids.push(pid.to_string());
        match cluster.submit(Task::new(kernel).scalar_u64(HOUR_MS).on(w.id)) {
            Ok(h) => running.push(h),
            Err(e) => {
                eprintln!("strata-test-driver: {kernel}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!("pids={}", pids.join(","));
    loop {
        std::thread::park();
    }
}
