//! After a job and `drop` of the cluster, the driver's open fds are back
//! to their baseline, no worker process is left, and `/dev/shm` holds
//! nothing new. A test binary of its own: the fd count is per process.

use std::collections::BTreeSet;
use std::time::Duration;

use strata_orchestrator::Cluster;

fn fds() -> BTreeSet<String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn shm() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn alive(pid: u32) -> bool {
    // Reaped children are gone from /proc; a zombie would still be listed.
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn dropping_the_cluster_leaves_no_fd_process_or_shm_behind() {
    let bin = strata_tests::strata_bin();
    // Warm up once: lazily opened process-wide fds (such as the random
    // source) are not the cluster's.
    drop(
        Cluster::builder()
            .local(1)
            .worker_binary(&bin)
            .start()
            .unwrap(),
    );
    let fds_before = fds();
    let shm_before = shm();
    let pids;
    {
        let cluster = Cluster::builder()
            .local(4)
            .worker_binary(&bin)
            .start()
            .unwrap();
        pids = cluster
            .workers()
            .iter()
            .map(|w| w.pid.unwrap())
            .collect::<Vec<_>>();
        let r = strata_orchestrator::demo::tiled_matmul(&cluster, 256, 64, 5).unwrap();
        assert!(r.ok(1e-3));
        let r = strata_orchestrator::demo::pipeline(&cluster, 64, 64, 5).unwrap();
        assert!(r.ok(1e-5));
        assert!(
            fds().len() > fds_before.len(),
            "the cluster holds fds while alive"
        );
    }
    // Give exited threads a moment to close what they held.
    let mut left = fds();
    for _ in 0..50 {
        if left == fds_before {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        left = fds();
    }
    assert_eq!(left, fds_before, "fds left open");
    for pid in pids {
        assert!(!alive(pid), "worker {pid} is still running");
    }
    assert_eq!(shm(), shm_before, "/dev/shm changed");
}
