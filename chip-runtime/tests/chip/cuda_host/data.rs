//! Random views and values for the host build's comparisons.

use strata_wire::check::Rng;
use strata_wire::{
    Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity, DType, Tensor,
};

/// A tensor argument: its view and its buffer's bytes before the launch.
pub(crate) struct Arg {
    pub(crate) view: Tensor,
    pub(crate) bytes: Vec<u8>,
}

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A view of `shape` laid out at random in a buffer of its own: one in
/// four row-major and contiguous (the prelude's fast path), the others
/// with the axes stored in a random order, stepped by 1–3 elements, gaps
/// after axes; an offset before.
fn random_view(rng: &mut Rng, shape: &[u32], dtype: DType) -> Tensor {
    let n = shape.len();
    let dense = rng.range(0, 3) == 0;
    let mut order: Vec<usize> = (0..n).rev().collect();
    match if dense { 0 } else { rng.range(0, 2) } {
        0 => {}
        1 => order.reverse(),
        _ => {
            for i in (1..n).rev() {
                order.swap(i, rng.range(0, i as u32) as usize);
            }
        }
    }
    let step = if dense { 1 } else { rng.pick(&[1u32, 1, 2, 3]) };
    let mut strides = vec![0u32; n];
    let mut acc = 1u32;
    for &k in &order {
        strides[k] = acc * step;
        acc = strides[k] * shape[k] + if dense { 0 } else { rng.pick(&[0u32, 0, 1, 3]) };
    }
    let offset = u64::from(rng.pick(&[0u32, 0, 1, 5]));
    let elem = u64::from(dtype.bits() / 8);
    let nbytes = (offset + u64::from(acc) + 4) * elem;
    let identity = CanonicalIdentity::new(
        *b"cudahost",
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
    Tensor::new(buf, offset * elem, shape, &strides, dtype).unwrap()
}

/// Values for the data: `Wide` is any finite value (integers: any bits,
/// moves: any bits at all), `Narrow` values of magnitude 1/16 to 16 or 0.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Data {
    Any,
    Wide,
    Narrow,
}

/// A random finite float of `bits` (16, 32 or 64) as its bits: `wide`
/// anywhere in the range, subnormals included; else 1/16 to 16 or 0.
pub(crate) fn float_bits(rng: &mut Rng, fmt: DType, wide: bool) -> u64 {
    let (exp_bits, man_bits) = match fmt {
        DType::F16 => (5, 10),
        DType::BF16 => (8, 7),
        DType::F32 => (8, 23),
        _ => (11, 52),
    };
    let bias = (1u64 << (exp_bits - 1)) - 1;
    let sign = rng.next_u64() & 1;
    let man = rng.next_u64() & ((1u64 << man_bits) - 1);
    let exp = if wide {
        rng.next_u64() % ((1u64 << exp_bits) - 1)
    } else if rng.range(0, 15) == 0 {
        return 0;
    } else {
        bias - 4 + rng.next_u64() % 8
    };
    (sign << (exp_bits + man_bits)) | (exp << man_bits) | man
}

fn random_bytes(rng: &mut Rng, dtype: DType, len: usize, data: Data) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    let (part, width) = match dtype {
        DType::C64 => (DType::F32, 4),
        DType::C128 => (DType::F64, 8),
        d if matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16) => {
            (d, d.bits() as usize / 8)
        }
        _ => (DType::U8, 1),
    };
    while out.len() < len {
        let v = if data == Data::Any || part == DType::U8 {
            rng.next_u64()
        } else {
            float_bits(rng, part, data == Data::Wide)
        };
        out.extend_from_slice(&v.to_le_bytes()[..width]);
    }
    out.truncate(len);
    out
}

pub(crate) fn arg(rng: &mut Rng, shape: &[u32], dtype: DType, data: Data) -> Arg {
    let view = random_view(rng, shape, dtype);
    let bytes = random_bytes(rng, dtype, view.buffer().nbytes() as usize, data);
    Arg { view, bytes }
}

/// The value of a `fill` of `dtype`: for integers any value of the
/// dtype's range (sign-extended for signed dtypes), for the others an
/// f64 from a list of roundings worth checking or any finite one.
pub(crate) fn fill_value(rng: &mut Rng, dtype: DType) -> u64 {
    let r = rng.next_u64();
    match dtype {
        DType::I8 => r as i8 as i64 as u64,
        DType::I16 => r as i16 as i64 as u64,
        DType::I32 => r as i32 as i64 as u64,
        DType::U8 => r as u8 as u64,
        DType::U16 => r as u16 as u64,
        DType::U32 => r as u32 as u64,
        DType::I64 | DType::U64 => r,
        _ => {
            let special = [
                0.1,
                1.0 / 3.0,
                -0.0,
                65_519.0,                             // F16: rounds down to its largest
                65_520.0,                             // F16: rounds to infinity
                1e-8,                                 // F16: subnormal
                1e39,                                 // F32: infinity
                1.0 + 2f64.powi(-11),                 // F16: a tie, to even
                1.0 + 2f64.powi(-8) + 2f64.powi(-40), // BF16: above a tie only in the low bits
            ];
            match rng.range(0, 2) {
                0 => rng.pick(&special).to_bits(),
                1 => float_bits(rng, DType::F64, false),
                _ => float_bits(rng, DType::F64, true),
            }
        }
    }
}
