//! Replays the committed fuzz corpus of the conversions
//! (`proto/fuzz/corpus/convert/`) through the fuzz oracle.

use std::path::Path;

#[test]
fn convert_corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/convert");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(e.unwrap().path()).unwrap();
        strata_proto::check::check_convert_bytes(&bytes);
        n += 1;
    }
    assert!(n > 0, "corpus {} is empty", dir.display());
}

/// A view whose strides overlap so that its three 2^20-long axes cover
/// only 3 MiB, with one inline byte: refused at once (walking its 2^60
/// elements is what the fuzzer found hanging the conversion).
#[test]
fn a_huge_overlapping_inline_view_is_refused_without_walking_it() {
    use prost::Message;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/convert");
    let bytes = std::fs::read(dir.join("regression-huge-overlapping-view")).unwrap();
    let task = strata_proto::pb::Task::decode(&bytes[1..]).unwrap();
    let t0 = std::time::Instant::now();
    let e = strata_proto::convert::TaskRequest::try_from(task).unwrap_err();
    assert!(t0.elapsed() < std::time::Duration::from_secs(1));
    let e = e.to_string();
    assert!(
        e.contains("inline_inputs[0]") && e.contains("elements, more than 1 bytes"),
        "{e}"
    );
}
