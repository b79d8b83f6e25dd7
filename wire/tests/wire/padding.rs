//! Padding is alignment slack (docs/wire-format.md §1): records with every pad byte set
//! decode, compare and hash like clean ones, and re-encode with zero pads;
//! the data a producer chose not to fill (body past `body_len`, slots past
//! `ndims`) must still be zero.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use strata_wire::{BufferDescriptor, CanonicalIdentity, HEADER_SIZE, TaskArgs, Tensor};

use crate::sample_tensor;

/// Pad ranges of a descriptor (and of the descriptor at the start of a
/// tensor record): @5..8, the identity's @20..32 (@28..40), @54..56.
const DESCRIPTOR_PADS: [std::ops::Range<usize>; 3] = [5..8, 28..40, 54..56];
/// The tensor's own pad.
const TENSOR_PAD: std::ops::Range<usize> = 141..144;

fn hash_of<T: Hash>(v: &T) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

fn dirty_descriptor(clean: &[u8]) -> Vec<u8> {
    let mut b = clean.to_vec();
    for pad in DESCRIPTOR_PADS {
        b[pad].fill(0xff);
    }
    b
}

fn dirty_tensor(clean: &[u8]) -> Vec<u8> {
    let mut b = dirty_descriptor(clean);
    b[TENSOR_PAD].fill(0xff);
    b
}

#[test]
fn identity_with_dirty_pad_is_the_clean_identity() {
    let id = *sample_tensor().identity();
    let mut b = id.encode();
    b[20..32].fill(0xff);
    let got = CanonicalIdentity::decode(&b).unwrap();
    assert_eq!(got, id);
    assert_eq!(hash_of(&got), hash_of(&id));
    assert_eq!(got.encode(), id.encode());
    assert!(got.encode()[20..32].iter().all(|&x| x == 0));
}

#[test]
fn descriptor_with_dirty_pads_is_the_clean_descriptor() {
    let clean = *sample_tensor().buffer();
    let dirty = dirty_descriptor(&clean.encode());
    assert_ne!(dirty.as_slice(), clean.encode().as_slice());
    let got = BufferDescriptor::decode(&dirty).unwrap();
    assert_eq!(got, clean);
    assert_eq!(hash_of(&got), hash_of(&clean));
    let again = got.encode();
    assert_eq!(again, clean.encode(), "re-encoded with zero padding");
    for pad in DESCRIPTOR_PADS {
        assert!(again[pad.clone()].iter().all(|&x| x == 0), "pad {pad:?}");
    }
}

#[test]
fn tensor_with_dirty_pads_is_the_clean_tensor() {
    let clean = sample_tensor();
    let dirty = dirty_tensor(&clean.encode());
    let got = Tensor::decode(&dirty).unwrap();
    assert_eq!(got, clean);
    assert_eq!(hash_of(&got), hash_of(&clean));
    assert_eq!(got.encode(), clean.encode());
    assert!(got.encode()[TENSOR_PAD].iter().all(|&x| x == 0));
}

#[test]
fn task_args_with_dirty_pads_decode_and_validate() {
    let t = sample_tensor();
    let clean = TaskArgs::new(vec![t, t], vec![7]).unwrap();
    let mut blob = clean.encode();
    for i in 0..2 {
        let at = HEADER_SIZE + i * 144;
        let dirty = dirty_tensor(&blob[at..at + 144]);
        blob[at..at + 144].copy_from_slice(&dirty);
    }
    assert_ne!(blob, clean.encode());
    assert_eq!(TaskArgs::validate(&blob), Ok(()));
    let got = TaskArgs::decode(&blob).unwrap();
    assert_eq!(got, clean);
    assert_eq!(hash_of(&got), hash_of(&clean));
    assert_eq!(got.encode(), clean.encode());
}

/// The rules that are not about padding still hold on a record whose pads
/// are dirty: the pad neither hides nor causes a refusal.
#[test]
fn unfilled_data_must_still_be_zero_next_to_dirty_pads() {
    let dirty = dirty_tensor(&sample_tensor().encode());
    let refused = |at: usize, what: &str| {
        let mut b = dirty.clone();
        b[at] = 1;
        let err = Tensor::decode(&b).expect_err(what);
        err.field().unwrap_or_default().to_owned()
    };
    assert_eq!(refused(80, "body past body_len"), "buffer.body[24]");
    assert_eq!(refused(112, "shape slot past ndims"), "shapes[3]");
    assert_eq!(refused(136, "stride slot past ndims"), "strides[4]");
    assert_eq!(refused(0, "magic"), "buffer.magic");
    let mut no_generation = dirty.clone();
    no_generation[24..28].fill(0);
    assert_eq!(
        Tensor::decode(&no_generation).unwrap_err().field(),
        Some("buffer.identity.generation")
    );
}
