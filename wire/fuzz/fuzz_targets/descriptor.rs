//! One buffer descriptor: decode is total and agrees with the reference
//! rules; valid records round-trip. The oracle lives in `strata_wire::check`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| strata_wire::check::check_descriptor_bytes(data));
