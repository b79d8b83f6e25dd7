//! Which chip each worker the cluster starts gets, from the builder's
//! device spec: the same spec for every one, or, for `cuda:all`, one
//! worker per GPU with worker `i` on `cuda:i` (the spec's other keys
//! kept).
//!
//! The rule for `cuda:all` ([`plan`]), where `n` is the number of local
//! (spawned) or in-process workers asked for:
//! - `n` = 0 (the default) or `n` = the GPU count: one worker per GPU;
//!   with no number asked for anywhere, they are local workers, unless
//!   the cluster has other workers (connected ones, or in-process ones the
//!   caller started): then the spec has no worker to apply to, and starts
//!   none;
//! - any other `n` is refused, naming both numbers (a GPU left idle or
//!   shared by two workers is more likely a mistake than a wish);
//! - local and in-process workers together are refused: each GPU would
//!   get two workers;
//! - no CUDA driver, or none of its GPUs, is the driver's typed error.
//!
//! A `cuda:N` spec is checked the same way before anything starts: the
//! driver must be there and see GPU `N`. The GPU count is asked of the
//! CUDA driver in this process ([`strata_chip_runtime::cuda::device_count`]);
//! the pure rule takes it as a function so that tests give it.

use strata_chip_runtime::{ChipSpec, CudaError, CudaOrdinal};

use crate::error::ClusterError;

/// The chip spec of each worker to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// One per local (spawned) worker, chip `i` at index `i`.
    pub(crate) local: Vec<String>,
    /// One per in-process worker.
    pub(crate) in_process: Vec<String>,
}

/// The chips of `local` spawned and `in_process` in-process workers on
/// `device`, in a cluster with `others` workers besides (connected, or
/// started by the caller); `gpus` counts the GPUs, and is asked only for
/// a `cuda` spec with workers to start.
///
/// # Errors
/// [`ClusterError::Device`] for a spec no worker accepts and for a CUDA
/// driver or GPU that is not there; [`ClusterError::GpuCount`] and
/// [`ClusterError::GpusTwice`] for counts `cuda:all` cannot meet.
pub(crate) fn plan(
    device: &str,
    local: usize,
    in_process: usize,
    others: usize,
    gpus: impl FnOnce() -> Result<u32, CudaError>,
) -> Result<Plan, ClusterError> {
    let spec: ChipSpec = device
        .parse()
        .map_err(|source| ClusterError::Device { source })?;
    let same = |n: usize| vec![device.to_owned(); n];
    let cuda = match spec {
        ChipSpec::Cuda(cuda)
            if local + in_process > 0 || (cuda.ordinal == CudaOrdinal::All && others == 0) =>
        {
            cuda
        }
        _ => {
            return Ok(Plan {
                local: same(local),
                in_process: same(in_process),
            });
        }
    };
    let count = gpus().map_err(|e| ClusterError::Device { source: e.into() })?;
    match cuda.ordinal {
        CudaOrdinal::Index(ordinal) => {
            if ordinal >= count {
                return Err(ClusterError::Device {
                    source: CudaError::NoDevice { ordinal, count }.into(),
                });
            }
            Ok(Plan {
                local: same(local),
                in_process: same(in_process),
            })
        }
        CudaOrdinal::All => {
            if count == 0 {
                return Err(ClusterError::Device {
                    source: CudaError::NoDevice { ordinal: 0, count }.into(),
                });
            }
            if local > 0 && in_process > 0 {
                return Err(ClusterError::GpusTwice { local, in_process });
            }
            let per_gpu: Vec<String> = (0..count).map(|i| cuda.for_device(i).to_string()).collect();
            let fits = |n: usize, kind: &'static str| {
                if n == 0 || u32::try_from(n) == Ok(count) {
                    Ok(())
                } else {
                    Err(ClusterError::GpuCount {
                        asked: n,
                        kind,
                        gpus: count,
                    })
                }
            };
            fits(local, "local")?;
            fits(in_process, "in-process")?;
            Ok(if in_process > 0 {
                Plan {
                    local: Vec::new(),
                    in_process: per_gpu,
                }
            } else {
                Plan {
                    local: per_gpu,
                    in_process: Vec::new(),
                }
            })
        }
    }
}

