//! Oracles and generators for testing the wire format, shared by the unit
//! tests, the property tests, the benchmarks and the fuzz targets.
//!
//! - [`byte_set`] / [`overlap_by_bytes`]: the brute-force overlap oracle.
//! - [`ViewClass`] / [`view_pair`]: random view pairs by class, from a seed.
//! - [`reference_tensor_valid`]: an independent, deliberately plain reading
//!   of the DESIGN §3 rules, to cross-check the real validator.
//! - [`check_tensor_bytes`], [`check_task_args_bytes`], [`check_overlap_seed`]:
//!   the fuzz oracles. They panic when an invariant is broken; that is their
//!   job (a fuzzer reports the panic as a crash).
//! - [`HOSTILE_WORDS`] / [`hostile_variants`]: boundary values for every
//!   4-byte word of a record.

#![allow(
    clippy::indexing_slicing,
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
    // Test support: panics are how an oracle reports, and casts of small
    // generator values are in range by construction.
)]

use crate::{
    Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity, DType, Footprint, Overlap,
    TENSOR_SIZE, TaskArgs, Tensor, overlap,
};

/// Views with more elements than this are not enumerated by the oracle.
pub const ORACLE_MAX_ELEMENTS: u64 = 1 << 16;

/// Every byte offset `view` touches, sorted and deduplicated; `None` when
/// the view has more than [`ORACLE_MAX_ELEMENTS`] elements.
pub fn byte_set(view: &Tensor) -> Option<Vec<u64>> {
    if view.element_count() > ORACLE_MAX_ELEMENTS {
        return None;
    }
    let bits = u64::from(view.dtype().bits());
    let mut out = Vec::new();
    let shape = view.shape();
    let strides = view.strides();
    let mut index = vec![0u32; shape.len()];
    loop {
        let elem: u64 = index
            .iter()
            .zip(strides)
            .map(|(&i, &s)| u64::from(i) * u64::from(s))
            .sum();
        let first_bit = view.byte_offset() * 8 + elem * bits;
        let last_bit = first_bit + bits - 1;
        out.extend(first_bit / 8..=last_bit / 8);
        // Odometer over the index, innermost axis fastest.
        let mut axis = shape.len();
        loop {
            if axis == 0 {
                out.sort_unstable();
                out.dedup();
                return Some(out);
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

/// The true relation of two views, by enumerating their bytes; `None` when
/// a view is too large to enumerate.
pub fn overlap_by_bytes(a: &Tensor, b: &Tensor) -> Option<Overlap> {
    if a.identity() != b.identity() {
        return Some(Overlap::Disjoint);
    }
    let (sa, sb) = (byte_set(a)?, byte_set(b)?);
    let shared = sb.iter().filter(|x| sa.binary_search(x).is_ok()).count();
    Some(match shared {
        0 => Overlap::Disjoint,
        n if n == sb.len() => Overlap::Covers,
        _ => Overlap::Partial,
    })
}

/// A small deterministic generator (SplitMix64), so that a failing case is
/// reproduced from its seed alone.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next_u64() % u64::from(hi - lo + 1)) as u32
    }
    /// True with probability `num/den`.
    pub fn chance(&mut self, num: u32, den: u32) -> bool {
        self.range(1, den) <= num
    }
    /// A uniformly chosen element.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.next_u64() % items.len() as u64) as usize]
    }
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// Families of view pairs over one buffer, as named by the overlap
/// engine's contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViewClass {
    /// Boxes of one row-major layout: same dtype, the buffer's strides.
    SharedLayout,
    /// Boxes with their axes transposed or permuted.
    Permuted,
    /// Boxes with steps on any axis, innermost included (stride > 1).
    Stepped,
    /// Boxes of different ranks and dtypes: each view reshapes the bytes.
    RankDtype,
    /// Row-major views whose rows run past the end of a buffer row.
    Wrapping,
    /// FP4E2M1 views (two elements per byte), stepped.
    Fp4,
    /// Arbitrary positive strides, including interleaving levels.
    Arbitrary,
}

impl ViewClass {
    /// Every class.
    pub const ALL: [ViewClass; 7] = [
        ViewClass::SharedLayout,
        ViewClass::Permuted,
        ViewClass::Stepped,
        ViewClass::RankDtype,
        ViewClass::Wrapping,
        ViewClass::Fp4,
        ViewClass::Arbitrary,
    ];

    /// Whether the engine promises exact answers (`Disjoint` whenever no
    /// byte is shared, `Covers` whenever it is true) on this class.
    pub fn is_exact(self) -> bool {
        !matches!(self, ViewClass::Fp4 | ViewClass::Arbitrary)
    }

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            ViewClass::SharedLayout => "shared row-major layout",
            ViewClass::Permuted => "transposed / permuted",
            ViewClass::Stepped => "stepped slices",
            ViewClass::RankDtype => "different rank / dtype",
            ViewClass::Wrapping => "rows that wrap",
            ViewClass::Fp4 => "FP4 (two per byte)",
            ViewClass::Arbitrary => "arbitrary strides",
        }
    }
}

