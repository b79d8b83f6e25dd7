//! The overlap engine against the byte-set oracle, on view pairs drawn from
//! the input's seed and class byte. The oracle lives in `strata_wire::check`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| strata_wire::check::check_overlap_seed(data));
