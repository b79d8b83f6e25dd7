//! The one error type of `strata-chip`.

use crate::arena::Region;
use crate::kernel::KernelHandle;

/// What went wrong on a device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A region of device memory cannot satisfy an allocation.
    #[error(
        "out of device memory in the {region} region: asked {asked} bytes, {free} bytes free (largest free block {largest} bytes)"
    )]
    OutOfMemory {
        /// The region asked.
        region: Region,
        /// Bytes asked for.
        asked: u64,
        /// Bytes free in the region.
        free: u64,
        /// The largest block the region could hand out.
        largest: u64,
    },
    /// A region holds as many live blocks as it can track.
    #[error("the {region} region already holds its maximum of {max} live blocks")]
    TooManyBlocks {
        /// The region.
        region: Region,
        /// Its block limit.
        max: u64,
    },
    /// A free, copy or argument names a device address that is not a live
    /// block (never allocated, or already freed).
    #[error("no live device block at {addr:#x} in the {region} region")]
    UnknownBlock {
        /// The region searched.
        region: Region,
        /// The address given.
        addr: u64,
    },
    /// A task asked for bytes at one version while the chip holds them
    /// dirty at another: its caller did not have them written back first,
    /// and using either would lose bytes.
    #[error(
        "the chip holds bytes {footprint} of buffer {buffer} dirty at version {held} and a task asks for version {asked}: the dirty bytes must be written back (flushed) first"
    )]
    CacheConflict {
        /// The buffer.
        buffer: strata_wire::CanonicalIdentity,
        /// The byte range of the copy.
        footprint: String,
        /// The version the chip holds.
        held: u64,
        /// The version asked for.
        asked: u64,
    },
    /// A task's driver left the bytes of an argument out because the chip
    /// held them, and it no longer does (evicted, replaced, or never
    /// there): the task did not run, and the driver sends it again with
    /// the bytes.
    #[error(
        "bytes {footprint} of buffer {buffer} were left out of the task as held at version {version}, but {why}: send them"
    )]
    NotHeld {
        /// The buffer.
        buffer: strata_wire::CanonicalIdentity,
        /// The byte range of the bytes.
        footprint: String,
        /// The version asked for.
        version: u64,
        /// What the chip holds instead.
        why: String,
    },
    /// A run-region block was used after its run ended: the run region was
    /// reset, so its bytes may belong to another run's blocks now.
    #[error(
        "run-region block at {addr:#x} belonged to run {run}, which has ended (the run region was reset; the device is in run {current}): allocate it again in the current run"
    )]
    RunEnded {
        /// Address of the block (a device address from the device, an
        /// offset into device memory from the arena).
        addr: u64,
        /// The run it was carved from.
        run: u32,
        /// The device's current run.
        current: u32,
    },
    /// A copy or view reaches outside device memory or its block.
    #[error("device range {addr:#x}+{len} is outside {what}")]
    OutOfRange {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
        /// What it should have been inside.
        what: &'static str,
    },
    /// The device spec string is malformed.
    #[error("invalid device spec {spec:?}: {reason}")]
    Spec {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The device memory could not be mapped.
    #[error("cannot map {bytes} bytes of device memory: {reason}")]
    Map {
        /// Size asked.
        bytes: u64,
        /// The OS error.
        reason: String,
    },
    /// A kernel argument does not fit the kernel's signature, its backing, or
    /// the other arguments.
    #[error("kernel {kernel}: argument {index} ({name}): {reason}")]
    Argument {
        /// `name@version` of the kernel.
        kernel: String,
        /// Position of the argument.
        index: usize,
        /// Name of the argument in the signature (or `?` past its end).
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A kernel argument has a dtype the chip does not compute on (its
    /// spec's `dtypes`).
    #[error(
        "kernel {kernel}: argument {index}: this chip does not support dtype {dtype} (it supports {supported})"
    )]
    UnsupportedDType {
        /// `name@version` of the kernel.
        kernel: String,
        /// Position of the argument.
        index: usize,
        /// Its dtype.
        dtype: strata_wire::DType,
        /// The chip's dtypes.
        supported: strata_boundary::DTypeSet,
    },
    /// The scalars do not fit the kernel's signature.
    #[error("kernel {kernel}: scalars: {reason}")]
    Scalars {
        /// `name@version` of the kernel.
        kernel: String,
        /// What is wrong.
        reason: String,
    },
    /// No kernel is registered under a handle.
    #[error("no kernel registered with handle {0}")]
    UnknownKernel(KernelHandle),
    /// A kernel with the same name and version but another signature is
    /// already registered.
    #[error("kernel {0} is already registered with a different signature")]
    ConflictingKernel(String),
    /// The kernel returned an error.
    #[error("kernel {kernel} failed: {reason}")]
    KernelFailed {
        /// `name@version` of the kernel.
        kernel: String,
        /// The kernel's message.
        reason: String,
    },
    /// The kernel panicked; the device caught it and keeps working.
    #[error("kernel {kernel} panicked: {message}")]
    KernelPanicked {
        /// `name@version` of the kernel.
        kernel: String,
        /// The panic message.
        message: String,
    },
    /// A queued launch was not started because its [`StartGate`] was
    /// closed (a worker closes it when the session ends).
    ///
    /// [`StartGate`]: crate::device::StartGate
    #[error("not started: {reason}")]
    NotStarted {
        /// Why the gate was closed.
        reason: String,
    },
    /// The device is shutting down and takes no more work.
    #[error("the device is shut down")]
    ShutDown,
    /// Device memory that cannot be shared as asked: a chip that cannot
    /// export it, a block that is not a shared one, memory from another
    /// process that does not check out.
    #[error("shared device memory: {reason}")]
    Shared {
        /// What is wrong.
        reason: String,
    },
    /// A wire-format rule was broken while materializing an argument.
    #[error(transparent)]
    Wire(#[from] strata_wire::Error),
    /// A CUDA chip could not be opened or used: what was missing or what
    /// failed, by name.
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// Why a CUDA chip could not be opened or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The driver library could not be loaded: no NVIDIA driver, or it is
    /// not on the loader's path.
    #[error(
        "no CUDA driver: {lib} could not be loaded (is the NVIDIA driver installed and its library on the loader path, LD_LIBRARY_PATH?)"
    )]
    NoDriver {
        /// The library looked for.
        lib: String,
    },
    /// A CUDA library the chip needs could not be loaded.
    #[error(
        "CUDA library {lib} ({purpose}) could not be loaded: put the directory holding it on LD_LIBRARY_PATH"
    )]
    LibraryMissing {
        /// The library looked for.
        lib: String,
        /// What the chip needs it for.
        purpose: &'static str,
    },
    /// The driver is there but the device is not.
    #[error("no CUDA device {ordinal}: the driver sees {count} device(s)")]
    NoDevice {
        /// The device asked for.
        ordinal: u32,
        /// The devices there are.
        count: u32,
    },
    /// Device memory ran out in the driver (not in the chip's own
    /// regions, which say [`Error::OutOfMemory`]).
    #[error(
        "out of device memory on CUDA device {ordinal}: {call} asked for {asked} bytes ({free} bytes free)"
    )]
    OutOfMemory {
        /// The device.
        ordinal: u32,
        /// The call that failed.
        call: &'static str,
        /// Bytes asked for.
        asked: u64,
        /// Bytes the driver said were free.
        free: u64,
    },
    /// A sticky error: the device's context is unusable (an illegal
    /// address, a kernel that trapped). Every launch in flight on it fails
    /// with this; the chip must be rebuilt.
    #[error(
        "the CUDA context of device {ordinal} is lost: {call} returned {name} ({code}); every launch in flight on it failed and none of their writes is kept"
    )]
    ContextLost {
        /// The device.
        ordinal: u32,
        /// The call that reported it.
        call: &'static str,
        /// The driver's error name (`CUDA_ERROR_ILLEGAL_ADDRESS`).
        name: String,
        /// Its code.
        code: u32,
    },
    /// Another failed driver or library call.
    #[error("{call} on CUDA device {ordinal} failed: {name} ({code})")]
    Call {
        /// The device.
        ordinal: u32,
        /// The call.
        call: &'static str,
        /// The error's name.
        name: String,
        /// Its code.
        code: u32,
    },
    /// NVRTC refused a kernel's source.
    #[error("kernel {kernel}: its CUDA source does not compile: {log}")]
    Compile {
        /// The kernel (`name@version`).
        kernel: String,
        /// NVRTC's log.
        log: String,
    },
    /// A launch of a kernel that has no CUDA body.
    #[error(
        "kernel {kernel} has no CUDA body (it runs on CPU chips only): register one to run it on a CUDA chip"
    )]
    NoBody {
        /// The kernel (`name@version`).
        kernel: String,
    },
}

