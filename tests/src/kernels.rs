//! User kernels of `strata-test-worker`, built the way users build theirs.
//!
//! - `test.panic`: panics on purpose.
//! - `test.sleep`: sleeps for its scalar's milliseconds.
//! - `test.spin`: busy-loops for its scalar's milliseconds (for ever if
//!   they overflow the clock), never yielding or looking at anything else.
//!
//!   `test.sleep`, `test.slow*` and `test.spin` create the file
//!   `$STRATA_TEST_STARTED/<kernel>.<worker pid>` when they start, if that
//!   variable names a folder: a test's sign that they run.
//! - `test.abort`: says so on stderr and aborts the whole worker process
//!   (a crash, not a task failure).
//! - `test.slow`: sleeps for its scalar's milliseconds with one view it
//!   writes (OUTPUT), `test.slow.x` the same with a view it reads and
//!   writes (INOUT): long tasks for the retry policy's tests.
//! - `test.touch`: takes one view it reads and does nothing (the cost of
//!   dispatching a view, whatever its size).
//! - `test.scratch`: takes a scratch block of scalar 0 bytes, fails if any
//!   of it is not zero (an earlier kernel's bytes) when scalar 2 is not 0,
//!   then fills it with the 8 bytes of scalar 1 repeated and leaves them
//!   for the next kernel.
//! - `test.mark`: takes one rank-1 U64 view it writes (OUTPUT) and sets
//!   its first and last elements to its scalar (the cost of a view's
//!   bytes coming back, whatever its size).
//! - `test.hash.<p>` for every access pattern `p` of 1 to 4 arguments
//!   (`r` read, `w` write, `x` read-write): the differential test's
//!   callable, computing exactly what `strata_orchestrator_core::sim::compute` computes
//!   (a hash of the task id in scalar 0 and of every element read, in
//!   argument then row-major order, written to every element of every
//!   written view), on real workers.
//! - `test.partial.<p>` for the same patterns: as `test.hash.<p>`, but a
//!   written argument whose bit is set in scalar 2 gets only a seeded
//!   random subset of its elements (those [`partially_writes`] picks with
//!   the salt in scalar 1) and keeps the rest: the partial writers of the
//!   isolation tests (`OUTPUT_EXISTING`, `INOUT`).
//! - `test.tile.x`, `test.tile.rx`, `test.tile.rrx`: one step of the
//!   benchmark's stencil on rank-1 U64 tiles of f64 bits (the neighbours read, then
//!   the own tile read and written), the same update as the StarPU peer's
//!   (`bench/starpu/starpu_bench.c`, `tile_update`), so that the two
//!   stencils compare runtimes and not kernels: see [`tile_update`].
//! - `test.cuda_fault`: a CUDA source only (no CPU body) that writes
//!   through a bad address before it writes element 0 of its F32 view:
//!   the fault that loses a GPU's context.

use std::sync::Arc;

use strata_chip_runtime::kernel::cuda::{Entry, Grid, SourceKernel};
use strata_chip_runtime::kernel::{ArgSpec, DTypes, Rank, ScalarKind, ScalarSpec, Signature};
use strata_chip_runtime::{Kernel, KernelContext, Registry};
use strata_wire::{Access, ArgTag, DType};

struct Panic(Signature);

impl Kernel for Panic {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, _: &mut KernelContext<'_>) -> Result<(), String> {
        panic!("test.panic was asked to panic");
    }
}

struct Sleep(Signature);

impl Kernel for Sleep {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        mark_started(&self.0.name);
        std::thread::sleep(std::time::Duration::from_millis(ctx.scalar(0)?));
        Ok(())
    }
}

struct Spin(Signature);

impl Kernel for Spin {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        mark_started(&self.0.name);
        let end =
            std::time::Instant::now().checked_add(std::time::Duration::from_millis(ctx.scalar(0)?));
        while end.is_none_or(|end| std::time::Instant::now() < end) {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// Says that `kernel` started, in `$STRATA_TEST_STARTED` (when set).
fn mark_started(kernel: &str) {
    if let Some(dir) = std::env::var_os("STRATA_TEST_STARTED") {
        let file = std::path::Path::new(&dir).join(format!("{kernel}.{}", std::process::id()));
        let _ = std::fs::write(file, "");
    }
}

struct Abort(Signature);

impl Kernel for Abort {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, _: &mut KernelContext<'_>) -> Result<(), String> {
        eprintln!("test.abort: aborting the worker process");
        std::process::abort();
    }
}

struct Touch(Signature);

impl Kernel for Touch {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, _: &mut KernelContext<'_>) -> Result<(), String> {
        Ok(())
    }
}

struct ScratchFill(Signature);

