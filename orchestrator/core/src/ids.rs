//! Typed ids of the cores. A task's id and a callable's handle cross
//! process boundaries and are the wire format's ([`strata_wire::TaskId`],
//! [`strata_wire::KernelHandle`]): one type for each, from the protocol up.

use std::fmt;

pub use strata_wire::{KernelHandle, TaskId};

/// A worker endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u32);

/// A scope bounding the lifetime of intermediate buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeId(pub u64);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {}", self.0)
    }
}

/// A hash map keyed by ids handed out in increasing order (task ids): see
/// [`SeqHasher`].
pub type SeqMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<SeqHasher>>;

/// A set of ids handed out in increasing order, laid out as [`SeqMap`]
/// lays out its keys.
pub(crate) type SeqSet<K> = std::collections::HashSet<K, std::hash::BuildHasherDefault<SeqHasher>>;

/// The hasher of [`SeqMap`]: ids in one block of 256 take consecutive
/// bucket positions, and each block is placed at a multiplicative hash of
/// its number. The live ids — a window that slides forward as tasks are
/// submitted and finish — then sit in runs, and the records touched one
/// after another (just submitted; finishing in order) share cache lines
/// and pages. A mixing hash (Fx) scattered them over a table of 50,000
/// live tasks, so inserting or removing one was a cache miss. Placing
/// blocks by hash keeps ids that share their low bits (every 64th task
/// live, say) spread over the table, where an identity hash would pile
/// them on a few positions. The table compares the top seven bits of a
/// hash before a key: the multiply fills them per block, and the id's
/// low seven bits are XORed in, so that the ids of one block — neighbours
/// in the table — do not all look alike there (without it, the stencil's
/// driver ran 1.5–2 % more instructions, callgrind).
///
/// For ids handed out in increasing order; any key stays correct, only
/// slower when it does not hash as one `u64`. The price is memory: a slot
/// freed inside a run of full ones becomes a tombstone, not an empty slot,
/// so under a steady stream the table holds about twice the buckets a
/// mixing hash needs (measured: 229,375 against 114,688 for 65,536 live
/// ids). Keep its values small — the DAG's nodes and the actor's records
/// are boxed: a 368-byte node inline cost the 5M-task soak 100 MB of RSS.
#[derive(Debug, Default, Clone, Copy)]
pub struct SeqHasher(u64);

/// Ids per block of consecutive positions, as a shift.
const SEQ_BLOCK: u32 = 8;

impl std::hash::Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        self.0
            .wrapping_add((self.0 >> SEQ_BLOCK).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            ^ (self.0 << 57)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(8) ^ n;
    }
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, BuildHasherDefault};

    use super::*;

    fn hash(id: u64) -> u64 {
        BuildHasherDefault::<SeqHasher>::default().hash_one(TaskId(id))
    }

    #[test]
    fn a_block_of_ids_takes_consecutive_positions() {
        // The bucket position is the low bits; the top seven are the tag.
        let position = |h: u64| h & ((1 << 57) - 1);
        let base = position(hash(5 << SEQ_BLOCK));
        let mut tags = std::collections::HashSet::new();
        for i in 0..256 {
            let h = hash((5 << SEQ_BLOCK) + i);
            assert_eq!(position(h), base + i);
            tags.insert(h >> 57);
        }
        assert_eq!(tags.len(), 128, "a block's ids take every tag");
    }

    #[test]
    fn strided_ids_spread_over_the_table() {
        // Every 1024th id, in a table of 1024 buckets: an identity hash
        // puts all of them on one position.
        let positions: std::collections::HashSet<u64> =
            (0..512u64).map(|j| hash(7 + 1024 * j) & 1023).collect();
        assert!(
            positions.len() >= 200,
            "{} distinct positions",
            positions.len()
        );
    }

    #[test]
    fn a_seq_map_is_a_map() {
        let mut m: SeqMap<TaskId, u64> = SeqMap::default();
        for i in (0..100_000).step_by(3) {
            m.insert(TaskId(i), i * 2);
        }
        for i in (0..100_000).step_by(3) {
            assert_eq!(m.remove(&TaskId(i)), Some(i * 2));
        }
        assert!(m.is_empty());
    }
}
