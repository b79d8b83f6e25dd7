//! A worker offers only the kernels its chip runs and names the others
//! (`WorkerFacts::no_body`); a task asking for one of those is refused
//! naming the chip that has no body for it, not as an unknown callable.
//!
//! The chip here is a simulated one whose `runs` answers from a list: it
//! stands for any chip that runs some kernels and not others (a CUDA chip
//! runs those with a CUDA body), so that the driver's handling is tested
//! on a machine without a GPU.

use std::sync::Arc;

use strata_chip_runtime::device::{Completion, DeviceAddr};
use strata_chip_runtime::{
    Device, DeviceBlock, DeviceInfo, DeviceStats, Kernel, Launch, Region, Registry, SimDevice,
};
use strata_orchestrator_core::WorkerId;
use strata_wire::DType;
use strata_worker_node::InProcessWorker;

use crate::error::SubmitError;
use crate::{Cluster, Error, Task};

/// A simulated chip that runs only the kernels named in `runs`.
#[derive(Debug)]
struct Picky {
    chip: SimDevice,
    runs: &'static [&'static str],
}

impl Device for Picky {
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
        self.chip.launch(launch, done)
    }
    fn runs(&self, kernel: &dyn Kernel) -> bool {
        self.runs.contains(&kernel.descriptor().name.as_str())
    }
    fn synchronize(&self) {
        self.chip.synchronize();
    }
    fn stats(&self) -> DeviceStats {
        self.chip.stats()
    }
}

fn picky(chip: u32, runs: &'static [&'static str]) -> InProcessWorker {
    let device = Picky {
        chip: SimDevice::from_spec("sim:mem=1MiB").unwrap(),
        runs,
    };
    InProcessWorker::on_device(chip, Arc::new(device), Registry::with_builtins())
}

/// A worker whose chip runs `copy` alone offers it alone and names every
/// other built-in kernel as having no body.
#[test]
fn a_worker_offers_the_kernels_its_chip_runs_and_names_the_rest() {
    let w = picky(0, &["copy"]);
    let facts = w.facts();
    let offered: Vec<String> = facts
        .callables
        .iter()
        .map(|c| c.signature.qualified_name())
        .collect();
    assert_eq!(offered, ["copy@1"]);
    let builtins = Registry::with_builtins().len();
    assert_eq!(facts.no_body.len(), builtins - 1);
    assert!(
        facts.no_body.iter().any(|n| n == "axpy@1"),
        "{:?}",
        facts.no_body
    );
    assert!(!facts.no_body.iter().any(|n| n.starts_with("copy@")));
    let mut sorted = facts.no_body.clone();
    sorted.sort_by_key(|n| {
        let (name, v) = n.split_once('@').unwrap();
        (name.to_owned(), v.parse::<u32>().unwrap())
    });
    assert_eq!(sorted, facts.no_body);
}

#[test]
fn a_task_for_a_kernel_no_chip_has_a_body_for_names_the_chip() {
    let c = Cluster::builder()
        .in_process_worker(picky(0, &["copy"]))
        .start()
        .unwrap();
    assert_eq!(
        c.workers()[0].no_body.len(),
        Registry::with_builtins().len() - 1
    );
    let x = c.buffer(64).unwrap().tensor(&[16], DType::F32).unwrap();
    let y = c.buffer(64).unwrap().tensor(&[16], DType::F32).unwrap();
    // `copy` runs.
    c.submit(Task::new("copy").input(&x).output(&y)).unwrap();
    c.wait_all().unwrap();
    // `axpy` is registered there, without a body for that chip.
    let e = c
        .submit(Task::new("axpy").input(&x).inout(&y).scalar_f64(2.0))
        .unwrap_err();
    let spec = c.workers()[0].device.clone();
    assert!(
        matches!(&e, Error::Submit(SubmitError::NoBody { callable, ids, .. })
            if callable == "axpy" && ids == &[WorkerId(0)]),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!("submit: callable \"axpy\" has no body for the chip of worker 0 ({spec})")
    );
    // A version: the same.
    let e = c.submit(Task::new("axpy@1").input(&x)).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("submit: callable \"axpy@1\" has no body for the chip of worker 0"),
        "{e}"
    );
    // A name registered nowhere is still unknown.
    let e = c.submit(Task::new("nope").input(&x)).unwrap_err();
    assert!(
        matches!(&e, Error::Submit(SubmitError::UnknownCallable { name, offered })
            if name == "nope" && offered == &["copy"]),
        "{e:?}"
    );
}

/// Beside a chip that runs everything, a task goes there; placed on the
/// chip without the body, it is refused naming that chip.
#[test]
fn a_task_placed_on_a_chip_without_its_body_is_refused_naming_it() {
    let c = Cluster::builder()
        .in_process(1)
        .in_process_worker(picky(1, &["copy"]))
        .start()
        .unwrap();
    let x = c.buffer_from_slice(&[1.0f32; 16]).unwrap();
    let x = x.tensor(&[16], DType::F32).unwrap();
    let y = c.buffer(64).unwrap().tensor(&[16], DType::F32).unwrap();
    c.submit(Task::new("copy").input(&x).output(&y)).unwrap();
    c.submit(Task::new("axpy").input(&x).inout(&y).scalar_f64(2.0))
        .unwrap();
    c.wait_all().unwrap();
    assert_eq!(y.read::<f32>().unwrap(), vec![3.0f32; 16]);
    let e = c
        .submit(
            Task::new("axpy")
                .input(&x)
                .inout(&y)
                .scalar_f64(2.0)
                .on(WorkerId(1)),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::Submit(SubmitError::NoBody { ids, .. }) if ids == &[WorkerId(1)]),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("submit: callable \"axpy@1\" has no body for the chip of worker 1 (sim"),
        "{e}"
    );
    // Pinned to the chip that has it, it runs.
    c.submit(
        Task::new("axpy")
            .input(&x)
            .inout(&y)
            .scalar_f64(1.0)
            .on(WorkerId(0)),
    )
    .unwrap();
    c.wait_all().unwrap();
    assert_eq!(y.read::<f32>().unwrap(), vec![4.0f32; 16]);
}
