//! The chips the conformance tests run on: every test written against
//! `&dyn Device` runs on each chip of a list, opened by spec, and expects
//! the same results on every one.
//!
//! The list: each test's own simulated chips (`sim`, always), then
//! `cuda:0` (with the keys the test needs, such as its memory). The
//! `STRATA_CHIPS` variable replaces it: `;`-separated entries, `sim` for
//! the test's simulated chips and `cuda[:N][,KEY=VALUE...]` for a GPU
//! (`STRATA_CHIPS="sim;cuda:0,mem=2GiB"`, or `cuda:1` alone); a `mem=`
//! given there wins over the test's. A CUDA chip that cannot be opened
//! (no driver, no such GPU, a library missing) is skipped with one line
//! on stdout naming why, and the test passes; with
//! `STRATA_REQUIRE_CUDA=1` it fails instead. A chip that has no body for
//! a kernel the test uses is skipped the same way, naming the kernels
//! (a CUDA chip runs only kernels with a CUDA body).
//!
//! Sim-only, and left on simulated chips: unified mode and what only a
//! simulated chip has — `SimDevice::check_invariants` (run after each
//! test on the simulated chips here), timing mode (`timing.rs`), the
//! device cache's differential programs (`cache.rs`, which compare a
//! staged and a unified chip), the arena's models (`arena.rs`), and the
//! failure and isolation tests that build chips of a few KiB or count a
//! simulated chip's lanes (`failures.rs`, `isolation.rs`).

use std::sync::Arc;

use strata_chip_runtime::{ChipSpec, Device, Registry, SimDevice};
use strata_wire::check::Rng;

/// The variable that replaces the chip list.
pub(crate) const CHIPS_VAR: &str = "STRATA_CHIPS";
/// The variable that turns a CUDA chip's absence into a failure.
pub(crate) const REQUIRE_VAR: &str = "STRATA_REQUIRE_CUDA";

/// A chip a test runs on.
pub(crate) struct Chip {
    /// The spec it was opened with.
    pub(crate) spec: String,
    /// The chip, as every test sees it.
    pub(crate) device: Arc<dyn Device>,
    /// The same chip when it is a simulated one, for its own checks.
    sim: Option<Arc<SimDevice>>,
}

/// One entry of the chip list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A simulated chip, by its full spec.
    Sim(String),
    /// A CUDA chip, by its full spec.
    Cuda(String),
}

/// The chip list for a test whose simulated chips are `sims` and whose
/// CUDA chips need `cuda_keys` (such as `mem=64MiB`), from `listed` (the
/// value of `STRATA_CHIPS`, if set).
///
/// # Errors
/// An entry that is neither `sim` nor a CUDA spec.
pub(crate) fn entries(
    listed: Option<&str>,
    sims: &[&str],
    cuda_keys: &str,
) -> Result<Vec<Entry>, String> {
    let listed = listed.unwrap_or("sim;cuda:0");
    let mut out = Vec::new();
    for item in listed.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "sim" {
            out.extend(sims.iter().map(|s| Entry::Sim((*s).to_owned())));
            continue;
        }
        let spec = match item.parse::<ChipSpec>() {
            Ok(ChipSpec::Cuda(_)) => item,
            Ok(ChipSpec::Sim(_)) => {
                return Err(format!(
                    "{CHIPS_VAR}: {item:?}: name simulated chips as plain sim (each test picks the simulated chips it needs)"
                ));
            }
            Err(e) => return Err(format!("{CHIPS_VAR}: {e}")),
        };
        // The test's keys, but for those the entry names itself.
        let given: Vec<&str> = spec
            .split(',')
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
            .collect();
        let mut full = spec.to_owned();
        for kv in cuda_keys.split(',').filter(|s| !s.is_empty()) {
            let key = kv.split_once('=').map_or(kv, |(k, _)| k);
            if !given.contains(&key) {
                full.push(',');
                full.push_str(kv);
            }
        }
        out.push(Entry::Cuda(full));
    }
    Ok(out)
}

/// Whether a CUDA chip's absence fails the test (`value` of
/// `STRATA_REQUIRE_CUDA`).
pub(crate) fn required(value: Option<&str>) -> bool {
    value.is_some_and(|v| v == "1")
}

/// The line that says a CUDA chip's case is skipped, and how to make it a
/// failure.
pub(crate) fn skip_line(spec: &str, why: &str) -> String {
    format!("conformance on {spec}: skipped, {why} ({REQUIRE_VAR}=1 makes this a failure)")
}

/// Opens the chips of the list; a CUDA chip that cannot be opened is
/// skipped with one line, or fails the test when required.
pub(crate) fn chips(sims: &[&str], cuda_keys: &str) -> Vec<Chip> {
    let listed = std::env::var(CHIPS_VAR).ok();
    let require = required(std::env::var(REQUIRE_VAR).ok().as_deref());
    let list = entries(listed.as_deref(), sims, cuda_keys).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    for entry in list {
        match entry {
            Entry::Sim(spec) => {
                let sim = Arc::new(SimDevice::from_spec(&spec).unwrap());
                out.push(Chip {
                    spec,
                    device: Arc::clone(&sim) as Arc<dyn Device>,
                    sim: Some(sim),
                });
            }
            Entry::Cuda(spec) => match strata_chip_runtime::open(&spec) {
                Ok(device) => out.push(Chip {
                    spec,
                    device,
                    sim: None,
                }),
                Err(e) if require => {
                    panic!("conformance on {spec}: the chip cannot be opened: {e}")
                }
                Err(e) => println!("{}", skip_line(&spec, &e.to_string())),
            },
        }
    }
    out
}

