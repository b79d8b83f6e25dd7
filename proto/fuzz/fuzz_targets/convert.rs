//! prost messages from a peer → strata's checked domain types: decoding and
//! converting are total, and what converts round-trips. The oracle lives in
//! `strata_proto::check`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| strata_proto::check::check_convert_bytes(data));
