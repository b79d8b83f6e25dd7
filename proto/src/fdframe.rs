//! The framing of the fd side channel, shared by its two ends (the client
//! in `strata-client`, the server in `strata-worker`).
//!
//! A frame is a little-endian `u32` length, at most
//! [`MAX_FD_FRAME_BYTES`], then that many bytes of one encoded message
//! (`FdHello`, `FdImport` or `FdAck`). The fds of an `FdImport` ride on the
//! frame's first byte, in the same `sendmsg`; moving them is the ends'
//! business, not this module's, which has no IO.
//!
//! ```
//! use strata_proto::fdframe::{self, HEADER_BYTES};
//!
//! let frame = fdframe::encode(b"hello").unwrap();
//! let (header, payload) = frame.split_at(HEADER_BYTES);
//! assert_eq!(fdframe::payload_len(header.try_into().unwrap()).unwrap(), 5);
//! assert_eq!(payload, b"hello");
//! ```

use crate::MAX_FD_FRAME_BYTES;

/// Bytes of a frame's length header.
pub const HEADER_BYTES: usize = 4;

/// Why a frame cannot be written or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A payload longer than [`MAX_FD_FRAME_BYTES`].
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Its length.
        len: u64,
        /// The limit.
        max: usize,
    },
}

impl From<FrameError> for std::io::Error {
    fn from(e: FrameError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

/// One frame carrying `payload`: its length header, then the bytes.
///
/// # Errors
/// [`FrameError::TooLarge`]: the other end would refuse the frame.
pub fn encode(payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    let too_large = || FrameError::TooLarge {
        len: u64::try_from(payload.len()).unwrap_or(u64::MAX),
        max: MAX_FD_FRAME_BYTES,
    };
    if payload.len() > MAX_FD_FRAME_BYTES {
        return Err(too_large());
    }
    let len = u32::try_from(payload.len()).map_err(|_| too_large())?;
    let mut frame = Vec::with_capacity(HEADER_BYTES + payload.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(payload);
    Ok(frame)
}

/// The payload length a frame's header announces, checked against
/// [`MAX_FD_FRAME_BYTES`] before anyone allocates for it.
///
/// # Errors
/// [`FrameError::TooLarge`].
pub fn payload_len(header: [u8; HEADER_BYTES]) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(header);
    match usize::try_from(len) {
        Ok(n) if n <= MAX_FD_FRAME_BYTES => Ok(n),
        _ => Err(FrameError::TooLarge {
            len: u64::from(len),
            max: MAX_FD_FRAME_BYTES,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_refuse_oversize() {
        let frame = encode(&[7; 300]).unwrap();
        assert_eq!(frame.len(), HEADER_BYTES + 300);
        assert_eq!(
            payload_len([frame[0], frame[1], frame[2], frame[3]]),
            Ok(300)
        );
        assert_eq!(encode(&[]).unwrap(), vec![0, 0, 0, 0]);

        let max = vec![0; MAX_FD_FRAME_BYTES];
        assert!(encode(&max).is_ok());
        let over = vec![0; MAX_FD_FRAME_BYTES + 1];
        assert_eq!(
            encode(&over),
            Err(FrameError::TooLarge {
                len: over.len() as u64,
                max: MAX_FD_FRAME_BYTES
            })
        );
        let header = u32::try_from(MAX_FD_FRAME_BYTES + 1).unwrap().to_le_bytes();
        assert!(matches!(
            payload_len(header),
            Err(FrameError::TooLarge { len, .. }) if len == MAX_FD_FRAME_BYTES as u64 + 1
        ));
        assert!(payload_len(u32::MAX.to_le_bytes()).is_err());
    }
}