impl Chip {
    /// The kernels of `uses` this chip has no body for.
    pub(crate) fn lacks(&self, reg: &Registry, uses: &[&str]) -> Vec<String> {
        let mut missing = Vec::new();
        for name in uses {
            let handle = reg
                .find(name, 1)
                .unwrap_or_else(|| panic!("no kernel {name}@1"));
            let kernel = reg.get(handle).unwrap();
            if !self.device.runs(kernel.as_ref()) {
                missing.push(format!("{name}@1"));
            }
        }
        missing
    }

    /// What every chip must hold after a test: no scratch in use; and a
    /// simulated chip's own invariants.
    pub(crate) fn check_after(&self) {
        assert_eq!(
            self.device.stats().arena.scratch.in_use,
            0,
            "{}: scratch released after every kernel",
            self.spec
        );
        if let Some(sim) = &self.sim {
            sim.check_invariants().unwrap();
        }
    }
}

/// Runs `f` on each chip of the list (a fresh one each) with the built-in
/// registry and a generator seeded from `seed` (the same seed on every
/// chip: the same cases, the same expected results), then checks what
/// every chip must hold. `uses` names the kernels `f` launches: a chip
/// without a body for one of them is skipped with a line naming them, or
/// fails the test under `STRATA_REQUIRE_CUDA=1`.
pub(crate) fn each_chip(
    seed: u64,
    sims: &[&str],
    cuda_keys: &str,
    uses: &[&str],
    mut f: impl FnMut(&dyn Device, &Registry, &mut Rng),
) {
    let reg = Registry::with_builtins();
    let require = required(std::env::var(REQUIRE_VAR).ok().as_deref());
    for chip in chips(sims, cuda_keys) {
        let lacks = chip.lacks(&reg, uses);
        if !lacks.is_empty() {
            let why = format!("no body for {}", lacks.join(", "));
            // A simulated chip runs every kernel: one that does not is a
            // failure, required or not.
            assert!(
                chip.sim.is_none() && !require,
                "conformance on {}: {why}",
                chip.spec
            );
            println!("{}", skip_line(&chip.spec, &why));
            continue;
        }
        let mut rng = Rng(seed);
        f(chip.device.as_ref(), &reg, &mut rng);
        chip.check_after();
    }
}

#[test]
fn the_chip_list_is_the_tests_sims_and_cuda_unless_the_variable_says() {
    let sims = ["sim:mem=1MiB", "sim:mem=1MiB,mode=unified"];
    let e = entries(None, &sims, "mem=64MiB").unwrap();
    assert_eq!(
        e,
        [
            Entry::Sim("sim:mem=1MiB".into()),
            Entry::Sim("sim:mem=1MiB,mode=unified".into()),
            Entry::Cuda("cuda:0,mem=64MiB".into()),
        ]
    );
    // The variable's keys win over the test's; the rest are added.
    let e = entries(Some("cuda:1,mem=2GiB"), &sims, "mem=64MiB,streams=2").unwrap();
    assert_eq!(e, [Entry::Cuda("cuda:1,mem=2GiB,streams=2".into())]);
    let e = entries(Some(" sim ; "), &sims, "").unwrap();
    assert_eq!(e.len(), 2);
    assert!(
        entries(Some("sim:mem=1MiB"), &sims, "")
            .unwrap_err()
            .contains("name simulated chips as plain sim")
    );
    assert!(
        entries(Some("gpu:0"), &sims, "")
            .unwrap_err()
            .contains("unknown device kind \"gpu\"")
    );
    assert!(required(Some("1")));
    assert!(!required(Some("0")) && !required(None));
    assert_eq!(
        skip_line("cuda:0", "no CUDA driver: libcuda.so.1 could not be loaded"),
        "conformance on cuda:0: skipped, no CUDA driver: libcuda.so.1 could not be loaded (STRATA_REQUIRE_CUDA=1 makes this a failure)"
    );
}

/// Where a CUDA chip cannot be opened, the list leaves it out (having
/// said why) unless it is required; where one can, it is on the list.
#[test]
fn a_cuda_chip_that_cannot_be_opened_is_skipped_or_required() {
    let opened = strata_chip_runtime::open("cuda:0,mem=64MiB");
    let require = required(std::env::var(REQUIRE_VAR).ok().as_deref());
    if require {
        assert!(opened.is_ok(), "{REQUIRE_VAR}=1: {:?}", opened.err());
    }
    if std::env::var(CHIPS_VAR).is_err() && !require {
        let list = chips(&["sim:mem=1MiB"], "mem=64MiB");
        assert_eq!(list.len(), 1 + usize::from(opened.is_ok()));
        assert_eq!(list[0].spec, "sim:mem=1MiB");
    }
}
