//! A graph's tasks checked before anything starts: the submit-time
//! checks of the DAG on the graph alone, then (given the callables'
//! signatures) argument counts, tags, scalars and every launch.

use strata_chip_runtime::kernel::{ScalarKind, Signature};
use strata_orchestrator_core::dag::{Arg, NewTask};
use strata_orchestrator_core::{Dag, TaskId};
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, DType, IdentityMint, Tensor,
};

use super::fields::join;
use super::{Graph, GraphError, ScalarDef, TaskDef, err};

impl Graph {
    /// The submit-time checks of every task (grants, arguments of a task
    /// sharing bytes where one is written, limits) — the same
    /// [`Dag::check`] a cluster runs when the task is submitted, on
    /// stand-in buffers — so a bad task is named before anything starts.
    pub(super) fn dry_run(&self) -> Result<(), GraphError> {
        let probe = Probe::new(self);
        for (i, t) in self.tasks.iter().enumerate() {
            let args = t
                .args
                .iter()
                .map(|&(v, tag)| {
                    probe
                        .tensor(self, v)
                        .map(|tensor| Arg { tensor, tag })
                        .map_err(|what| GraphError {
                            path: t.path.clone(),
                            what,
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut device: Option<(usize, u32)> = None;
            for (ai, &(v, _)) in t.args.iter().enumerate() {
                if let Some(w) = self.buffers[self.views[v].buffer].device {
                    match (device, t.worker) {
                        (Some((aj, d)), _) if d != w => {
                            return err(
                                format!("{}.args[{ai}].view", t.path),
                                format!(
                                    "in worker {w}'s device memory, but argument {aj} is in worker {d}'s: a task runs on one worker"
                                ),
                            );
                        }
                        (_, Some(p)) if p != w => {
                            return err(
                                format!("{}.worker", t.path),
                                format!(
                                    "worker {p}, but argument {ai} is in worker {w}'s device memory"
                                ),
                            );
                        }
                        _ => device = Some((ai, w)),
                    }
                }
            }
            let task = NewTask {
                id: TaskId(i as u64 + 1),
                members: vec![args],
                scalars: vec![t.scalars.len()],
                after: t.after.iter().map(|&j| TaskId(j as u64 + 1)).collect(),
            };
            Dag::check(task).map_err(|e| GraphError {
                path: t.path.clone(),
                what: e.reason.to_string(),
            })?;
        }
        Ok(())
    }

    /// Checks every task against the callables' descriptors (`lookup`
    /// gives the descriptor of a callable as the task names it) and
    /// every worker index against `workers`.
    ///
    /// # Errors
    /// The first problem, with its JSON path.
    pub fn check_callables(
        &self,
        workers: usize,
        lookup: &dyn Fn(&str) -> Result<Callable, String>,
    ) -> Result<(), GraphError> {
        let probe = Probe::new(self);
        for b in &self.buffers {
            if let Some(w) = b.device {
                if w as usize >= workers {
                    return err(
                        format!("buffers.{}.device", b.name),
                        format!("worker {w} does not exist; there are {workers}"),
                    );
                }
            }
        }
        for t in &self.tasks {
            if let Some(w) = t.worker {
                if w as usize >= workers {
                    return err(
                        join(&t.path, "worker"),
                        format!("worker {w} does not exist; there are {workers}"),
                    );
                }
            }
            let sig = lookup(&t.callable).map_err(|what| GraphError {
                path: join(&t.path, "callable"),
                what,
            })?;
            let (kernel, sig) = (&sig.kernel, &sig.signature);
            if sig.args.len() != t.args.len() {
                return err(
                    join(&t.path, "args"),
                    format!(
                        "{} takes {} tensor arguments, got {}",
                        t.callable,
                        sig.args.len(),
                        t.args.len()
                    ),
                );
            }
            for (ai, (&(_, tag), spec)) in t.args.iter().zip(&sig.args).enumerate() {
                let access = &spec.access;
                let fits = match access {
                    Access::Read => matches!(tag, ArgTag::Input | ArgTag::NoDep),
                    Access::Write => {
                        matches!(tag, ArgTag::Output | ArgTag::OutputExisting | ArgTag::NoDep)
                    }
                    Access::ReadWrite => matches!(tag, ArgTag::InOut | ArgTag::NoDep),
                };
                if !fits {
                    let want = match access {
                        Access::Read => "input",
                        Access::Write => "output or output_existing",
                        Access::ReadWrite => "inout",
                    };
                    return err(
                        format!("{}.args[{ai}].tag", t.path),
                        format!(
                            "{} {} this argument: tag it {want}, not {}",
                            t.callable,
                            match access {
                                Access::Read => "reads",
                                Access::Write => "writes",
                                Access::ReadWrite => "reads and writes",
                            },
                            tag.name().to_ascii_lowercase()
                        ),
                    );
                }
            }
            if sig.scalars.len() != t.scalars.len() {
                return err(
                    join(&t.path, "scalars"),
                    format!(
                        "{} takes {} scalars, got {}",
                        t.callable,
                        sig.scalars.len(),
                        t.scalars.len()
                    ),
                );
            }
            let mut bits = Vec::with_capacity(t.scalars.len());
            for (si, (s, k)) in t.scalars.iter().zip(&sig.scalars).enumerate() {
                bits.push(
                    self.encode_scalar(t, s, k.kind)
                        .map_err(|what| GraphError {
                            path: format!("{}.scalars[{si}]", t.path),
                            what,
                        })?,
                );
            }
            if let Some(kernel) = kernel {
                let args = t
                    .args
                    .iter()
                    .map(|&(v, tag)| probe.tensor(self, v).map(|tensor| (tensor, tag)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|what| GraphError {
                        path: join(&t.path, "args"),
                        what,
                    })?;
                strata_chip_runtime::kernel::check_launch(kernel.as_ref(), &args, &bits).map_err(
                    |e| GraphError {
                        path: t.path.clone(),
                        what: e.to_string(),
                    },
                )?;
            }
        }
        Ok(())
    }

    pub(super) fn encode_scalar(
        &self,
        t: &TaskDef,
        s: &ScalarDef,
        kind: ScalarKind,
    ) -> Result<u64, String> {
        let n = match s {
            ScalarDef::U64(v) => return Ok(*v),
            ScalarDef::I64(v) => return Ok(*v as u64),
            ScalarDef::F64(v) => return Ok(v.to_bits()),
            ScalarDef::Number(n) => n,
        };
        let as_int = |n: &serde_json::Number| {
            n.as_u64()
                .or_else(|| n.as_i64().map(|v| v as u64))
                .ok_or_else(|| format!("{n} is not a whole number"))
        };
        match kind {
            ScalarKind::U64 => n
                .as_u64()
                .ok_or_else(|| format!("{n} is not a whole number ≥ 0")),
            ScalarKind::I64 => as_int(n),
            ScalarKind::F64 => n
                .as_f64()
                .map(f64::to_bits)
                .ok_or_else(|| format!("{n} is not a number")),
            ScalarKind::LikeArg(i) => {
                let dtype = t
                    .args
                    .get(i)
                    .map(|&(v, _)| self.views[v].dtype)
                    .ok_or_else(|| {
                        format!("typed like argument {i}, which the task does not have")
                    })?;
                // Float and complex arguments take a float (complex ones
                // a real value: a scalar is one 64-bit word).
                if matches!(
                    dtype,
                    DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::C64 | DType::C128
                ) {
                    n.as_f64()
                        .map(f64::to_bits)
                        .ok_or_else(|| format!("{n} is not a number"))
                } else {
                    as_int(n).map_err(|e| format!("{e} (argument {i} is {})", dtype.name()))
                }
            }
        }
    }
}

/// What a task must match of its callable: its signature, and the kernel
/// itself when it is known here (the built-ins of local workers), so that
/// every launch is checked before anything starts, shapes included.
#[derive(Clone)]
pub struct Callable {
    /// The callable's signature.
    pub signature: Signature,
    /// The kernel, when this process has it.
    pub kernel: Option<std::sync::Arc<dyn strata_chip_runtime::Kernel>>,
}

impl std::fmt::Debug for Callable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callable")
            .field("signature", &self.signature.canonical())
            .field("kernel", &self.kernel.is_some())
            .finish()
    }
}

impl Callable {
    /// From a signature alone.
    pub fn of(signature: &Signature) -> Self {
        Callable {
            signature: signature.clone(),
            kernel: None,
        }
    }

    /// From a kernel, whose launches can then be checked here.
    pub fn of_kernel(k: std::sync::Arc<dyn strata_chip_runtime::Kernel>) -> Self {
        Callable {
            signature: k.descriptor().clone(),
            kernel: Some(k),
        }
    }
}

/// Stand-in descriptors for checking views and tasks before any buffer
/// exists.
pub(super) struct Probe {
    descs: Vec<BufferDescriptor>,
}

impl Probe {
    pub(super) fn new(g: &Graph) -> Self {
        let mint = IdentityMint::new(*b"graphchk");
        let descs = g
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let backing = if b.device.is_some() {
                    Backing::DeviceMalloc {
                        addr: std::num::NonZeroU64::MIN,
                    }
                } else {
                    Backing::Memfd {
                        st_dev: 0,
                        st_ino: i as u64,
                    }
                };
                let space = if b.device.is_some() {
                    AddressSpace::Device
                } else {
                    AddressSpace::Host
                };
                BufferDescriptor::new(
                    mint.mint().expect("identity"),
                    b.nbytes,
                    space,
                    b.access,
                    backing,
                )
                .expect("a valid descriptor")
            })
            .collect();
        Probe { descs }
    }

    pub(super) fn tensor(&self, g: &Graph, v: usize) -> Result<Tensor, String> {
        let view = &g.views[v];
        Tensor::new(
            self.descs[view.buffer],
            view.byte_offset,
            &view.shape,
            &view.strides,
            view.dtype,
        )
        .map_err(|e| e.to_string())
    }
}
