//! The fuzz oracle of the prost → domain conversions (`proto/fuzz`), kept
//! in the library so that `cargo test` replays the committed corpus.

use prost::Message;

use crate::convert::{TaskCompletion, TaskRequest, WorkerStats};
use crate::pb;

/// The first byte picks a message type, the rest are its protobuf bytes.
/// Decoding and converting never panic; whatever converts re-encodes to a
/// message that converts to the same value.
pub fn check_convert_bytes(data: &[u8]) {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % 4 {
        0 => {
            if let Ok(t) = pb::Task::decode(bytes) {
                if let Ok(req) = TaskRequest::try_from(t) {
                    let again = TaskRequest::try_from(pb::Task::from(&req))
                        .expect("a converted task re-encodes to one that converts");
                    assert_eq!(again, req);
                }
            }
        }
        1 => {
            if let Ok(c) = pb::Completion::decode(bytes) {
                if let Ok(done) = TaskCompletion::try_from(c) {
                    let again = TaskCompletion::try_from(pb::Completion::from(done.clone()))
                        .expect("a converted completion re-encodes to one that converts");
                    assert_eq!(again, done);
                }
            }
        }
        2 => {
            if let Ok(s) = pb::StatsReply::decode(bytes) {
                if let Ok(stats) = WorkerStats::try_from(s) {
                    let again = WorkerStats::try_from(pb::StatsReply::from(stats))
                        .expect("converted stats re-encode to stats that convert");
                    assert_eq!(again, stats);
                }
            }
        }
        _ => {
            if let Ok(b) = pb::TaskBatch::decode(bytes) {
                for t in b.tasks {
                    let _ = TaskRequest::try_from(t);
                }
            }
        }
    }
}
