//! Why a client call failed.

use strata_proto::convert::ConvertError;
use tonic::Status;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The worker could not be reached.
    #[error("cannot connect to {endpoint}: {reason}")]
    Connect {
        /// Where.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// The worker refused or failed a call.
    #[error("worker: {}", .0.message())]
    Status(#[from] Status),
    /// The fd channel failed.
    #[error("fd channel: {0}")]
    Io(#[from] std::io::Error),
    /// The data connection failed (`DataConnection`).
    #[error("data connection: {0}")]
    Data(std::io::Error),
    /// The worker sent a malformed message.
    #[error("malformed reply: {0}")]
    Convert(#[from] ConvertError),
    /// A call was made out of order.
    #[error("{0}")]
    Protocol(String),
}

/// An error and its sources, on one line (tonic's transport errors hide the
/// useful part in `source()`).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
