//! The fuzz oracles, and hostile values for every word of a record.

use super::oracle::{check_answer, overlap_by_bytes};
use super::views::{Rng, ViewClass, view_pair};
use crate::{BufferDescriptor, DType, Footprint, TENSOR_SIZE, TaskArgs, Tensor, overlap};

/// An independent reading of the tensor rules of docs/wire-format.md §4, written for
/// clarity rather than speed, to cross-check [`Tensor::decode`].
pub fn reference_tensor_valid(bytes: &[u8]) -> bool {
    if bytes.len() != TENSOR_SIZE {
        return false;
    }
    if !reference_descriptor_valid(&bytes[..crate::DESCRIPTOR_SIZE]) {
        return false;
    }
    reference_view_valid(bytes)
}

/// An independent reading of the buffer-descriptor rules of docs/wire-format.md §3.
/// Padding (@5..8, the identity's @28..40, @54..56) is alignment slack and
/// is not looked at.
pub fn reference_descriptor_valid(bytes: &[u8]) -> bool {
    if bytes.len() != crate::DESCRIPTOR_SIZE {
        return false;
    }
    let le = |at: usize, n: usize| {
        bytes[at..at + n]
            .iter()
            .rev()
            .fold(0u128, |acc, &b| (acc << 8) | u128::from(b))
    };
    let magic = le(0, 2);
    let space = le(2, 1);
    let access = le(3, 1);
    let kind = le(4, 1);
    let generation = le(24, 4);
    let nbytes = le(40, 8);
    let body_len = le(52, 2) as usize;
    let body = &bytes[56..88];
    let descriptor_ok = magic == 0x5342
        && space <= 1
        && access <= 2
        && kind <= 6
        && generation != 0
        && body_len <= 32
        && body[body_len.min(32)..].iter().all(|&b| b == 0)
        && match kind {
            0 | 2 | 4 | 5 => body_len == 8 && le(56, 8) != 0,
            1 => {
                (1..=32).contains(&body_len)
                    && body[..body_len]
                        .iter()
                        .all(|&b| b.is_ascii_graphic() && b != b'/')
            }
            3 => body_len == 0,
            6 => body_len == 16,
            _ => false,
        }
        && match kind {
            2 | 4 => space == 1,
            3 => true,
            _ => space == 0,
        }
        && (kind != 5 || access == 0);
    let _ = nbytes;
    descriptor_ok
}

/// The view part of the tensor rules (bytes 88.. of a record whose
/// descriptor is valid).
fn reference_view_valid(bytes: &[u8]) -> bool {
    let le = |at: usize, n: usize| {
        bytes[at..at + n]
            .iter()
            .rev()
            .fold(0u128, |acc, &b| (acc << 8) | u128::from(b))
    };
    let nbytes = le(40, 8);
    let byte_offset = le(88, 8);
    let ndims = le(96, 4);
    let dtype = le(140, 1);
    // The pad @141..144 is alignment slack: not looked at.
    // The seed's codes 0-14, and strata's extensions 64 (F64), 65 (C64)
    // and 66 (C128).
    if !(1..=5).contains(&ndims) || !(dtype <= 14 || (64..=66).contains(&dtype)) {
        return false;
    }
    let ndims = ndims as usize;
    let mut span = 1u128;
    for i in 0..5 {
        let (shape, stride) = (le(100 + 4 * i, 4), le(120 + 4 * i, 4));
        if i < ndims {
            if shape == 0 || stride == 0 {
                return false;
            }
            span += (shape - 1) * stride;
        } else if shape != 0 || stride != 0 {
            return false;
        }
    }
    // docs/wire-format.md §4 computes the extent "with checked arithmetic": the span in
    // elements must fit 64 bits even where, for FP4 (half a byte each), the
    // extent in bytes would still fit.
    if span > u128::from(u64::MAX) {
        return false;
    }
    let bits = DType::from_code(dtype as u8).unwrap().bits() as u128;
    // A complex element aligns as one of its two parts.
    let align = match dtype {
        65 | 66 => bits / 16,
        _ => (bits / 8).max(1),
    };
    let extent = (span * bits).div_ceil(8);
    byte_offset % align == 0 && byte_offset + extent <= nbytes
}

/// Fuzz oracle for one tensor record: decoding never panics; a decoded
/// tensor re-encodes to bytes that decode to itself, equals what the public
/// constructor builds from its parts, and the reference reading of the rules
/// agrees with the validator on every input.
pub fn check_tensor_bytes(data: &[u8]) {
    let decoded = Tensor::decode(data);
    assert_eq!(
        decoded.is_ok(),
        reference_tensor_valid(data),
        "validator and reference disagree on {data:02x?}: {decoded:?}"
    );
    if data.len() == TENSOR_SIZE {
        assert_eq!(
            Tensor::decode(&zero_tensor_pads(data)),
            decoded,
            "padding changes neither the verdict nor the value"
        );
    }
    if let Ok(t) = decoded {
        assert_eq!(
            t.encode().as_slice(),
            zero_tensor_pads(data).as_slice(),
            "a valid tensor re-encodes to itself, padding zeroed"
        );
        let again = Tensor::decode(&t.encode()).expect("re-encoded tensor must decode");
        assert_eq!(again, t);
        let rebuilt = Tensor::new(
            *t.buffer(),
            t.byte_offset(),
            t.shape(),
            t.strides(),
            t.dtype(),
        );
        assert_eq!(rebuilt, Ok(t));
        let d = BufferDescriptor::decode(&data[..crate::DESCRIPTOR_SIZE])
            .expect("descriptor of a valid tensor");
        assert_eq!(&d, t.buffer());
        assert!(t.end_byte() <= t.buffer().nbytes());
    }
}

