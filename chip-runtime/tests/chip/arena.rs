//! The arena under random allocation sequences, and the run region's reset.

use proptest::prelude::*;
use strata_chip_runtime::Error;
use strata_chip_runtime::arena::{Arena, Region, UNIT};

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64),
    /// Frees the live block at this position (modulo the live count).
    Free(usize),
    /// Frees an address that is not a live block.
    BogusFree(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..6000).prop_map(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Free),
        1 => (0u64..70_000).prop_map(Op::BogusFree),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    /// 10,000 random allocate/free sequences on a 64 KiB persistent region:
    /// after every step the invariants hold (no overlap, 64-byte alignment,
    /// accounting), blocks hold what was asked, a shadow model agrees on
    /// what is live, and out-of-memory is an error naming the region.
    #[test]
    fn persistent_region_keeps_its_invariants(ops in proptest::collection::vec(op(), 1..48)) {
        let arena = Arena::new(64 * 1024, UNIT, UNIT).unwrap();
        let mut live: Vec<(u64, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(n) => match arena.alloc(Region::Persistent, n) {
                    Ok(b) => {
                        prop_assert_eq!(b.offset % UNIT, 0);
                        prop_assert_eq!(b.len, n);
                        prop_assert!(b.offset + n <= 64 * 1024);
                        for &(o, l) in &live {
                            prop_assert!(b.offset + n <= o || o + l <= b.offset, "overlap with a live block");
                        }
                        live.push((b.offset, n));
                    }
                    Err(Error::OutOfMemory { region, asked, free, largest }) => {
                        prop_assert_eq!(region, Region::Persistent);
                        prop_assert_eq!(asked, n);
                        prop_assert!(largest <= free);
                    }
                    Err(e) => prop_assert!(false, "unexpected error {e}"),
                },
                Op::Free(i) if !live.is_empty() => {
                    let (o, l) = live.swap_remove(i % live.len());
                    prop_assert_eq!(arena.free(Region::Persistent, o), Ok(l));
                    prop_assert!(arena.free(Region::Persistent, o).is_err(), "second free refused");
                }
                Op::Free(_) => {}
                Op::BogusFree(addr) => {
                    if !live.iter().any(|&(o, _)| o == addr) {
                        let is_unknown = matches!(arena.free(Region::Persistent, addr), Err(Error::UnknownBlock { .. }));
                        prop_assert!(is_unknown);
                    }
                }
            }
            arena.check_invariants().map_err(TestCaseError::fail)?;
            let s = arena.stats().persistent;
            prop_assert_eq!(s.allocs - s.frees, live.len() as u64);
            let want: u64 = live.iter().map(|&(_, l)| l.div_ceil(UNIT) * UNIT).sum();
            prop_assert_eq!(s.in_use, want);
            prop_assert!(s.peak >= s.in_use);
        }
    }
}

#[test]
fn run_region_bumps_until_full_then_resets() {
    let arena = Arena::new(UNIT, 4 * UNIT, UNIT).unwrap();
    let a = arena.alloc(Region::Run, 1).unwrap();
    let b = arena.alloc(Region::Run, 65).unwrap();
    assert_eq!(
        (a.offset, b.offset),
        (UNIT, 2 * UNIT),
        "run region starts after persistent; 64-byte steps"
    );
    let err = arena.alloc(Region::Run, 2 * UNIT).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            region: Region::Run,
            asked: 128,
            free: 64,
            largest: 64
        }
    );
    assert!(
        err.to_string()
            .contains("run region: asked 128 bytes, 64 bytes free"),
        "{err}"
    );
    assert!(
        arena.free(Region::Run, a.offset).is_err(),
        "run blocks are not freed one by one"
    );
    assert_eq!(arena.reset_run(), 1, "the next run is run 1");
    assert_eq!(arena.stats().run.in_use, 0, "reset returns the cursor to 0");
    assert_eq!(
        arena.check_live(&a),
        Err(Error::RunEnded {
            addr: a.offset,
            run: 0,
            current: 1
        }),
        "a block of the ended run is refused"
    );
    let c = arena.alloc(Region::Run, 4 * UNIT).unwrap();
    assert_eq!((c.offset, c.epoch), (UNIT, 1));
    arena.check_live(&c).unwrap();
    assert!(
        matches!(arena.check_live(&b), Err(Error::RunEnded { .. })),
        "even though block c now covers b's bytes"
    );
    let s = arena.stats().run;
    assert_eq!((s.allocs, s.frees, s.failed, s.peak), (3, 1, 1, 4 * UNIT));
    arena.check_invariants().unwrap();
}

#[test]
fn region_sizes_are_checked() {
    assert!(Arena::new(100, 64, 64).is_err(), "not a multiple of 64");
    assert!(
        Arena::new(64, 64, 1 << 40).is_err(),
        "past the offset allocator's range"
    );
}
