//! Timing mode and the modelled link: a kernel takes its flops at the
//! modelled rate and computes nothing, staged bytes take the link's
//! bandwidth and latency, and host memory keeps its bytes.

use std::time::Duration;

use strata_chip_runtime::{Registry, SimDevice};
use strata_wire::check::Rng;
use strata_wire::{ArgTag, DType};

use crate::common::{LAYOUTS, host_tensor, run};

#[test]
fn a_timing_chip_sleeps_through_kernels_and_transfers_and_writes_nothing() {
    let reg = Registry::with_builtins();
    // 1 GFlop/s; 100 MB/s with 2 ms per transfer.
    let dev =
        SimDevice::from_spec("sim:mem=64MiB,timing=on,gflops=1,link=100MB,latency=2000").unwrap();
    let mut rng = Rng(11);
    let (m, k, n) = (100u32, 200u32, 50u32);
    let a = host_tensor(&mut rng, &[m, k], DType::F32, LAYOUTS[0]);
    let b = host_tensor(&mut rng, &[k, n], DType::F32, LAYOUTS[1]);
    let c = host_tensor(&mut rng, &[m, n], DType::F32, LAYOUTS[0]);
    let before = c.bytes();
    let report = run(
        &dev,
        &reg,
        "matmul_acc",
        vec![
            a.arg(ArgTag::Input),
            b.arg(ArgTag::Input),
            c.arg(ArgTag::InOut),
        ],
        vec![],
    )
    .unwrap();
    // 2·m·k·n = 2 MFlop at 1 GFlop/s.
    let flops = 2.0 * f64::from(m * k * n);
    assert!(
        report.kernel >= Duration::from_secs_f64(flops / 1e9),
        "kernel {:?}",
        report.kernel
    );
    assert!(report.kernel < Duration::from_secs_f64(flops / 1e9) + Duration::from_millis(50));
    // In: a, b and c (read-written), 4 bytes an element; out: c.
    let bytes_in = 4 * u64::from(m * k + k * n + m * n);
    assert_eq!(report.staged_in, bytes_in);
    assert_eq!(report.staged_out, 4 * u64::from(m * n));
    let link = Duration::from_secs_f64(bytes_in as f64 / 100e6) + Duration::from_millis(2);
    assert!(
        report.copy_in >= link,
        "copy in {:?} < {link:?}",
        report.copy_in
    );
    assert!(
        report.copy_out >= Duration::from_millis(2),
        "copy out {:?}",
        report.copy_out
    );
    assert_eq!(c.bytes(), before, "a timing chip writes no host byte");
}

#[test]
fn a_kernel_without_flops_takes_its_bytes_and_a_plain_chip_no_link() {
    let reg = Registry::with_builtins();
    let dev = SimDevice::from_spec("sim:mem=64MiB,mode=unified,timing=on").unwrap();
    let mut rng = Rng(12);
    let x = host_tensor(&mut rng, &[1000, 1000], DType::F32, LAYOUTS[0]);
    let before = x.bytes();
    let report = run(&dev, &reg, "fill", vec![x.arg(ArgTag::Output)], vec![0]).unwrap();
    // 4 MB at 10 GB/s: 0.4 ms; unified, so nothing staged.
    assert!(
        report.kernel >= Duration::from_micros(400),
        "{:?}",
        report.kernel
    );
    assert_eq!((report.staged_in, report.staged_out), (0, 0));
    assert_eq!(x.bytes(), before);
}
