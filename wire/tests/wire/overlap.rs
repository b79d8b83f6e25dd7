//! The overlap engine against the brute-force byte-set oracle.

use proptest::prelude::*;
use strata_wire::check::{Rng, ViewClass, check_answer, overlap_by_bytes, view_pair};
use strata_wire::{DType, Footprint, Overlap, Tensor, overlap};

use crate::memfd_buffer;

/// The views of the acceptance list, over one 16×16 U8 buffer:
/// offset = r0·16 + c0, shape [rows, cols], strides [16, 1].
#[test]
fn acceptance_cases_16x16() {
    let buf = memfd_buffer(1, 256);
    let tile = |r0: u64, c0: u64, rows: u32, cols: u32| {
        Tensor::new(buf, r0 * 16 + c0, &[rows, cols], &[16, 1], DType::U8).unwrap()
    };
    let flat = |start: u64, end: u64| {
        Tensor::new(
            buf,
            start,
            &[u32::try_from(end - start).unwrap()],
            &[1],
            DType::U8,
        )
        .unwrap()
    };
    let check = |a: &Tensor, b: &Tensor, want: Overlap| {
        assert_eq!(overlap(a, b), want, "{a:?} vs {b:?}");
        assert_eq!(
            overlap_by_bytes(a, b),
            Some(want),
            "oracle disagrees with the expectation"
        );
    };
    check(&tile(0, 0, 16, 4), &tile(0, 8, 16, 4), Overlap::Disjoint);
    check(&tile(0, 0, 8, 8), &tile(0, 8, 8, 8), Overlap::Disjoint);
    check(&tile(0, 0, 8, 8), &tile(4, 4, 8, 8), Overlap::Partial);
    check(&tile(0, 0, 16, 16), &tile(0, 0, 8, 8), Overlap::Covers);
    check(&flat(0, 64), &flat(64, 128), Overlap::Disjoint);
    check(&flat(0, 64), &flat(63, 128), Overlap::Partial);
    let all = flat(0, 256);
    for r0 in 0..16 {
        for c0 in 0..16 {
            for rows in [1, 3, 16 - r0] {
                for cols in [1, 5, 16 - c0] {
                    let rows = rows.min(16 - r0);
                    let cols = cols.min(16 - c0);
                    let t = tile(u64::from(r0), u64::from(c0), rows, cols);
                    check(&all, &t, Overlap::Covers);
                }
            }
        }
    }
    // Same offsets and shapes on another identity: never shared.
    let other = memfd_buffer(2, 256);
    let a = tile(0, 0, 16, 16);
    let b = Tensor::new(other, 0, &[16, 16], &[16, 1], DType::U8).unwrap();
    assert_eq!(overlap(&a, &b), Overlap::Disjoint);
    assert_eq!(overlap(&b, &a), Overlap::Disjoint);
}

