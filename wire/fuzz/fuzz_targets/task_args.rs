//! A TaskArgs blob: decode and validate agree and never panic; valid blobs
//! round-trip. The oracle lives in `strata_wire::check`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| strata_wire::check::check_task_args_bytes(data));