/// The chip spec of each of `n` workers started with `device`, for a
/// driver that starts workers itself: `device` `n` times, or for
/// `cuda:all` one `cuda:i` per GPU (`n` 0 or the GPU count). What
/// [`crate::ClusterBuilder::start`] does for its local workers, for
/// callers that need the number first.
///
/// # Errors
/// As [`crate::ClusterBuilder::start`] for the device: a bad spec, no
/// CUDA driver or GPU, a count `cuda:all` cannot meet.
pub fn worker_chips(device: &str, n: usize) -> Result<Vec<String>, ClusterError> {
    Ok(plan(device, n, 0, 0, strata_chip_runtime::cuda::device_count)?.local)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(n: u32) -> impl FnOnce() -> Result<u32, CudaError> {
        move || Ok(n)
    }

    fn no_driver() -> Result<u32, CudaError> {
        Err(CudaError::NoDriver {
            lib: "libcuda.so.1".into(),
        })
    }

    #[test]
    fn a_sim_spec_is_given_to_every_worker_and_asks_no_driver() {
        let p = plan("sim:mem=1MiB", 2, 1, 0, || panic!("asked for GPUs")).unwrap();
        assert_eq!(p.local, vec!["sim:mem=1MiB"; 2]);
        assert_eq!(p.in_process, vec!["sim:mem=1MiB"]);
        let e = plan("gpu", 1, 0, 0, || panic!("asked")).unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown device kind \"gpu\" (known: sim, cuda)"),
            "{e}"
        );
    }

    #[test]
    fn cuda_all_starts_one_local_worker_per_gpu_with_the_same_keys() {
        let p = plan("cuda:all,mem=2GiB,streams=2", 0, 0, 0, gpus(3)).unwrap();
        assert_eq!(
            p.local,
            [0, 1, 2]
                .map(|i| format!("cuda:{i},mem=2GiB,streams=2,prefetch=on"))
                .to_vec()
        );
        assert!(p.in_process.is_empty());
        // Asking for exactly as many is the same.
        assert_eq!(
            plan("cuda:all,mem=2GiB,streams=2", 3, 0, 0, gpus(3)).unwrap(),
            p
        );
        // In-process workers take the GPUs instead.
        let q = plan("cuda:all", 0, 2, 0, gpus(2)).unwrap();
        assert!(q.local.is_empty());
        assert_eq!(
            q.in_process,
            [
                "cuda:0,streams=4,prefetch=on",
                "cuda:1,streams=4,prefetch=on"
            ]
        );
    }

    #[test]
    fn cuda_all_refuses_a_count_that_is_not_the_gpus() {
        let e = plan("cuda:all", 4, 0, 0, gpus(2)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cuda:all starts one worker per GPU: 4 local workers were asked for and the CUDA driver sees 2 GPUs (ask for 2, or leave the number out)"
        );
        let e = plan("cuda:all", 0, 1, 0, gpus(2)).unwrap_err();
        assert!(
            matches!(
                e,
                ClusterError::GpuCount {
                    asked: 1,
                    kind: "in-process",
                    gpus: 2
                }
            ),
            "{e}"
        );
        let e = plan("cuda:all", 2, 2, 0, gpus(2)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cuda:all gives each GPU one worker: 2 local and 2 in-process workers were asked for; ask for one kind"
        );
        let e = plan("cuda:all", 0, 0, 0, gpus(0)).unwrap_err();
        assert!(
            e.to_string()
                .contains("no CUDA device 0: the driver sees 0"),
            "{e}"
        );
    }

    #[test]
    fn without_a_driver_a_cuda_spec_fails_naming_the_library() {
        for (spec, local, in_process) in [("cuda:all", 0, 0), ("cuda:0", 2, 0), ("cuda:1", 0, 1)] {
            let e = plan(spec, local, in_process, 0, no_driver).unwrap_err();
            assert!(
                matches!(
                    &e,
                    ClusterError::Device {
                        source: strata_chip_runtime::Error::Cuda(CudaError::NoDriver { .. })
                    }
                ),
                "{spec}: {e}"
            );
            assert!(e.to_string().contains("libcuda.so.1"), "{spec}: {e}");
        }
        // cuda:all beside other workers, with no number asked for, starts
        // nothing and asks nothing; so does cuda:N with no worker to start.
        assert_eq!(
            plan("cuda:all", 0, 0, 2, || panic!("asked")).unwrap(),
            Plan {
                local: Vec::new(),
                in_process: Vec::new()
            }
        );
        assert_eq!(
            plan("cuda:0", 0, 0, 0, || panic!("asked")).unwrap(),
            Plan {
                local: Vec::new(),
                in_process: Vec::new()
            }
        );
    }

    #[test]
    fn cuda_n_must_be_a_gpu_the_driver_sees() {
        let e = plan("cuda:2", 1, 0, 0, gpus(2)).unwrap_err();
        assert!(
            e.to_string()
                .contains("no CUDA device 2: the driver sees 2 device(s)"),
            "{e}"
        );
        let p = plan("cuda:1,mem=1GiB", 2, 0, 0, gpus(2)).unwrap();
        assert_eq!(p.local, vec!["cuda:1,mem=1GiB"; 2]);
    }
}