impl Kernel for ScratchFill {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        let n = usize::try_from(ctx.scalar(0)?).map_err(|e| e.to_string())?;
        let word = ctx.scalar(1)?.to_le_bytes();
        let mut s = ctx.scratch(n)?;
        let bytes = s.as_mut_slice::<u8>();
        let check = ctx.scalar(2)? != 0;
        if let Some(i) = bytes.iter().position(|&b| b != 0).filter(|_| check) {
            return Err(format!(
                "scratch byte {i} of {n} was {:#04x}, not zero: an earlier kernel's",
                bytes[i]
            ));
        }
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = word[i % 8];
        }
        Ok(())
    }
}

struct Mark(Signature);

impl Kernel for Mark {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        let value = ctx.scalar(0)?;
        let mut out = ctx.output::<u64>(0)?;
        let last = out.geometry().len() - 1;
        out.set(&[0], value);
        out.set(&[last], value);
        Ok(())
    }
}

struct Hash {
    desc: Signature,
    access: Vec<Access>,
    /// Slept after reading and before writing, so that a worker stopped
    /// mid-task writes late (the quarantine tests).
    delay: std::time::Duration,
    /// `test.partial.*`: scalars 1 and 2 pick the elements written.
    partial: bool,
}

/// FNV-1a step, as `strata_orchestrator_core::sim` hashes (shared with `strata-bench`'s
/// oracle).
pub fn fnv(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x0100_0000_01b3);
    }
}

impl Hash {
    /// Every element of argument `i` as its little-endian bytes, row-major.
    fn elements(ctx: &KernelContext<'_>, i: usize) -> Result<Vec<Vec<u8>>, String> {
        macro_rules! read {
            ($t:ty) => {{
                let v = ctx.input_raw::<$t>(i)?;
                (0..v.geometry().len())
                    .map(|e| v.at(e).to_le_bytes().to_vec())
                    .collect()
            }};
        }
        Ok(match ctx.arg(i)?.dtype().bits() {
            8 => read!(u8),
            16 => read!(u16),
            32 => read!(u32),
            64 => read!(u64),
            b => return Err(format!("argument {i}: {b}-bit elements are not supported")),
        })
    }

    fn write(
        ctx: &KernelContext<'_>,
        i: usize,
        h: u64,
        keep: Option<(u64, u64)>,
    ) -> Result<(), String> {
        macro_rules! write {
            ($t:ty) => {{
                let mut v = ctx.output_raw::<$t>(i)?;
                let g = *v.geometry();
                for k in 0..g.len() {
                    if let Some((salt, task)) = keep {
                        if !partially_writes(salt, task, i, k as u64) {
                            continue;
                        }
                    }
                    let mut x = h;
                    fnv(&mut x, &[i as u8]);
                    fnv(&mut x, &(k as u64).to_le_bytes());
                    let idx = g.unravel(k);
                    v.set(&idx[..g.ndims()], x as $t);
                }
            }};
        }
        match ctx.arg(i)?.dtype().bits() {
            8 => write!(u8),
            16 => write!(u16),
            32 => write!(u32),
            64 => write!(u64),
            b => return Err(format!("argument {i}: {b}-bit elements are not supported")),
        }
        Ok(())
    }
}

impl Kernel for Hash {
    fn descriptor(&self) -> &Signature {
        &self.desc
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        let mut h = 0xcbf2_9ce4_8422_2325u64 ^ ctx.scalar(0)?;
        for (i, a) in self.access.iter().enumerate() {
            if a.allows_read() {
                fnv(&mut h, &(i as u64).to_le_bytes());
                for e in Self::elements(ctx, i)? {
                    fnv(&mut h, &e);
                }
            }
        }
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        // A partial writer: scalar 1 salts the subset, bit i of scalar 2
        // says argument i is written partially.
        let (salt, mask) = if self.partial {
            (ctx.scalar(1)?, ctx.scalar(2)?)
        } else {
            (0, 0)
        };
        for (i, a) in self.access.iter().enumerate() {
            if a.allows_write() {
                let keep = (mask >> i & 1 == 1).then(|| (salt, ctx.scalar(0).unwrap_or(0)));
                Self::write(ctx, i, h, keep)?;
            }
        }
        Ok(())
    }
}

/// One stencil step of `own` from its existing neighbours (left before
/// right), as the StarPU peer computes it: elements 1.. diffuse
/// (`0.5 * own + 0.25 * sum of neighbours`), element 0 counts the
/// wavefront exactly (`max(own, neighbours) + 1`), so reading a
/// neighbour's old value instead of its new one always shows.
pub fn tile_update(own: &mut [f64], neighbours: &[&[f64]]) {
    let mut m = own[0];
    for n in neighbours {
        if n[0] > m {
            m = n[0];
        }
    }
    for j in 1..own.len() {
        let s = neighbours.iter().fold(0.0, |acc, n| acc + n[j]);
        own[j] = 0.5 * own[j] + 0.25 * s;
    }
    own[0] = m + 1.0;
}

