//! Helpers: devices, host tensors with random contents and layouts, and an
//! element reader that does not use the runtime's own views.

use std::sync::Arc;

use half::{bf16, f16};
use strata_chip_runtime::{
    ArgBacking, Device, DeviceBlock, HostBuffer, Launch, LaunchArg, LaunchReport, Registry, device,
};
use strata_wire::check::Rng;
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, CanonicalIdentity, DType, Tensor,
};

pub(crate) const MODES: [&str; 2] = [
    "sim:mem=64MiB,mode=staged,lanes=2",
    "sim:mem=64MiB,mode=unified,lanes=2",
];

/// A host buffer and a view over it.
pub(crate) struct HostTensor {
    pub(crate) host: Arc<HostBuffer>,
    pub(crate) view: Tensor,
}

impl HostTensor {
    pub(crate) fn arg(&self, tag: ArgTag) -> LaunchArg {
        LaunchArg {
            tensor: self.view,
            tag,
            backing: ArgBacking::Host(self.host.clone()),
            cache: None,
        }
    }
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.host.to_vec()
    }
}

/// How a random view is laid out in its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    RowMajor,
    /// Axes stored in reverse order (a transposed view).
    Transposed,
    /// Every axis stepped by 2 (innermost stride > 1), with a gap before.
    Stepped,
    /// A block of a larger array: the innermost axis contiguous, each
    /// outer one a line apart plus a gap (rows far apart, as a tile of a
    /// matrix), with a gap before.
    Tile,
    /// A tile, with the axes stored in reverse order.
    TransposedTile,
}

pub(crate) const LAYOUTS: [Layout; 3] = [Layout::RowMajor, Layout::Transposed, Layout::Stepped];

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A view of `shape` in a fresh buffer with the given layout, filled with
/// random bytes that decode to small values of `dtype`.
pub(crate) fn host_tensor(
    rng: &mut Rng,
    shape: &[u32],
    dtype: DType,
    layout: Layout,
) -> HostTensor {
    let n = shape.len();
    let mut strides = vec![0u32; n];
    let step = if layout == Layout::Stepped { 2 } else { 1 };
    let mut acc = 1u32;
    let order: Vec<usize> = if matches!(layout, Layout::Transposed | Layout::TransposedTile) {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    };
    let tile = matches!(layout, Layout::Tile | Layout::TransposedTile);
    for &k in &order {
        strides[k] = acc * step;
        acc *= shape[k] * step;
        if tile {
            // The next axis steps over a line of a wider array.
            acc = acc * 2 + 5;
        }
    }
    let elem = u64::from(dtype.bits() / 8);
    let offset_elems = if layout == Layout::Stepped || tile {
        3
    } else {
        0
    };
    let nbytes = (u64::from(acc) + offset_elems + 8) * elem;
    let identity = CanonicalIdentity::new(
        *b"chiptest",
        NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        1,
    )
    .unwrap();
    let buf = BufferDescriptor::new(
        identity,
        nbytes,
        AddressSpace::Host,
        Access::ReadWrite,
        Backing::Memfd {
            st_dev: 1,
            st_ino: 1,
        },
    )
    .unwrap();
    let view = Tensor::new(buf, offset_elems * elem, shape, &strides, dtype).unwrap();
    let host = Arc::new(HostBuffer::new(nbytes as usize).unwrap());
    let mut bytes = vec![0u8; nbytes as usize];
    // A complex element is two parts of the part's float type, each drawn.
    let (part, parts) = match dtype {
        DType::C64 => (DType::F32, 2),
        DType::C128 => (DType::F64, 2),
        d => (d, 1),
    };
    let width = elem as usize / parts;
    for chunk in bytes.chunks_mut(width) {
        let v = (rng.next_u64() % 2001) as f64 / 250.0 - 4.0;
        chunk.copy_from_slice(&encode(part, v)[..width]);
    }
    host.write(0, &bytes).unwrap();
    HostTensor { host, view }
}

