//! Random view pairs by class, reproducible from a seed.

use crate::{Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity, DType, Tensor};

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
    /// Arbitrary strides on larger views (up to 24 per axis, strides up to
    /// 200, rank up to 4), where levels interleave many times over.
    ArbitraryLarge,
    /// Fields of an array of records viewed as a grid whose rows run past
    /// the end of a grid row, so the record level interleaves with the row
    /// level; one or more fields, every record or every other.
    Fields,
}

impl ViewClass {
    /// Every class.
    pub const ALL: [ViewClass; 9] = [
        ViewClass::SharedLayout,
        ViewClass::Permuted,
        ViewClass::Stepped,
        ViewClass::RankDtype,
        ViewClass::Wrapping,
        ViewClass::Fp4,
        ViewClass::Arbitrary,
        ViewClass::ArbitraryLarge,
        ViewClass::Fields,
    ];

    /// Whether the engine promises exact answers (`Disjoint` whenever no
    /// byte is shared, `Covers` whenever it is true) on every pair of this
    /// class. The others, whose views interleave, are exact up to a bound
    /// on the work per pair (see [`ViewClass::min_precision`]).
    pub fn is_exact(self) -> bool {
        !matches!(
            self,
            ViewClass::Fp4 | ViewClass::Arbitrary | ViewClass::ArbitraryLarge | ViewClass::Fields
        )
    }

    /// The least share, in percent, of truly disjoint pairs answered
    /// `Disjoint` and of truly covering pairs answered `Covers` that the
    /// engine promises on this class. [`ViewClass::ArbitraryLarge`] is a
    /// stress class past the promise: a view there often needs more than
    /// the engine's 16 nested pieces and is compared by a superset, so
    /// only soundness is checked.
    pub fn min_precision(self) -> (f64, f64) {
        match self {
            ViewClass::ArbitraryLarge => (0.0, 0.0),
            _ if self.is_exact() => (100.0, 100.0),
            _ => (99.0, 95.0),
        }
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
            ViewClass::ArbitraryLarge => "arbitrary strides, large",
            ViewClass::Fields => "interleaved record fields",
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

/// Row-major element strides of an array of `dims`.
pub fn row_major_strides(dims: &[u32]) -> Vec<u32> {
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
pub fn random_factorization(rng: &mut Rng, mut n: u32, rank: usize) -> Vec<u32> {
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
        ViewClass::ArbitraryLarge => {
            let rank = rng.range(1, 4) as usize;
            let mut shape: Vec<u32> = (0..rank).map(|_| rng.range(1, 24)).collect();
            // At most 2^12 elements, for the oracle.
            while shape.iter().product::<u32>() > 1 << 12 {
                let axis = rng.range(0, rank as u32 - 1) as usize;
                shape[axis] = shape[axis].div_ceil(2);
            }
            let strides: Vec<u32> = (0..rank).map(|_| rng.range(1, 200)).collect();
            let off = rng.range(0, 4096);
            make(buf, u64::from(off), &shape, &strides, layout.dtype)
        }
        ViewClass::Fields => {
            // The layout is [grid rows, grid cols, record]: fields
            // f..f+nf of a box of records whose rows may run on into
            // the next grid row (cols up to twice a row).
            let (grid_cols, rec) = (layout.dims[1], layout.dims[2]);
            let total_records = layout.dims[0] * grid_cols;
            let f = rng.range(0, rec - 1);
            let nf = rng.range(1, rec - f);
            let step = rng.range(1, 2);
            let first = rng.range(0, total_records - 1);
            let rows = rng.range(1, layout.dims[0]);
            let cols = rng.range(1, 2 * grid_cols);
            let mut shape = vec![rows, cols];
            let mut strides = vec![grid_cols * rec, step * rec];
            if nf > 1 {
                shape.push(nf);
                strides.push(1);
            }
            let off = u64::from(first) * u64::from(rec) + u64::from(f);
            make(buf, off, &shape, &strides, layout.dtype)
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
        ViewClass::ArbitraryLarge => vec![1 << 16],
        ViewClass::Fields => vec![rng.range(2, 8), rng.range(2, 8), rng.range(2, 6)],
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