/// `test.tile.*`: [`tile_update`] on the last argument (INOUT) from the
/// ones before it (INPUT), all rank-1 U64 views of one length holding
/// f64 bits (strata has no F64 dtype; the StarPU peer's tiles are 64
/// doubles, 512 bytes, and so are these).
struct Tile(Signature);

impl Kernel for Tile {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        let last = ctx.arg_count() - 1;
        let neighbours = (0..last)
            .map(|i| ctx.input::<u64>(i))
            .collect::<Result<Vec<_>, _>>()?;
        let mut own = ctx.output::<u64>(last)?;
        let n = own.geometry().len();
        if let Some(i) = neighbours.iter().position(|v| v.geometry().len() != n) {
            return Err(format!(
                "argument {i} has {} elements; the tile (argument {last}) has {n}",
                neighbours[i].geometry().len()
            ));
        }
        let get =
            |v: &strata_chip_runtime::kernel::View<'_, u64>, j: usize| f64::from_bits(v.get(&[j]));
        let mut m = f64::from_bits(own.get(&[0]));
        for v in &neighbours {
            let x = get(v, 0);
            if x > m {
                m = x;
            }
        }
        for j in 1..n {
            let s = neighbours.iter().fold(0.0, |acc, v| acc + get(v, j));
            let x = 0.5 * f64::from_bits(own.get(&[j])) + 0.25 * s;
            own.set(&[j], x.to_bits());
        }
        own.set(&[0], (m + 1.0).to_bits());
        Ok(())
    }
}

/// `test.late_fill(x; ms, value)`: sleeps `ms`, then writes `value` into
/// every element of the F32 view `x` — a task whose write lands late
/// when its worker was stopped and woken (the quarantine tests).
struct LateFill(Signature);

impl Kernel for LateFill {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        std::thread::sleep(std::time::Duration::from_millis(ctx.scalar(0)?));
        let value = ctx.scalar(1)? as f32;
        let mut v = ctx.output_raw::<u32>(0)?;
        let g = *v.geometry();
        for k in 0..g.len() {
            let idx = g.unravel(k);
            v.set(&idx[..g.ndims()], value.to_bits());
        }
        Ok(())
    }
}

/// The `test.hash.<p>` name for arguments with these tags (INPUT and
/// NO_DEP read, OUTPUT and OUTPUT_EXISTING write, INOUT both).
pub fn hash_callable(tags: &[ArgTag]) -> String {
    format!("test.hash.{}", pattern(tags))
}

/// The `test.partial.<p>` name for arguments with these tags, and the
/// mask of the arguments it writes partially (the `OUTPUT_EXISTING` and
/// `INOUT` ones: an `OUTPUT` is written whole).
pub fn partial_callable(tags: &[ArgTag]) -> (String, u64) {
    let mask = tags
        .iter()
        .enumerate()
        .filter(|(_, t)| matches!(t, ArgTag::OutputExisting | ArgTag::InOut))
        .fold(0u64, |m, (i, _)| m | 1 << i);
    (format!("test.partial.{}", pattern(tags)), mask)
}

/// Whether a partial writer salted `salt` writes element `k` (row-major)
/// of its argument `arg` in task `task`: about half of them, differently
/// per task, argument and salt.
pub fn partially_writes(salt: u64, task: u64, arg: usize, k: u64) -> bool {
    let mut h = 0x9e37_79b9_7f4a_7c15u64 ^ salt;
    fnv(&mut h, &task.to_le_bytes());
    fnv(&mut h, &[arg as u8]);
    fnv(&mut h, &k.to_le_bytes());
    h >> 29 & 1 == 1
}

fn pattern(tags: &[ArgTag]) -> String {
    tags.iter()
        .map(|t| match t {
            ArgTag::Input | ArgTag::NoDep => 'r',
            ArgTag::Output | ArgTag::OutputExisting => 'w',
            ArgTag::InOut => 'x',
        })
        .collect()
}

fn descriptor(name: &str, args: Vec<ArgSpec>, scalars: Vec<ScalarSpec>) -> Signature {
    Signature {
        name: name.into(),
        version: 1,
        args,
        scalars,
    }
}

/// `test.cuda_fault` (module docs).
fn cuda_fault() -> Result<SourceKernel, String> {
    SourceKernel::new(
        descriptor(
            "test.cuda_fault",
            vec![ArgSpec::new(
                "x",
                Access::Write,
                DTypes::OneOf(vec![DType::F32]),
                Rank::Any,
            )],
            vec![],
        ),
        r#"extern "C" __global__ void cuda_fault(strata_tensor x) {
               *reinterpret_cast<volatile float*>(0x10) = 1.0f;
               *strata_at<float>(x, 0) = 7.0f;
           }"#,
        Entry::One("cuda_fault".into()),
        Grid::Fixed {
            blocks: [1, 1, 1],
            threads: [1, 1, 1],
            shared: 0,
        },
    )
}

