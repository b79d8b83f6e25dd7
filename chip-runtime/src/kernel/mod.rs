//! Kernels: what a callable is (name, version, argument signature), its
//! handle, the context it runs in, and the registry of built-ins.
//!
//! A kernel's identity is its canonical descriptor string, for example
//! `add@1(a:R:F32|F64|F16|BF16|I8|I16|I32|I64|U8|U16|U32|U64:*,b:R:=0:=0,out:W:=0:=0;)`
//! (argument `name:access:dtypes:rank`, then `;` and the scalars `name:kind`);
//! its [`KernelHandle`] is the first 16 bytes of that string's SHA-256, so
//! two processes that agree on the descriptor agree on the handle, and a
//! change of signature is a change of handle.

mod context;
pub mod element;
mod registry;
mod validate;
pub mod view;

#[cfg(target_arch = "x86_64")]
mod blocked;
pub mod builtin;
pub(crate) mod dense;

use sha2::{Digest, Sha256};
use strata_wire::{Access, DType, Tensor};

pub use context::{KernelContext, Materialized};
pub use element::{Element, Pod};
pub use registry::Registry;
pub(crate) use validate::validate_launch;

/// Checks a launch of `kernel` on these arguments and scalars exactly as a
/// device does before running it (argument count, dtypes, ranks, tags,
/// grants, scalar count, the kernel's own shape rules, written arguments
/// sharing bytes), without running anything: for tools that check a job
/// before starting it.
///
/// # Errors
/// The device's refusal, naming the argument.
pub fn check_launch(
    kernel: &dyn Kernel,
    args: &[(strata_wire::Tensor, strata_wire::ArgTag)],
    scalars: &[u64],
) -> Result<(), crate::Error> {
    validate_launch(kernel, args, scalars)
}
pub use strata_wire::KernelHandle;
pub use view::{Geometry, Scratch, View, ViewMut};

/// Which dtypes an argument accepts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DTypes {
    /// Any dtype.
    Any,
    /// One of these.
    OneOf(Vec<DType>),
    /// The same dtype as argument `i`.
    SameAs(usize),
}

/// Which ranks an argument accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rank {
    /// Any rank from 1 to 5.
    Any,
    /// Exactly this rank.
    Exactly(usize),
    /// At least this rank.
    AtLeast(usize),
    /// The same rank as argument `i`.
    SameAs(usize),
}

/// How a kernel uses one tensor argument.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArgSpec {
    /// Name, for error messages and the descriptor.
    pub name: String,
    /// Whether the kernel reads the view, writes every element of it, or
    /// both. It decides staging: READ is copied in, WRITE copied out,
    /// READWRITE both.
    pub access: Access,
    /// Accepted dtypes.
    pub dtypes: DTypes,
    /// Accepted ranks.
    pub rank: Rank,
}

impl ArgSpec {
    /// A spec.
    pub fn new(name: &str, access: Access, dtypes: DTypes, rank: Rank) -> Self {
        ArgSpec {
            name: name.to_owned(),
            access,
            dtypes,
            rank,
        }
    }
}

/// How a kernel reads one scalar argument (each scalar is 64 bits on the
/// wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarKind {
    /// An unsigned integer.
    U64,
    /// A signed integer, two's complement.
    I64,
    /// An IEEE double, by its bits.
    F64,
    /// Interpreted in the dtype of an argument: f64 bits for float dtypes,
    /// the integer itself for integer dtypes.
    LikeArg(usize),
}

/// One scalar argument.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScalarSpec {
    /// Name.
    pub name: String,
    /// Interpretation.
    pub kind: ScalarKind,
}

/// Everything that identifies a callable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelDescriptor {
    /// Dotted name, such as `strata.matmul`.
    pub name: String,
    /// Version; a change of behaviour is a new version.
    pub version: u32,
    /// Tensor arguments, in order.
    pub args: Vec<ArgSpec>,
    /// Scalar arguments, in order.
    pub scalars: Vec<ScalarSpec>,
}

impl KernelDescriptor {
    /// `name@version`.
    pub fn qualified_name(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    /// The canonical string the handle is a digest of.
    pub fn canonical(&self) -> String {
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| {
                let access = match a.access {
                    Access::Read => "R",
                    Access::Write => "W",
                    Access::ReadWrite => "RW",
                };
                let dtypes = match &a.dtypes {
                    DTypes::Any => "*".to_owned(),
                    DTypes::OneOf(list) => {
                        list.iter().map(|d| d.name()).collect::<Vec<_>>().join("|")
                    }
                    DTypes::SameAs(i) => format!("={i}"),
                };
                let rank = match a.rank {
                    Rank::Any => "*".to_owned(),
                    Rank::Exactly(n) => n.to_string(),
                    Rank::AtLeast(n) => format!(">={n}"),
                    Rank::SameAs(i) => format!("={i}"),
                };
                format!("{}:{access}:{dtypes}:{rank}", a.name)
            })
            .collect();
        let scalars: Vec<String> = self
            .scalars
            .iter()
            .map(|s| {
                let kind = match s.kind {
                    ScalarKind::U64 => "u64".to_owned(),
                    ScalarKind::I64 => "i64".to_owned(),
                    ScalarKind::F64 => "f64".to_owned(),
                    ScalarKind::LikeArg(i) => format!("like{i}"),
                };
                format!("{}:{kind}", s.name)
            })
            .collect();
        format!(
            "{}({};{})",
            self.qualified_name(),
            args.join(","),
            scalars.join(",")
        )
    }

    /// The digest of [`KernelDescriptor::canonical`].
    pub fn handle(&self) -> KernelHandle {
        let digest = Sha256::digest(self.canonical().as_bytes());
        let mut h = [0u8; 16];
        h.copy_from_slice(&digest[..16]);
        KernelHandle(h)
    }
}

/// A callable that runs on a chip.
///
/// Implement it to add kernels to a worker binary: describe the signature in
/// [`Kernel::descriptor`], add shape rules in [`Kernel::check`], and compute
/// in [`Kernel::run`] through the typed views of the [`KernelContext`].
pub trait Kernel: Send + Sync + 'static {
    /// Name, version and signature.
    fn descriptor(&self) -> &KernelDescriptor;

    /// Rules beyond the signature (shapes that must agree, and so on),
    /// checked before anything runs. On failure, the index of the argument
    /// at fault and why.
    ///
    /// # Errors
    /// `(argument index, reason)`.
    fn check(&self, _args: &[Tensor], _scalars: &[u64]) -> Result<(), (usize, String)> {
        Ok(())
    }

    /// Does the work. Panics are caught by the device and reported as a
    /// task failure.
    ///
    /// # Errors
    /// A message, reported as the task's failure cause.
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String>;

    /// The floating-point operations a run on these arguments costs, if the
    /// kernel can say: a chip in timing mode (`sim:timing=on`) takes that
    /// many flops at its modelled rate instead of running it. `None`: it
    /// takes the time of moving the bytes its arguments span.
    fn flops(&self, _args: &[Tensor]) -> Option<u64> {
        None
    }
}
