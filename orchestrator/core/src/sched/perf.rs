//! Performance models: how long a kernel takes, learned from history.
//!
//! Every model is per callable *and device kind* (a hash of the worker's
//! device spec, as StarPU keeps one per architecture): a fast chip's history
//! says nothing of a slow one's.
//!
//! - **History.** Per callable and *size class* (a hash of its arguments'
//!   shapes and dtypes, as StarPU's history-based models key by footprint),
//!   the mean and variance of measured kernel times (Welford). A class
//!   seen [`CALIBRATED`] times predicts its mean.
//! - **Regression.** Per callable, a power law `t = a · size^b` fitted by
//!   least squares on `log t` against `log size` over the means of its
//!   classes (size: the bytes its arguments span), for classes not seen
//!   yet; it needs two classes of different sizes.
//! - **Declared cost.** A task may declare its flops up front; with no
//!   history, it is predicted at the flop rate measured over every task that
//!   declared flops (or [`DEFAULT_FLOPS_PER_NS`] before any did).
//! - **Transfers.** Per worker, bytes copied to its chip per nanosecond of
//!   copying, from the completions' own figures.
//!
//! Everything here is an estimate for placement and priorities: a wrong
//! model costs time, never correctness.

use rustc_hash::FxHashMap;

use crate::ids::{KernelHandle, WorkerId};

/// Samples a size class needs before its mean is trusted over the
/// regression.
pub const CALIBRATED: u64 = 2;

/// A class's mean weighs its last samples most: past this many, each new
/// one moves it by 1/`RECENT` (an exponential average), so that the first
/// runs' cold caches and page faults fade instead of weighing forever.
pub const RECENT: u64 = 16;

/// The flop rate assumed before any task that declared flops was measured
/// (10 GFlop/s).
pub const DEFAULT_FLOPS_PER_NS: f64 = 10.0;

/// What a task's member costs, as the driver describes it at submit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Work {
    /// Hash of the arguments' shapes and dtypes (with the callable, the
    /// history key).
    pub class: u64,
    /// Bytes the arguments span (the regression's variable).
    pub size: u64,
    /// Flops the task declared, if it did.
    pub flops: Option<u64>,
    /// The byte sets it touches: (a key naming the exact view, its bytes,
    /// whether it writes them).
    pub data: smallvec::SmallVec<[(u64, u64, bool); 4]>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Welford {
    n: u64,
    mean: f64,
    m2: f64,
}

impl Welford {
    fn add(&mut self, x: f64) {
        self.n += 1;
        let k = self.n.min(RECENT) as f64;
        let d = x - self.mean;
        self.mean += d / k;
        // Welford's sum of squared deviations, aged like the mean once past
        // RECENT (then it stands for the last RECENT samples).
        if self.n > RECENT {
            self.m2 *= 1.0 - 1.0 / k;
        }
        self.m2 += d * (x - self.mean);
    }
}

/// One size class's record, as saved and shown.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    /// The callable's handle.
    pub callable: [u8; 16],
    /// The device kind it ran on (see [`PerfModel`]).
    pub kind: u64,
    /// The size class.
    pub class: u64,
    /// Bytes its arguments span.
    pub size: f64,
    /// Samples.
    pub n: u64,
    /// Mean kernel time (ns).
    pub mean_ns: f64,
    /// Standard deviation (ns).
    pub stddev_ns: f64,
}

/// How well the models predicted: each completion's prediction (made at
/// placement) against its measured kernel time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Accuracy {
    /// Completions that had a prediction.
    pub predicted: u64,
    /// Completions that had none (a callable never seen, no flops).
    pub unpredicted: u64,
    /// Sum of |predicted − measured| / measured over `predicted`.
    pub sum_rel_err: f64,
}