/// `v` in `dtype`'s little-endian bytes (integers: rounded toward zero ·8).
pub(crate) fn encode(dtype: DType, v: f64) -> [u8; 8] {
    let mut out = [0u8; 8];
    match dtype {
        DType::F32 => out[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out.copy_from_slice(&v.to_le_bytes()),
        DType::F16 => out[..2].copy_from_slice(&f16::from_f64(v).to_le_bytes()),
        DType::BF16 => out[..2].copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
        DType::I32 => out[..4].copy_from_slice(&((v * 8.0) as i32).to_le_bytes()),
        DType::I64 => out.copy_from_slice(&((v * 8.0) as i64).to_le_bytes()),
        DType::U8 => out[0] = (v * 8.0) as i64 as u8,
        DType::I16 => out[..2].copy_from_slice(&((v * 8.0) as i16).to_le_bytes()),
        other => panic!("test encode of {other}"),
    }
    out
}

/// The bytes of element `idx` of `t`: where they start in the buffer,
/// and how many.
fn element_at(t: &Tensor, idx: &[usize]) -> (usize, usize) {
    let elem = (t.dtype().bits() / 8) as usize;
    let e: usize = idx
        .iter()
        .zip(t.strides())
        .map(|(&i, &s)| i * s as usize)
        .sum();
    (t.byte_offset() as usize + e * elem, elem)
}

/// Element `idx` of `t` in `bytes`, decoded independently of the runtime.
pub(crate) fn read(bytes: &[u8], t: &Tensor, idx: &[usize]) -> f64 {
    let (at, elem) = element_at(t, idx);
    let b = &bytes[at..at + elem];
    match t.dtype() {
        DType::F32 => f64::from(f32::from_le_bytes(b.try_into().unwrap())),
        DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::I32 => f64::from(i32::from_le_bytes(b.try_into().unwrap())),
        DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::I16 => f64::from(i16::from_le_bytes(b.try_into().unwrap())),
        DType::U8 => f64::from(b[0]),
        other => panic!("test read of {other}"),
    }
}

/// Element `idx` of complex `t` (C64, C128) in `bytes` as (real,
/// imaginary), decoded independently of the runtime.
pub(crate) fn read_complex(bytes: &[u8], t: &Tensor, idx: &[usize]) -> (f64, f64) {
    let (at, elem) = element_at(t, idx);
    let (re, im) = bytes[at..at + elem].split_at(elem / 2);
    match t.dtype() {
        DType::C64 => (
            f64::from(f32::from_le_bytes(re.try_into().unwrap())),
            f64::from(f32::from_le_bytes(im.try_into().unwrap())),
        ),
        DType::C128 => (
            f64::from_le_bytes(re.try_into().unwrap()),
            f64::from_le_bytes(im.try_into().unwrap()),
        ),
        other => panic!("test read_complex of {other}"),
    }
}

/// Writes `f(idx)` to every element `idx` of `t`.
pub(crate) fn fill_with(t: &HostTensor, f: impl Fn(&[usize]) -> f64) {
    let v = &t.view;
    for idx in indices(v.shape()) {
        let (at, elem) = element_at(v, &idx);
        t.host
            .write(at, &encode(v.dtype(), f(&idx))[..elem])
            .unwrap();
    }
}

/// A tensor of `shape` in a randomly chosen layout.
pub(crate) fn any_layout(rng: &mut Rng, shape: &[u32], dtype: DType) -> HostTensor {
    let layout = rng.pick(&LAYOUTS);
    host_tensor(rng, shape, dtype, layout)
}

/// A random shape of `rank` axes, 1 to 6 long.
pub(crate) fn shape(rng: &mut Rng, rank: u32) -> Vec<u32> {
    (0..rank).map(|_| rng.range(1, 7)).collect()
}

/// Runs `f` on each chip of the conformance list ([`crate::conformance`]):
/// the simulated chip in each mode and `cuda:0` where there is one, each
/// fresh, with the built-in registry and a generator seeded from `seed`;
/// checks that every kernel released its scratch memory (and a simulated
/// chip's invariants). `uses` names the kernels `f` launches.
pub(crate) fn each_mode(seed: u64, uses: &[&str], f: impl FnMut(&dyn Device, &Registry, &mut Rng)) {
    crate::conformance::each_chip(seed, &MODES, CUDA_KEYS, uses, f);
}

/// What a CUDA chip of the conformance list is given: as much memory as
/// the simulated chips of [`MODES`].
pub(crate) const CUDA_KEYS: &str = "mem=64MiB";

/// Every multi-index of `shape` in row-major order.
pub(crate) fn indices(shape: &[u32]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &n in shape {
        out = out
            .into_iter()
            .flat_map(|p| (0..n as usize).map(move |i| [p.clone(), vec![i]].concat()))
            .collect();
    }
    out
}

/// Relative precision of a dtype (half an ulp at 1).
pub(crate) fn eps(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f64::from(f32::EPSILON),
        DType::F64 => f64::EPSILON,
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 0.0,
    }
}

pub(crate) fn run(
    dev: &dyn Device,
    reg: &Registry,
    name: &str,
    args: Vec<LaunchArg>,
    scalars: Vec<u64>,
) -> Result<LaunchReport, strata_chip_runtime::Error> {
    let kernel = reg.get(reg.find(name, 1).unwrap()).unwrap();
    device::launch(
        dev,
        Launch {
            kernel,
            args,
            scalars,
            gate: None,
            priority: 0,
        },
    )?
    .wait()
}

/// Every F32 element of device `block`, as a launch argument tagged `tag`
/// (the block's descriptor names it by its address).
pub(crate) fn device_f32_arg(block: DeviceBlock, tag: ArgTag) -> LaunchArg {
    let desc = BufferDescriptor::new(
        CanonicalIdentity::new(*b"devblock", block.addr, 1).unwrap(),
        block.len,
        AddressSpace::Device,
        Access::ReadWrite,
        Backing::DeviceMalloc {
            addr: std::num::NonZeroU64::new(block.addr).unwrap(),
        },
    )
    .unwrap();
    let n = (block.len / 4) as u32;
    LaunchArg {
        tensor: Tensor::new(desc, 0, &[n], &[1], DType::F32).unwrap(),
        tag,
        backing: ArgBacking::Device(block),
        cache: None,
    }
}