/// The buffer every generated view is over.
pub fn test_buffer(nbytes: u64) -> BufferDescriptor {
    let id = CanonicalIdentity::new(*b"checkbuf", 1, 1).unwrap();
    BufferDescriptor::new(
        id,
        nbytes,
        AddressSpace::Host,
        Access::ReadWrite,
        Backing::Memfd {
            st_dev: 1,
            st_ino: 1,
        },
    )
    .unwrap()
}

const DTYPES: [DType; 5] = [DType::U8, DType::F16, DType::F32, DType::I64, DType::BF16];

fn row_major_strides(dims: &[u32]) -> Vec<u32> {
    let mut strides = vec![1u32; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

/// A box of a row-major array of `dims` elements: per axis a start, a
/// count and a step (steps only when `max_step > 1`).
fn sub_box(rng: &mut Rng, dims: &[u32], max_step: u32) -> (u64, Vec<u32>, Vec<u32>) {
    let strides = row_major_strides(dims);
    let mut offset = 0u64;
    let mut shape = Vec::new();
    let mut view_strides = Vec::new();
    for (&d, &s) in dims.iter().zip(&strides) {
        let start = rng.range(0, d - 1);
        let step = rng.range(1, max_step);
        let max_count = (d - 1 - start) / step + 1;
        let count = rng.range(1, max_count);
        offset += u64::from(start) * u64::from(s);
        shape.push(count);
        view_strides.push(step * s);
    }
    (offset, shape, view_strides)
}

fn random_dims(rng: &mut Rng, rank: u32, max: u32) -> Vec<u32> {
    (0..rank).map(|_| rng.range(1, max)).collect()
}

/// Factors `n` into `rank` positive factors at random.
fn random_factorization(rng: &mut Rng, mut n: u32, rank: usize) -> Vec<u32> {
    let mut dims = vec![1u32; rank];
    let mut p = 2;
    while n > 1 {
        while n % p == 0 {
            let axis = (rng.next_u64() % rank as u64) as usize;
            dims[axis] *= p;
            n /= p;
        }
        p += 1;
    }
    dims
}

fn make(
    buf: BufferDescriptor,
    offset_elems: u64,
    shape: &[u32],
    strides: &[u32],
    dtype: DType,
) -> Option<Tensor> {
    let byte_offset = match dtype.bits() {
        4 => offset_elems / 2,
        bits => offset_elems * u64::from(bits / 8),
    };
    Tensor::new(buf, byte_offset, shape, strides, dtype).ok()
}

/// One random view of `class` over `buf`, or `None` when the draw did not
/// fit (callers draw again).
fn view(rng: &mut Rng, class: ViewClass, layout: &Layout) -> Option<Tensor> {
    let buf = layout.buf;
    match class {
        ViewClass::SharedLayout => {
            let (off, shape, strides) = sub_box(rng, &layout.dims, 1);
            make(buf, off, &shape, &strides, layout.dtype)
        }
        ViewClass::Permuted => {
            let (off, shape, strides) = sub_box(rng, &layout.dims, 2);
            let mut axes: Vec<(u32, u32)> = shape.into_iter().zip(strides).collect();
            rng.shuffle(&mut axes);
            let (shape, strides): (Vec<u32>, Vec<u32>) = axes.into_iter().unzip();
            make(buf, off, &shape, &strides, layout.dtype)
        }
        ViewClass::Stepped => {
            let (off, shape, strides) = sub_box(rng, &layout.dims, 4);
            make(buf, off, &shape, &strides, layout.dtype)
        }
        ViewClass::RankDtype => {
            let dtype = rng.pick(&DTYPES);
            let elem = dtype.bits() / 8;
            let total = u32::try_from(buf.nbytes()).ok()? / elem;
            let rank = rng.range(1, 3) as usize;
            let dims = random_factorization(rng, total, rank);
            let (off, shape, strides) = sub_box(rng, &dims, 3);
            make(buf, off, &shape, &strides, dtype)
        }
        ViewClass::Wrapping => {
            let total: u32 = layout.dims.iter().product();
            let row = *layout.dims.last()?;
            let strides = row_major_strides(&layout.dims);
            let rank = layout.dims.len();
            let mut shape: Vec<u32> = layout.dims.iter().map(|&d| rng.range(1, d)).collect();
            shape[rank - 1] = rng.range(1, (2 * row).min(total));
            let off = rng.range(0, total - 1);
            make(buf, u64::from(off), &shape, &strides, layout.dtype)
        }
        ViewClass::Fp4 => {
            let total = u32::try_from(buf.nbytes()).ok()? * 2;
            let rank = rng.range(1, 3) as usize;
            let dims = random_factorization(rng, total, rank);
            let (off, shape, strides) = sub_box(rng, &dims, 3);
            // Byte-aligned starts only: FP4 views begin on a byte.
            make(buf, off & !1, &shape, &strides, DType::Fp4E2M1)
        }
        ViewClass::Arbitrary => {
            let rank = rng.range(1, 3) as usize;
            let shape: Vec<u32> = (0..rank).map(|_| rng.range(1, 5)).collect();
            let strides: Vec<u32> = (0..rank).map(|_| rng.range(1, 12)).collect();
            let off = rng.range(0, 64);
            make(buf, u64::from(off), &shape, &strides, layout.dtype)
        }
    }
}

/// The buffer and the row-major layout that the two views of a pair share.
struct Layout {
    buf: BufferDescriptor,
    dims: Vec<u32>,
    dtype: DType,
}

fn layout(rng: &mut Rng, class: ViewClass) -> Layout {
    let dtype = if matches!(class, ViewClass::RankDtype | ViewClass::Fp4) {
        DType::U8
    } else {
        rng.pick(&DTYPES)
    };
    let dims = match class {
        ViewClass::RankDtype | ViewClass::Fp4 => {
            vec![rng.pick(&[48u32, 64, 72, 96, 128, 144, 192, 240, 256])]
        }
        ViewClass::Arbitrary => vec![160],
        _ => {
            let rank = rng.range(1, 5);
            let max = match rank {
                1 | 2 => 10,
                3 => 6,
                _ => 4,
            };
            random_dims(rng, rank, max)
        }
    };
    let elems: u32 = dims.iter().product();
    let nbytes = u64::from(elems) * u64::from(dtype.bits() / 8);
    Layout {
        buf: test_buffer(nbytes),
        dims,
        dtype,
    }
}

/// A random pair of views of `class` over one buffer.
pub fn view_pair(class: ViewClass, rng: &mut Rng) -> (Tensor, Tensor) {
    loop {
        let layout = layout(rng, class);
        let draw = |rng: &mut Rng| (0..32).find_map(|_| view(rng, class, &layout));
        if let (Some(a), Some(b)) = (draw(rng), draw(rng)) {
            return (a, b);
        }
    }
}

/// An independent reading of the tensor rules of DESIGN §3, written for
/// clarity rather than speed, to cross-check [`Tensor::decode`].
pub fn reference_tensor_valid(bytes: &[u8]) -> bool {
    if bytes.len() != TENSOR_SIZE {
        return false;
    }
    let le = |at: usize, n: usize| {
        bytes[at..at + n]
            .iter()
            .rev()
            .fold(0u128, |acc, &b| (acc << 8) | u128::from(b))
    };
    let magic = le(0, 2);
    let space = le(2, 1);
    let access = le(3, 1);
    let kind = le(4, 1);
    let generation = le(24, 4);
    let nbytes = le(40, 8);
    let body_len = le(52, 2) as usize;
    let body = &bytes[56..88];
    let descriptor_ok = magic == 0x5342
        && space <= 1
        && access <= 2
        && kind <= 6
        && le(5, 3) == 0
        && generation != 0
        && le(54, 2) == 0
        && body_len <= 32
        && body[body_len.min(32)..].iter().all(|&b| b == 0)
        && match kind {
            0 | 2 | 4 | 5 => body_len == 8 && le(56, 8) != 0,
            1 => {
                (1..=32).contains(&body_len)
                    && body[..body_len]
                        .iter()
                        .all(|&b| b.is_ascii_graphic() && b != b'/')
            }
            3 => body_len == 0,
            6 => body_len == 16,
            _ => false,
        }
        && match kind {
            2 | 4 => space == 1,
            3 => true,
            _ => space == 0,
        }
        && (kind != 5 || access == 0);
    if !descriptor_ok {
        return false;
    }
    let byte_offset = le(88, 8);
    let ndims = le(96, 4);
    let dtype = le(140, 1);
    if !(1..=5).contains(&ndims) || dtype > 14 || le(141, 3) != 0 {
        return false;
    }
    let ndims = ndims as usize;
    let mut span = 1u128;
    for i in 0..5 {
        let (shape, stride) = (le(100 + 4 * i, 4), le(120 + 4 * i, 4));
        if i < ndims {
            if shape == 0 || stride == 0 {
                return false;
            }
            span += (shape - 1) * stride;
        } else if shape != 0 || stride != 0 {
            return false;
        }
    }
    let bits = DType::from_code(dtype as u8).unwrap().bits() as u128;
    let align = (bits / 8).max(1);
    let extent = (span * bits).div_ceil(8);
    byte_offset % align == 0 && byte_offset + extent <= nbytes
}

/// Fuzz oracle for one tensor record: decoding never panics; a decoded
/// tensor re-encodes to bytes that decode to itself, equals what the public
/// constructor builds from its parts, and the reference reading of the rules
/// agrees with the validator on every input.
pub fn check_tensor_bytes(data: &[u8]) {
    let decoded = Tensor::decode(data);
    assert_eq!(
        decoded.is_ok(),
        reference_tensor_valid(data),
        "validator and reference disagree on {data:02x?}: {decoded:?}"
    );
    if let Ok(t) = decoded {
        let mut expect = data.to_vec();
        expect[IDENTITY_PAD_IN_TENSOR].fill(0);
        assert_eq!(
            t.encode().as_slice(),
            expect.as_slice(),
            "a valid tensor re-encodes to itself"
        );
        let again = Tensor::decode(&t.encode()).expect("re-encoded tensor must decode");
        assert_eq!(again, t);
        let rebuilt = Tensor::new(
            *t.buffer(),
            t.byte_offset(),
            t.shape(),
            t.strides(),
            t.dtype(),
        );
        assert_eq!(rebuilt, Ok(t));
        let d = BufferDescriptor::decode(&data[..crate::DESCRIPTOR_SIZE])
            .expect("descriptor of a valid tensor");
        assert_eq!(&d, t.buffer());
        assert!(t.end_byte() <= t.buffer().nbytes());
    }
}

/// Where a tensor record keeps its identity's ignored padding.
const IDENTITY_PAD_IN_TENSOR: std::ops::Range<usize> = 28..40;

/// Fuzz oracle for a TaskArgs blob: decode and validate agree (same error),
/// and a decoded blob round-trips.
pub fn check_task_args_bytes(data: &[u8]) {
    let decoded = TaskArgs::decode(data);
    let validated = TaskArgs::validate(data);
    assert_eq!(
        decoded.as_ref().err(),
        validated.as_ref().err(),
        "decode and validate disagree"
    );
    if let Ok(args) = decoded {
        // Byte-exact except the identity padding, which decoding ignores.
        let mut expect = data.to_vec();
        for i in 0..args.tensors().len() {
            let at = crate::HEADER_SIZE + i * TENSOR_SIZE;
            expect[at + IDENTITY_PAD_IN_TENSOR.start..at + IDENTITY_PAD_IN_TENSOR.end].fill(0);
        }
        assert_eq!(args.encode(), expect, "a valid blob re-encodes to itself");
        assert_eq!(TaskArgs::decode(&args.encode()), Ok(args));
    }
    // Whatever the bytes are, reading them as a single record must not panic.
    let _ = crate::decode_any(data);
}

/// Fuzz oracle for the overlap engine: a pair drawn from the seed in
/// `data` is compared with the byte-set oracle. The engine may never answer
/// Disjoint for views that share a byte, nor Covers when it is false, and it
/// must agree with the oracle exactly on the exact classes.
pub fn check_overlap_seed(data: &[u8]) {
    let mut seed = [0u8; 8];
    for (d, s) in seed.iter_mut().zip(data) {
        *d = *s;
    }
    let class =
        ViewClass::ALL[usize::from(data.get(8).copied().unwrap_or(0)) % ViewClass::ALL.len()];
    let mut rng = Rng(u64::from_le_bytes(seed));
    let (a, b) = view_pair(class, &mut rng);
    let truth = overlap_by_bytes(&a, &b).expect("generated views are small");
    let got = overlap(&a, &b);
    check_answer(class, &a, &b, got, truth);
    let (fa, fb) = (Footprint::of(&a), Footprint::of(&b));
    assert_eq!(fa.overlap(&fb), got, "footprint and tensor paths disagree");
}

/// Panics unless `got` is a sound answer for the true relation `truth`, and
/// the exact answer on exact classes.
pub fn check_answer(class: ViewClass, a: &Tensor, b: &Tensor, got: Overlap, truth: Overlap) {
    match (got, truth) {
        (Overlap::Disjoint, Overlap::Covers | Overlap::Partial) => {
            panic!("wrong Disjoint ({class:?}): {a:?} vs {b:?}")
        }
        (Overlap::Covers, Overlap::Disjoint | Overlap::Partial) => {
            panic!("wrong Covers ({class:?}): {a:?} vs {b:?} is {truth:?}")
        }
        _ => {}
    }
    if class.is_exact() {
        assert_eq!(
            got, truth,
            "inexact answer on exact class {class:?}: {a:?} vs {b:?}"
        );
    }
}

/// Values tried in every 4-byte word of a record by the hostile-input tests.
pub const HOSTILE_WORDS: [u32; 12] = [
    0,
    1,
    2,
    5,
    6,
    7,
    0xff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x0001_0000,
    0x5342,
];

/// Every copy of `record` with one aligned 4-byte word replaced by one of
/// [`HOSTILE_WORDS`].
pub fn hostile_variants(record: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    (0..record.len() / 4).flat_map(move |word| {
        HOSTILE_WORDS.iter().map(move |v| {
            let mut copy = record.to_vec();
            copy[word * 4..word * 4 + 4].copy_from_slice(&v.to_le_bytes());
            copy
        })
    })
}
