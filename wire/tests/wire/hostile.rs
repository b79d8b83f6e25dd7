//! Hostile input: boundary values in every 4-byte word, and arbitrary bytes.
//! The decoders must return an error or a valid value, never panic, and
//! agree with the reference reading of the rules.

use proptest::prelude::*;
use strata_wire::check::{
    HOSTILE_WORDS, check_task_args_bytes, check_tensor_bytes, hostile_variants,
};
use strata_wire::{TaskArgs, Tensor, decode_any};

use crate::sample_tensor;

#[test]
fn every_word_of_a_tensor() {
    let record = sample_tensor().encode();
    let mut accepted = 0;
    let mut total = 0;
    for variant in hostile_variants(&record) {
        check_tensor_bytes(&variant);
        total += 1;
        accepted += usize::from(Tensor::decode(&variant).is_ok());
    }
    assert_eq!(total, 36 * HOSTILE_WORDS.len());
    // Some edits are harmless (nbytes, ids, the owner path id): the test
    // exercises both outcomes.
    assert!(
        accepted > 0 && accepted < total,
        "{accepted} of {total} accepted"
    );
}

#[test]
fn every_word_of_a_blob() {
    let t = sample_tensor();
    let blob = TaskArgs::new(vec![t], vec![5, 6]).unwrap().encode();
    for variant in hostile_variants(&blob) {
        check_task_args_bytes(&variant);
    }
    // The header alone, followed by nothing, by one tensor, and by a lot.
    for tail in [0usize, 144, 4096] {
        let mut bytes = vec![0u8; 8 + tail];
        bytes[8..]
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 251) as u8);
        for variant in hostile_variants(&bytes[..8]) {
            let mut v = variant.clone();
            v.extend_from_slice(&bytes[8..]);
            check_task_args_bytes(&v);
        }
    }
}

#[test]
fn every_pair_of_header_words() {
    for &t in &HOSTILE_WORDS {
        for &s in &HOSTILE_WORDS {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&t.to_le_bytes());
            bytes.extend_from_slice(&s.to_le_bytes());
            bytes.resize(8 + 2 * 144, 0xab);
            check_task_args_bytes(&bytes);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_tensor_bytes(bytes in proptest::collection::vec(any::<u8>(), 144)) {
        check_tensor_bytes(&bytes);
    }

    #[test]
    fn arbitrary_blob_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        check_task_args_bytes(&bytes);
        let _ = decode_any(&bytes);
    }

    /// Single-byte corruptions of a valid record keep the oracle agreement.
    #[test]
    fn corrupted_tensor(at in 0usize..144, value in any::<u8>()) {
        let mut bytes = sample_tensor().encode();
        bytes[at] = value;
        check_tensor_bytes(&bytes);
    }
}