#[test]
fn transposed_wrapping_and_reshaped_views() {
    let buf = memfd_buffer(1, 1024);
    let v = |off: u64, shape: &[u32], strides: &[u32], d: DType| {
        Tensor::new(buf, off, shape, strides, d).unwrap()
    };
    // A 16×16 F32 matrix; its transpose covers the same bytes.
    let m = v(0, &[16, 16], &[16, 1], DType::F32);
    let mt = v(0, &[16, 16], &[1, 16], DType::F32);
    assert_eq!(overlap(&m, &mt), Overlap::Covers);
    assert_eq!(overlap(&mt, &m), Overlap::Covers);
    // Column 3 of the transpose is row 3 of the matrix: disjoint from row 4.
    let col3_of_t = v(3 * 64, &[16], &[1], DType::F32);
    let row4 = v(4 * 64, &[16], &[1], DType::F32);
    assert_eq!(overlap(&col3_of_t, &row4), Overlap::Disjoint);
    // Even columns vs odd columns of the matrix (innermost stride 2).
    let even = v(0, &[16, 8], &[16, 2], DType::F32);
    let odd = v(4, &[16, 8], &[16, 2], DType::F32);
    assert_eq!(overlap(&even, &odd), Overlap::Disjoint);
    assert_eq!(overlap(&m, &odd), Overlap::Covers);
    // The same bytes as U8 rows of 32 vs F32 rows of 16: the left half of
    // each F32 row is a U8 tile of 32 bytes per 64.
    let left_u8 = v(0, &[16, 32], &[64, 1], DType::U8);
    let right_f32 = v(32, &[16, 8], &[16, 1], DType::F32);
    assert_eq!(overlap(&left_u8, &right_f32), Overlap::Disjoint);
    let left_f32 = v(0, &[16, 8], &[16, 1], DType::F32);
    assert_eq!(overlap(&left_u8, &left_f32), Overlap::Covers);
    // A row-major view whose rows wrap: 4 rows of 20 bytes at offset 12 of a
    // 16-wide U8 matrix runs into the next row; bytes 0..12 of row 0 are free.
    let wrap = v(12, &[4, 20], &[16, 1], DType::U8);
    let head = v(0, &[12], &[1], DType::U8);
    assert_eq!(overlap(&wrap, &head), Overlap::Disjoint);
    let start_of_row1 = v(16, &[4], &[1], DType::U8);
    assert_eq!(overlap(&wrap, &start_of_row1), Overlap::Covers);
    // Cols 12..16 plus 0..4 of the next row, for 4 rows, vs cols 4..12.
    let wrap8 = v(12, &[4, 8], &[16, 1], DType::U8);
    let middle = v(4, &[6, 8], &[16, 1], DType::U8);
    assert_eq!(overlap(&wrap8, &middle), Overlap::Disjoint);
}

#[test]
fn footprint_and_tensor_paths_agree() {
    let buf = memfd_buffer(1, 256);
    let a = Tensor::new(buf, 0, &[4, 4], &[16, 1], DType::U8).unwrap();
    let b = Tensor::new(buf, 8, &[4, 4], &[16, 1], DType::U8).unwrap();
    let (fa, fb) = (Footprint::of(&a), Footprint::of(&b));
    assert_eq!(fa.overlap(&fb), overlap(&a, &b));
    assert_eq!(fa.byte_range(), 0..52);
    assert!(fa.is_exact());
    assert_eq!(fa.identity(), a.identity());
}

/// Pairs per class in the precision test; `STRATA_PRECISION_PAIRS` raises it
/// for a longer sweep.
fn precision_pairs() -> u64 {
    std::env::var("STRATA_PRECISION_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// Per-class tallies against the oracle.
#[derive(Default)]
struct Tally {
    pairs: u64,
    disjoint: u64,
    disjoint_found: u64,
    covers: u64,
    covers_found: u64,
}

/// Precision per class: of the truly disjoint pairs, how many the engine
/// answers Disjoint, and of the truly covering pairs, how many it answers
/// Covers. Wrong answers fail on every class; imprecision fails on the
/// exact classes.
#[test]
fn precision_per_class() {
    let pairs = precision_pairs();
    let mut rows = Vec::new();
    for class in ViewClass::ALL {
        // The large views take the oracle long to enumerate.
        let pairs = if class == ViewClass::ArbitraryLarge {
            pairs / 10
        } else {
            pairs
        };
        let mut t = Tally::default();
        let mut rng = Rng(0x5eed ^ class as u64);
        for _ in 0..pairs {
            let (a, b) = view_pair(class, &mut rng);
            let truth = overlap_by_bytes(&a, &b).unwrap();
            let got = overlap(&a, &b);
            t.pairs += 1;
            t.disjoint += u64::from(truth == Overlap::Disjoint);
            t.disjoint_found += u64::from(truth == Overlap::Disjoint && got == Overlap::Disjoint);
            t.covers += u64::from(truth == Overlap::Covers);
            t.covers_found += u64::from(truth == Overlap::Covers && got == Overlap::Covers);
            // Panics on any wrong Disjoint or Covers, and on any inexact
            // answer in an exact class.
            check_answer(class, &a, &b, got, truth);
        }
        rows.push((class, t));
    }
    let pct = |n: u64, d: u64| {
        if d == 0 {
            "n/a".to_owned()
        } else {
            format!("{:.2}%", 100.0 * n as f64 / d as f64)
        }
    };
    println!(
        "| class | exact? | pairs | truly disjoint | Disjoint precision | truly covering | Covers precision |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (class, t) in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            class.name(),
            if class.is_exact() { "yes" } else { "no" },
            t.pairs,
            t.disjoint,
            pct(t.disjoint_found, t.disjoint),
            t.covers,
            pct(t.covers_found, t.covers)
        );
    }
    for (class, t) in &rows {
        assert!(
            t.disjoint > t.pairs / 50,
            "{class:?}: only {} disjoint pairs generated",
            t.disjoint
        );
        let (min_disjoint, min_covers) = class.min_precision();
        let share = |n: u64, d: u64| {
            if d == 0 {
                100.0
            } else {
                100.0 * n as f64 / d as f64
            }
        };
        assert!(
            share(t.disjoint_found, t.disjoint) >= min_disjoint,
            "{class:?}: Disjoint precision below {min_disjoint}%"
        );
        assert!(
            share(t.covers_found, t.covers) >= min_covers,
            "{class:?}: Covers precision below {min_covers}%"
        );
    }
}

fn class_strategy() -> impl Strategy<Value = ViewClass> {
    proptest::sample::select(ViewClass::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5000))]

    /// Soundness in both directions and for both argument orders.
    #[test]
    fn never_a_wrong_disjoint_or_covers(class in class_strategy(), seed in any::<u64>()) {
        let (a, b) = view_pair(class, &mut Rng(seed));
        for (x, y) in [(&a, &b), (&b, &a)] {
            let truth = overlap_by_bytes(x, y).unwrap();
            check_answer(class, x, y, overlap(x, y), truth);
        }
        // Disjointness is symmetric.
        prop_assert_eq!(overlap(&a, &b) == Overlap::Disjoint, overlap(&b, &a) == Overlap::Disjoint);
        // A view always covers itself.
        prop_assert_eq!(overlap(&a, &a), if Footprint::of(&a).is_exact() { Overlap::Covers } else { Overlap::Partial });
    }
}

