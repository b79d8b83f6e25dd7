//! Cost of one overlap decision per view class, as a distribution over
//! pairs: the median and the 99th percentile across 2,000 pre-drawn pairs,
//! each pair timed as the best of 5 runs of 64 calls (so a pair's figure is
//! its own cost, not the machine's noise). Footprints are computed once per
//! view, as the DAG index does.
//!
//! `cargo bench -p strata-wire --bench overlap_cost`

use std::hint::black_box;
use std::time::Instant;

use strata_wire::Footprint;
use strata_wire::check::{Rng, ViewClass, view_pair};

const PAIRS: usize = 2000;
const CALLS: u32 = 64;

fn main() {
    println!("| class | median ns/pair | p99 ns/pair | max ns/pair |");
    println!("|---|---|---|---|");
    for class in ViewClass::ALL {
        let mut rng = Rng(7 + class as u64);
        let prints: Vec<(Footprint, Footprint)> = (0..PAIRS)
            .map(|_| {
                let (a, b) = view_pair(class, &mut rng);
                (Footprint::of(&a), Footprint::of(&b))
            })
            .collect();
        let mut cost: Vec<f64> = prints
            .iter()
            .map(|(a, b)| {
                (0..5)
                    .map(|_| {
                        let t = Instant::now();
                        for _ in 0..CALLS {
                            black_box(black_box(a).overlap(black_box(b)));
                        }
                        t.elapsed().as_nanos() as f64 / f64::from(CALLS)
                    })
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        cost.sort_by(f64::total_cmp);
        let at = |q: f64| cost[((cost.len() - 1) as f64 * q) as usize];
        println!(
            "| {} | {:.0} | {:.0} | {:.0} |",
            class.name(),
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
}