/// Fuzz oracle for one buffer descriptor: decoding never panics, agrees
/// with the reference reading of the rules, and a decoded descriptor
/// re-encodes to its bytes (every pad zeroed) and decodes to itself.
pub fn check_descriptor_bytes(data: &[u8]) {
    let decoded = BufferDescriptor::decode(data);
    assert_eq!(
        decoded.is_ok(),
        reference_descriptor_valid(data),
        "validator and reference disagree on {data:02x?}: {decoded:?}"
    );
    if data.len() == crate::DESCRIPTOR_SIZE {
        assert_eq!(
            BufferDescriptor::decode(&zero_descriptor_pads(data)),
            decoded,
            "padding changes neither the verdict nor the value"
        );
    }
    if let Ok(d) = decoded {
        assert_eq!(d.encode().as_slice(), zero_descriptor_pads(data).as_slice());
        assert_eq!(BufferDescriptor::decode(&d.encode()), Ok(d));
    }
}

/// The padding of a descriptor record (and of the descriptor at the start of
/// a tensor record): @5..8, the identity's @20..32 (so @28..40), @54..56.
const DESCRIPTOR_PADS: [std::ops::Range<usize>; 3] = [5..8, 28..40, 54..56];

/// The padding of a tensor record past its descriptor.
const TENSOR_PAD: std::ops::Range<usize> = 141..144;

/// `record` (a descriptor, or at least its 88 bytes) with every descriptor
/// pad zeroed: what strata re-encodes a decoded descriptor to.
fn zero_descriptor_pads(record: &[u8]) -> Vec<u8> {
    let mut out = record.to_vec();
    for pad in DESCRIPTOR_PADS {
        out[pad].fill(0);
    }
    out
}

/// A 144-byte tensor record with every pad zeroed.
fn zero_tensor_pads(record: &[u8]) -> Vec<u8> {
    let mut out = zero_descriptor_pads(record);
    out[TENSOR_PAD].fill(0);
    out
}

/// Fuzz oracle for a TaskArgs blob: decode and validate agree (same error),
/// and a decoded blob round-trips.
pub fn check_task_args_bytes(data: &[u8]) {
    let decoded = TaskArgs::decode(data);
    let validated = TaskArgs::validate(data);
    assert_eq!(
        decoded.as_ref().err(),
        validated.as_ref().err(),
        "decode and validate disagree"
    );
    if let Ok(args) = decoded {
        // Byte-exact except the padding, which decoding ignores.
        let mut expect = data.to_vec();
        for i in 0..args.tensors().len() {
            let at = crate::HEADER_SIZE + i * TENSOR_SIZE;
            let record = &mut expect[at..at + TENSOR_SIZE];
            let clean = zero_tensor_pads(record);
            record.copy_from_slice(&clean);
        }
        assert_eq!(args.encode(), expect, "a valid blob re-encodes to itself");
        assert_eq!(TaskArgs::decode(&args.encode()), Ok(args));
    }
    // Whatever the bytes are, reading them as a single record must not panic.
    let _ = crate::decode_any(data);
}

/// Fuzz oracle for the overlap engine: a pair drawn from the seed in
/// `data` is compared with the byte-set oracle. The engine may never answer
/// Disjoint for views that share a byte, nor Covers when it is false, and it
/// must agree with the oracle exactly on the exact classes.
pub fn check_overlap_seed(data: &[u8]) {
    let mut seed = [0u8; 8];
    for (d, s) in seed.iter_mut().zip(data) {
        *d = *s;
    }
    let class =
        ViewClass::ALL[usize::from(data.get(8).copied().unwrap_or(0)) % ViewClass::ALL.len()];
    let mut rng = Rng(u64::from_le_bytes(seed));
    let (a, b) = view_pair(class, &mut rng);
    let truth = overlap_by_bytes(&a, &b).expect("generated views are small");
    let got = overlap(&a, &b);
    check_answer(class, &a, &b, got, truth);
    let (fa, fb) = (Footprint::of(&a), Footprint::of(&b));
    assert_eq!(fa.overlap(&fb), got, "footprint and tensor paths disagree");
}

/// Values tried in every 4-byte word of a record by the hostile-input tests.
pub const HOSTILE_WORDS: [u32; 12] = [
    0,
    1,
    2,
    5,
    6,
    7,
    0xff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x0001_0000,
    0x5342,
];

/// Every copy of `record` with one aligned 4-byte word replaced by one of
/// [`HOSTILE_WORDS`].
pub fn hostile_variants(record: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    (0..record.len() / 4).flat_map(move |word| {
        HOSTILE_WORDS.iter().map(move |v| {
            let mut copy = record.to_vec();
            copy[word * 4..word * 4 + 4].copy_from_slice(&v.to_le_bytes());
            copy
        })
    })
}