impl Error {
    /// What kind of task failure this error is, when a task's launch ends
    /// with it: the kernel's own errors are [`FailureKind::Kernel`]; an
    /// argument that does not fit (its view, backing, signature or
    /// scalars) is [`FailureKind::ImportRefused`]; a launch that was not
    /// started or an unknown kernel is [`FailureKind::Refused`]; the rest
    /// is the chip's ([`FailureKind::Device`]), but for a dtype the chip
    /// does not support ([`FailureKind::Unsupported`]).
    ///
    /// [`FailureKind::Kernel`]: strata_boundary::FailureKind::Kernel
    /// [`FailureKind::ImportRefused`]: strata_boundary::FailureKind::ImportRefused
    /// [`FailureKind::Refused`]: strata_boundary::FailureKind::Refused
    /// [`FailureKind::Device`]: strata_boundary::FailureKind::Device
    /// [`FailureKind::Unsupported`]: strata_boundary::FailureKind::Unsupported
    pub fn failure_kind(&self) -> strata_boundary::FailureKind {
        use strata_boundary::FailureKind;
        match self {
            Error::KernelFailed { .. } | Error::KernelPanicked { .. } => FailureKind::Kernel,
            Error::Argument { .. } | Error::Scalars { .. } | Error::Wire(_) => {
                FailureKind::ImportRefused
            }
            Error::UnsupportedDType { .. } | Error::Cuda(CudaError::NoBody { .. }) => {
                FailureKind::Unsupported
            }
            Error::Cuda(CudaError::Compile { .. }) => FailureKind::Kernel,
            Error::Cuda(_) => FailureKind::Device,
            Error::UnknownKernel(_)
            | Error::ConflictingKernel(_)
            | Error::NotStarted { .. }
            | Error::ShutDown => FailureKind::Refused,
            Error::OutOfMemory { .. }
            | Error::TooManyBlocks { .. }
            | Error::UnknownBlock { .. }
            | Error::CacheConflict { .. }
            | Error::NotHeld { .. }
            | Error::RunEnded { .. }
            | Error::OutOfRange { .. }
            | Error::Spec { .. }
            | Error::Map { .. }
            | Error::Shared { .. } => FailureKind::Device,
        }
    }
}
