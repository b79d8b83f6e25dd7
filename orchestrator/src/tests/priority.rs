//! A task's upward rank when it is dispatched reaches its launch
//! (`Launch::priority`), where a chip that can favour some work favours
//! the higher (a CUDA chip's high-priority streams): along a chain, each
//! task ranks above the ones after it; with a policy that does not rank,
//! every priority is 0.
//!
//! The chip here is a simulated one that records the priorities it is
//! given: the handling of the rank by the driver and the worker is what
//! is tested, on a machine without a GPU.

use std::sync::{Arc, Condvar, Mutex};

use strata_chip_runtime::device::{Completion, DeviceAddr};
use strata_chip_runtime::{
    Device, DeviceBlock, DeviceInfo, DeviceStats, Launch, Region, Registry, SimDevice,
};
use strata_wire::DType;
use strata_worker_node::InProcessWorker;

use crate::{Cluster, SchedulerPolicy, Task};

/// A simulated chip that records each launch's kernel and priority, and
/// holds launches back while `hold` says so.
#[derive(Debug)]
struct Recording {
    chip: SimDevice,
    seen: Arc<Mutex<Vec<(String, u64)>>>,
    hold: Arc<(Mutex<bool>, Condvar)>,
}

impl Device for Recording {
    fn info(&self) -> DeviceInfo {
        self.chip.info()
    }
    fn alloc(
        &self,
        region: Region,
        nbytes: u64,
    ) -> Result<DeviceBlock, strata_chip_runtime::Error> {
        self.chip.alloc(region, nbytes)
    }
    fn free(&self, addr: DeviceAddr) -> Result<(), strata_chip_runtime::Error> {
        self.chip.free(addr)
    }
    fn end_run(&self) -> Result<(), strata_chip_runtime::Error> {
        self.chip.end_run()
    }
    fn check_block(&self, block: &DeviceBlock) -> Result<(), strata_chip_runtime::Error> {
        self.chip.check_block(block)
    }
    fn copy_to_device(
        &self,
        block: &DeviceBlock,
        offset: u64,
        src: &[u8],
    ) -> Result<(), strata_chip_runtime::Error> {
        self.chip.copy_to_device(block, offset, src)
    }
    fn copy_from_device(
        &self,
        block: &DeviceBlock,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), strata_chip_runtime::Error> {
        self.chip.copy_from_device(block, offset, dst)
    }
    fn launch(&self, launch: Launch, done: Completion) -> Result<(), strata_chip_runtime::Error> {
        let (held, cv) = &*self.hold;
        let mut h = held.lock().unwrap();
        while *h {
            h = cv.wait(h).unwrap();
        }
        drop(h);
        self.seen
            .lock()
            .unwrap()
            .push((launch.kernel.descriptor().name.clone(), launch.priority));
        self.chip.launch(launch, done)
    }
    fn synchronize(&self) {
        self.chip.synchronize();
    }
    fn stats(&self) -> DeviceStats {
        self.chip.stats()
    }
}

/// Runs a chain of `n` `axpy` tasks (each on the last one's output) under
/// `policy`, twice (the first run teaches the models the kernel's time);
/// the priorities of the second run's launches, in order. The chip holds
/// the first launch of a run until the whole chain is submitted, so that
/// every later task leaves knowing the rest of the chain.
fn chain(policy: SchedulerPolicy, n: usize) -> Vec<u64> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hold = Arc::new((Mutex::new(false), Condvar::new()));
    let chip = Recording {
        chip: SimDevice::from_spec("sim:mem=1MiB").unwrap(),
        seen: Arc::clone(&seen),
        hold: Arc::clone(&hold),
    };
    let worker = InProcessWorker::on_device(0, Arc::new(chip), Registry::with_builtins());
    let c = Cluster::builder()
        .in_process_worker(worker)
        .scheduler(policy)
        .start()
        .unwrap();
    let x = c.buffer(64).unwrap().tensor(&[16], DType::F32).unwrap();
    let y = c.buffer(64).unwrap().tensor(&[16], DType::F32).unwrap();
    for _ in 0..2 {
        seen.lock().unwrap().clear();
        *hold.0.lock().unwrap() = true;
        for _ in 0..n {
            c.submit(Task::new("axpy").input(&x).inout(&y).scalar_f64(1.0))
                .unwrap();
        }
        *hold.0.lock().unwrap() = false;
        hold.1.notify_all();
        c.wait_all().unwrap();
    }
    let got = seen.lock().unwrap().clone();
    assert!(got.iter().all(|(k, _)| k == "axpy"), "{got:?}");
    got.into_iter().map(|(_, p)| p).collect()
}

#[test]
fn a_chain_ranks_each_task_above_the_next_and_the_rank_reaches_the_chip() {
    let p = chain(SchedulerPolicy::Dmdas, 8);
    assert_eq!(p.len(), 8);
    assert!(p.iter().all(|&r| r > 0), "{p:?}");
    // The first task leaves as it is submitted, before the tasks after it
    // exist: its rank is its own time. Each later one leaves when the one
    // before it ends, all submitted by then: the closer to the head, the
    // longer its path to the end.
    assert!(
        p[1..].windows(2).all(|w| w[0] >= w[1]),
        "ranks fall along the chain: {p:?}"
    );
    assert!(p[1] > p[7], "{p:?}");
}

#[test]
fn a_policy_that_does_not_rank_gives_no_priority() {
    let p = chain(SchedulerPolicy::Dmda, 4);
    assert_eq!(p, [0, 0, 0, 0]);
}