fn u64_scalar(name: &str) -> ScalarSpec {
    ScalarSpec {
        name: name.into(),
        kind: ScalarKind::U64,
    }
}

/// The built-in kernels plus the test kernels.
///
/// # Errors
/// A registration conflict (a bug).
pub fn registry() -> Result<Registry, String> {
    registry_with_hash_delay(std::time::Duration::ZERO)
}

/// As [`registry`], with every `test.hash.*` kernel sleeping `delay`
/// between reading its inputs and writing its outputs.
///
/// # Errors
/// A registration conflict (a bug).
pub fn registry_with_hash_delay(delay: std::time::Duration) -> Result<Registry, String> {
    let mut kernels = Registry::with_builtins();
    let mut add = |k: Arc<dyn Kernel>| kernels.register(k).map(|_| ()).map_err(|e| e.to_string());
    add(Arc::new(Panic(descriptor("test.panic", vec![], vec![]))))?;
    add(Arc::new(Sleep(descriptor(
        "test.sleep",
        vec![],
        vec![u64_scalar("ms")],
    ))))?;
    add(Arc::new(Spin(descriptor(
        "test.spin",
        vec![],
        vec![u64_scalar("ms")],
    ))))?;
    add(Arc::new(Abort(descriptor("test.abort", vec![], vec![]))))?;
    add(Arc::new(LateFill(descriptor(
        "test.late_fill",
        vec![ArgSpec::new(
            "x",
            Access::Write,
            DTypes::OneOf(vec![DType::F32]),
            Rank::Any,
        )],
        vec![u64_scalar("ms"), u64_scalar("value")],
    ))))?;
    for (name, access) in [
        ("test.slow", Access::Write),
        ("test.slow.x", Access::ReadWrite),
    ] {
        add(Arc::new(Sleep(descriptor(
            name,
            vec![ArgSpec::new("x", access, DTypes::Any, Rank::Any)],
            vec![u64_scalar("ms")],
        ))))?;
    }
    add(Arc::new(Touch(descriptor(
        "test.touch",
        vec![ArgSpec::new("x", Access::Read, DTypes::Any, Rank::Any)],
        vec![],
    ))))?;
    add(Arc::new(ScratchFill(descriptor(
        "test.scratch",
        vec![],
        vec![
            u64_scalar("nbytes"),
            u64_scalar("word"),
            u64_scalar("check"),
        ],
    ))))?;
    add(Arc::new(Mark(descriptor(
        "test.mark",
        vec![ArgSpec::new(
            "x",
            Access::Write,
            DTypes::OneOf(vec![DType::U64]),
            Rank::Exactly(1),
        )],
        vec![u64_scalar("value")],
    ))))?;
    for pattern in ["x", "rx", "rrx"] {
        let tile = |name: &str, access| {
            ArgSpec::new(
                name,
                access,
                DTypes::OneOf(vec![DType::U64]),
                Rank::Exactly(1),
            )
        };
        let mut args: Vec<ArgSpec> = (0..pattern.len() - 1)
            .map(|i| tile(&format!("neighbour{i}"), Access::Read))
            .collect();
        args.push(tile("tile", Access::ReadWrite));
        add(Arc::new(Tile(descriptor(
            &format!("test.tile.{pattern}"),
            args,
            vec![],
        ))))?;
    }
    let mut patterns: Vec<String> = vec![String::new()];
    let mut all = Vec::new();
    for _ in 0..4 {
        patterns = patterns
            .iter()
            .flat_map(|p| ['r', 'w', 'x'].map(|c| format!("{p}{c}")))
            .collect();
        all.extend(patterns.iter().cloned());
    }
    for name in all {
        let access: Vec<Access> = name
            .chars()
            .map(|c| match c {
                'r' => Access::Read,
                'w' => Access::Write,
                _ => Access::ReadWrite,
            })
            .collect();
        let args: Vec<ArgSpec> = access
            .iter()
            .enumerate()
            .map(|(i, a)| ArgSpec::new(&format!("a{i}"), *a, DTypes::Any, Rank::Any))
            .collect();
        add(Arc::new(Hash {
            desc: descriptor(
                &format!("test.hash.{name}"),
                args.clone(),
                vec![u64_scalar("task")],
            ),
            access: access.clone(),
            delay,
            partial: false,
        }))?;
        add(Arc::new(Hash {
            desc: descriptor(
                &format!("test.partial.{name}"),
                args,
                vec![u64_scalar("task"), u64_scalar("salt"), u64_scalar("mask")],
            ),
            access,
            delay,
            partial: true,
        }))?;
    }
    add(Arc::new(cuda_fault()?))?;
    Ok(kernels)
}