/// Small boxes of a huge row-major array (rows of 2^20 I64, 2^18 rows, so
/// byte offsets near 2^41) and views with offsets near 2^62: the arithmetic
/// holds up far from zero, and the answers stay exact on a shared layout.
#[test]
fn huge_offsets_and_strides() {
    let mut rng = Rng(77);
    let big = memfd_buffer(9, 1 << 62);
    const COLS: u64 = 1 << 20;
    for _ in 0..20_000 {
        let tile = |rng: &mut Rng| {
            let (r0, c0) = (
                rng.next_u64() % ((1 << 18) - 4),
                rng.next_u64() % (COLS - 8),
            );
            let (rows, cols) = (rng.range(1, 4), rng.range(1, 8));
            let step = rng.range(1, 3);
            let row_stride = u32::try_from(COLS).unwrap();
            Tensor::new(
                big,
                (r0 * COLS + c0) * 8,
                &[rows, cols],
                &[row_stride, step],
                DType::I64,
            )
            .unwrap()
        };
        // Nearby tiles, so that some of them meet.
        let a = tile(&mut rng);
        let mut b = tile(&mut rng);
        if rng.range(0, 1) == 0 {
            let near = a.byte_offset() + u64::from(rng.range(0, 64)) * 8;
            b = Tensor::new(big, near, b.shape(), b.strides(), DType::I64).unwrap();
        }
        let truth = overlap_by_bytes(&a, &b).unwrap();
        check_answer(ViewClass::Stepped, &a, &b, overlap(&a, &b), truth);

        let far = |rng: &mut Rng| {
            let off = (1u64 << 61) + (rng.next_u64() % (1 << 40)) * 8;
            let shape = [rng.range(1, 4), rng.range(1, 4)];
            let strides = [rng.range(1, u32::MAX / 2), rng.range(1, 1 << 16)];
            Tensor::new(big, off, &shape, &strides, DType::U64).unwrap()
        };
        let (x, y) = (far(&mut rng), far(&mut rng));
        let y = Tensor::new(
            big,
            x.byte_offset() + (y.byte_offset() % 4096) * 8,
            y.shape(),
            y.strides(),
            DType::U64,
        )
        .unwrap();
        let truth = overlap_by_bytes(&x, &y).unwrap();
        check_answer(ViewClass::Arbitrary, &x, &y, overlap(&x, &y), truth);
    }
}