impl Accuracy {
    /// Mean relative error of the predictions made.
    pub fn mean_rel_err(&self) -> f64 {
        if self.predicted == 0 {
            0.0
        } else {
            self.sum_rel_err / self.predicted as f64
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Callable {
    classes: FxHashMap<u64, (f64, Welford)>,
    /// The fitted `(ln a, b)`: refitted when a class is added, and every
    /// [`REFIT_EVERY`] samples after (means move slowly; a completion
    /// should not pay a pass over every class).
    fit: Option<(f64, f64)>,
    /// Samples since the last fit.
    since_fit: u32,
}

/// Samples a callable takes between fits of its power law.
const REFIT_EVERY: u32 = 16;

/// Learned kernel and transfer times, per callable and device kind.
#[derive(Debug, Clone, Default)]
pub struct PerfModel {
    callables: FxHashMap<(KernelHandle, u64), Callable>,
    /// Flops and kernel ns over tasks that declared flops, per device kind.
    flops: FxHashMap<u64, (f64, f64)>,
    /// Bytes and ns copied to each worker's chip.
    links: FxHashMap<WorkerId, (f64, f64)>,
    accuracy: Accuracy,
}

impl PerfModel {
    /// An empty model.
    pub fn new() -> Self {
        PerfModel::default()
    }

    /// The expected kernel time of `work` under `callable` on a chip of
    /// device kind `kind`, in ns, if the model can say.
    pub fn predict(&self, callable: KernelHandle, kind: u64, work: &Work) -> Option<f64> {
        if let Some(c) = self.callables.get(&(callable, kind)) {
            if let Some((_, w)) = c.classes.get(&work.class) {
                if w.n >= CALIBRATED {
                    return Some(w.mean);
                }
            }
            if let (Some((ln_a, b)), true) = (c.fit, work.size > 0) {
                // A fit from a few sizes can extrapolate past any finite
                // time; that is no prediction.
                let p = (ln_a + b * (work.size as f64).ln()).exp();
                if p.is_finite() {
                    return Some(p);
                }
            }
            if let Some((_, w)) = c.classes.get(&work.class) {
                return Some(w.mean);
            }
        }
        work.flops.map(|f| f as f64 / self.flops_per_ns(kind))
    }

    fn flops_per_ns(&self, kind: u64) -> f64 {
        match self.flops.get(&kind) {
            Some(&(f, ns)) if f > 0.0 && ns > 0.0 => f / ns,
            _ => DEFAULT_FLOPS_PER_NS,
        }
    }

    /// A measured kernel time of `work` under `callable`; `predicted` is
    /// what the model said at placement (for [`PerfModel::accuracy`]).
    pub fn observe(
        &mut self,
        callable: KernelHandle,
        kind: u64,
        work: &Work,
        kernel_ns: f64,
        predicted: Option<f64>,
    ) {
        if !(kernel_ns.is_finite() && kernel_ns > 0.0) {
            return;
        }
        match predicted {
            Some(p) => {
                self.accuracy.predicted += 1;
                self.accuracy.sum_rel_err += (p - kernel_ns).abs() / kernel_ns;
            }
            None => self.accuracy.unpredicted += 1,
        }
        let c = self.callables.entry((callable, kind)).or_default();
        let classes = c.classes.len();
        let (size, w) = c
            .classes
            .entry(work.class)
            .or_insert((work.size as f64, Welford::default()));
        *size = work.size as f64;
        w.add(kernel_ns);
        c.since_fit += 1;
        if c.classes.len() != classes || c.since_fit >= REFIT_EVERY {
            c.refit();
        }
        if let Some(f) = work.flops {
            let r = self.flops.entry(kind).or_default();
            r.0 += f as f64;
            r.1 += kernel_ns;
        }
    }

    /// `bytes` copied to `worker`'s chip took `ns`.
    pub fn observe_copy(&mut self, worker: WorkerId, bytes: u64, ns: u64) {
        if bytes > 0 && ns > 0 {
            let l = self.links.entry(worker).or_default();
            l.0 += bytes as f64;
            l.1 += ns as f64;
        }
    }

    /// Expected ns to copy `bytes` to `worker`'s chip: zero until a copy
    /// to it was seen (a chip that never copies shares host memory).
    pub fn copy_ns(&self, worker: WorkerId, bytes: u64) -> f64 {
        match self.links.get(&worker) {
            Some(&(b, ns)) if b > 0.0 => bytes as f64 * ns / b,
            _ => 0.0,
        }
    }

    /// How well predictions matched so far.
    pub fn accuracy(&self) -> Accuracy {
        self.accuracy
    }

    /// Every size class's record.
    pub fn entries(&self) -> Vec<Entry> {
        let mut out: Vec<Entry> = self
            .callables
            .iter()
            .flat_map(|((k, kind), c)| {
                c.classes.iter().map(move |(class, (size, w))| Entry {
                    callable: k.0,
                    kind: *kind,
                    class: *class,
                    size: *size,
                    n: w.n,
                    mean_ns: w.mean,
                    stddev_ns: if w.n > 1 {
                        (w.m2 / (w.n.min(RECENT) - 1) as f64).sqrt()
                    } else {
                        0.0
                    },
                })
            })
            .collect();
        out.sort_by_key(|e| (e.callable, e.kind, e.class));
        out
    }

    /// Adds saved records (from an earlier run) as history.
    pub fn load(&mut self, entries: &[Entry]) {
        for e in entries {
            if e.n == 0 || !(e.mean_ns.is_finite() && e.mean_ns > 0.0) {
                continue;
            }
            let c = self
                .callables
                .entry((KernelHandle(e.callable), e.kind))
                .or_default();
            let var = e.stddev_ns * e.stddev_ns;
            c.classes.insert(
                e.class,
                (
                    e.size,
                    Welford {
                        n: e.n,
                        mean: e.mean_ns,
                        m2: var * (e.n.min(RECENT).saturating_sub(1)) as f64,
                    },
                ),
            );
            c.refit();
        }
    }
}

impl Callable {
    /// Fits the power law over the classes' means again (a callable has a
    /// few classes: one per tile shape it ran on).
    fn refit(&mut self) {
        self.fit = fit(self.classes.values().map(|(s, w)| (*s, w.mean)));
        self.since_fit = 0;
    }
}

/// Least squares of `ln t = ln a + b · ln s`; `None` without two distinct
/// positive sizes (classes of one size, such as one shape in several
/// dtypes, would otherwise leave rounding in the denominator and a slope
/// of any size).
fn fit(points: impl Iterator<Item = (f64, f64)>) -> Option<(f64, f64)> {
    let (mut n, mut sx, mut sy, mut sxx, mut sxy) = (0f64, 0f64, 0f64, 0f64, 0f64);
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for (s, t) in points {
        if s > 0.0 && t > 0.0 {
            let (x, y) = (s.ln(), t.ln());
            n += 1.0;
            sx += x;
            sy += y;
            sxx += x * x;
            sxy += x * y;
            lo = lo.min(s);
            hi = hi.max(s);
        }
    }
    let den = n * sxx - sx * sx;
    if n < 2.0 || hi <= lo || den.abs() < 1e-9 {
        return None;
    }
    let b = (n * sxy - sx * sy) / den;
    let ln_a = (sy - b * sx) / n;
    Some((ln_a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(class: u64, size: u64) -> Work {
        Work {
            class,
            size,
            ..Work::default()
        }
    }

    #[test]
    fn one_size_in_many_classes_fits_nothing() {
        let mut m = PerfModel::new();
        let k = KernelHandle([3; 16]);
        // The same 8-byte size in three classes with different times:
        // no slope can be fitted, so an unseen size gets no prediction
        // from a regression (and none at all without declared flops).
        for (class, ns) in [(1, 10.0), (2, 1e9), (3, 5.0)] {
            m.observe(k, 0, &work(class, 8), ns, None);
        }
        assert_eq!(m.predict(k, 0, &work(4, 1 << 40)), None);
    }

    #[test]
    fn a_prediction_is_always_a_finite_time() {
        let mut m = PerfModel::new();
        let k = KernelHandle([4; 16]);
        // A steep law from two sizes: 1 ns at size 1, 1e300 ns at size 2
        // (slope about 997); a size of 2^40 would be exp(27,000) ns.
        m.observe(k, 0, &work(1, 1), 1.0, None);
        m.observe(k, 0, &work(2, 2), 1e300, None);
        let p = m.predict(k, 0, &work(3, 1 << 40));
        assert!(p.is_none_or(f64::is_finite), "{p:?}");
        let declared = Work {
            flops: Some(1_000),
            ..work(3, 1 << 40)
        };
        assert!(m.predict(k, 0, &declared).is_some_and(f64::is_finite));
    }

    #[test]
    fn history_then_regression_then_flops() {
        let mut m = PerfModel::new();
        let k = KernelHandle([1; 16]);
        assert_eq!(m.predict(k, 0, &work(1, 100)), None);
        let declared = Work {
            flops: Some(1_000_000),
            ..work(9, 10)
        };
        // Before any measurement: the default rate.
        assert_eq!(
            m.predict(KernelHandle([2; 16]), 0, &declared),
            Some(1e6 / DEFAULT_FLOPS_PER_NS)
        );
        // t = 3 · size^1.5 at two sizes.
        for _ in 0..3 {
            m.observe(k, 0, &work(1, 100), 3.0 * 100f64.powf(1.5), None);
            m.observe(k, 0, &work(2, 400), 3.0 * 400f64.powf(1.5), None);
        }
        let hist = m.predict(k, 0, &work(1, 100)).unwrap();
        assert!((hist - 3000.0).abs() < 1e-6, "{hist}");
        let guess = m.predict(k, 0, &work(3, 900)).unwrap();
        assert!(
            (guess - 3.0 * 900f64.powf(1.5)).abs() / guess < 1e-9,
            "{guess}"
        );
        // Measured flop rate: 1e6 flops in 1e4 ns = 100 flops/ns.
        m.observe(KernelHandle([2; 16]), 0, &declared, 1e4, None);
        let other = Work {
            flops: Some(2_000_000),
            ..work(8, 10)
        };
        assert_eq!(m.predict(KernelHandle([3; 16]), 0, &other), Some(2e4));
    }

    #[test]
    fn accuracy_and_round_trip() {
        let mut m = PerfModel::new();
        let k = KernelHandle([5; 16]);
        m.observe(k, 0, &work(1, 8), 100.0, Some(150.0));
        m.observe(k, 0, &work(1, 8), 300.0, None);
        assert_eq!(m.accuracy().predicted, 1);
        assert!((m.accuracy().mean_rel_err() - 0.5).abs() < 1e-12);
        let saved = m.entries();
        assert_eq!(saved.len(), 1);
        assert_eq!((saved[0].n, saved[0].mean_ns), (2, 200.0));
        let mut again = PerfModel::new();
        again.load(&saved);
        assert_eq!(again.entries(), saved);
        assert_eq!(again.predict(k, 0, &work(1, 8)), Some(200.0));
    }

    #[test]
    fn old_samples_fade() {
        let mut m = PerfModel::new();
        let k = KernelHandle([7; 16]);
        // A cold first sample, then a steady state.
        m.observe(k, 0, &work(1, 8), 10_000.0, None);
        for _ in 0..200 {
            m.observe(k, 0, &work(1, 8), 100.0, None);
        }
        let p = m.predict(k, 0, &work(1, 8)).unwrap();
        assert!((p - 100.0).abs() < 1.0, "{p}");
        let e = &m.entries()[0];
        assert!(e.stddev_ns < 10.0, "{e:?}");
    }

    #[test]
    fn each_device_kind_has_its_own_history() {
        let mut m = PerfModel::new();
        let k = KernelHandle([9; 16]);
        for _ in 0..3 {
            m.observe(k, 1, &work(1, 8), 100.0, None);
            m.observe(k, 2, &work(1, 8), 400.0, None);
        }
        assert_eq!(m.predict(k, 1, &work(1, 8)), Some(100.0));
        assert_eq!(m.predict(k, 2, &work(1, 8)), Some(400.0));
        assert_eq!(m.predict(k, 3, &work(1, 8)), None);
        let mut again = PerfModel::new();
        again.load(&m.entries());
        assert_eq!(again.predict(k, 2, &work(1, 8)), Some(400.0));
    }

    #[test]
    fn copies_cost_what_they_cost() {
        let mut m = PerfModel::new();
        let w = WorkerId(0);
        assert_eq!(m.copy_ns(w, 1000), 0.0);
        m.observe_copy(w, 1000, 500);
        assert_eq!(m.copy_ns(w, 4000), 2000.0);
    }
}
