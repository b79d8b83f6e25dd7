//! The gRPC codec of every call: prost's, except that a message's buffer
//! is reserved at its encoded size before encoding.
//!
//! tonic's prost encoder writes into a buffer that starts at 8 KiB and
//! grows by doubling, so a task carrying 48 MiB of view bytes was copied
//! about twice over and touched twice the fresh memory it needed; with the
//! size reserved first, its bytes are copied once, into the frame that
//! goes to the socket.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, EncodeBuf, Encoder};

/// prost encoding with the message's buffer reserved up front.
#[derive(Debug, Clone)]
pub(crate) struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedEncoder<T>;
    type Decoder = tonic_prost::ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SizedEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(BufferSettings::default())
    }
}

/// Encodes a prost message into a buffer reserved at its size.
#[derive(Debug, Clone)]
pub(crate) struct SizedEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for SizedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use crate::pb;
    use bytes::Bytes;
    use prost::Message;

    /// A bytes field decodes as a slice of the buffer it came in (tonic
    /// hands prost the message's receive buffer), not as a copy.
    #[test]
    fn a_bytes_field_is_a_slice_of_the_receive_buffer() {
        let msg = pb::Task {
            task_id: 9,
            inline_inputs: vec![pb::InlineBytes {
                arg_index: 3,
                data: Bytes::from(vec![7u8; 100_000]),
                staged: 0,
            }],
            ..Default::default()
        };
        let wire = Bytes::from(msg.encode_to_vec());
        let range = wire.as_ptr_range();
        let back = pb::Task::decode(wire.clone()).expect("decodes");
        assert_eq!(back, msg);
        let data = &back.inline_inputs[0].data;
        assert!(range.contains(&data.as_ptr()), "the field was copied");
    }
}
