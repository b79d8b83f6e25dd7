//! Minting fresh buffer identities, shared by every thread of a driver.

use crate::sync::{AtomicU64, Ordering};
use crate::{CanonicalIdentity, Error};

/// Hands out identities `(owner, 1, 1)`, `(owner, 2, 1)`, ... from any
/// number of threads; no two calls ever get the same identity.
///
/// The owner instance id is chosen by the caller, randomly per orchestrator
/// incarnation, so identities of a restarted driver never collide with the
/// ones its workers may still hold.
///
/// ```
/// use strata_wire::IdentityMint;
/// let mint = IdentityMint::new(*b"strata01");
/// let a = mint.mint().unwrap();
/// let b = mint.mint().unwrap();
/// assert_ne!(a, b);
/// assert_eq!(a.owner_instance_id(), *b"strata01");
/// ```
#[derive(Debug)]
pub struct IdentityMint {
    owner: [u8; 8],
    next: AtomicU64,
}

impl IdentityMint {
    /// A mint for `owner` whose first buffer id is 1 (0 is never handed out,
    /// so it can mean "no buffer" in diagnostics).
    pub fn new(owner: [u8; 8]) -> Self {
        Self::starting_at(owner, 1)
    }

    pub(crate) fn starting_at(owner: [u8; 8], next: u64) -> Self {
        IdentityMint {
            owner,
            next: AtomicU64::new(next),
        }
    }

    /// The owner instance id of every identity this mint hands out.
    pub fn owner(&self) -> [u8; 8] {
        self.owner
    }

    /// A fresh identity, generation 1.
    ///
    /// # Errors
    /// [`Error::IdentitiesExhausted`] once all 2^64 − 1 ids are used; the
    /// counter never wraps, so an id is never handed out twice.
    pub fn mint(&self) -> Result<CanonicalIdentity, Error> {
        // Uniqueness needs only the atomicity of the read-modify-write; no
        // other memory is published through this counter, hence Relaxed.
        let id = self
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                if n == u64::MAX { None } else { Some(n + 1) }
            })
            .map_err(|_| Error::IdentitiesExhausted)?;
        CanonicalIdentity::new(self.owner, id, 1)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn exhaustion_is_an_error_not_a_wrap() {
        let mint = IdentityMint::starting_at([7; 8], u64::MAX - 1);
        assert_eq!(mint.mint().unwrap().buffer_id(), u64::MAX - 1);
        assert_eq!(mint.mint(), Err(Error::IdentitiesExhausted));
        assert_eq!(mint.mint(), Err(Error::IdentitiesExhausted));
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Three threads mint concurrently: all identities are distinct and
    /// together are exactly the ids 1..=6.
    #[test]
    fn concurrent_mints_are_unique_and_dense() {
        loom::model(|| {
            let mint = Arc::new(IdentityMint::new([1; 8]));
            let handles: Vec<_> = (0..3)
                .map(|_| {
                    let mint = Arc::clone(&mint);
                    thread::spawn(move || [mint.mint().unwrap(), mint.mint().unwrap()])
                })
                .collect();
            let mut ids: Vec<u64> = handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .map(|i| i.buffer_id())
                .collect();
            ids.sort_unstable();
            assert_eq!(ids, vec![1, 2, 3, 4, 5, 6]);
        });
    }

    /// Two threads race for the last id: exactly one gets it, the other is
    /// told the space is exhausted.
    #[test]
    fn last_id_is_handed_out_once() {
        loom::model(|| {
            let mint = Arc::new(IdentityMint::starting_at([2; 8], u64::MAX - 1));
            let other = Arc::clone(&mint);
            let t = thread::spawn(move || other.mint());
            let mine = mint.mint();
            let theirs = t.join().unwrap();
            let ok: Vec<_> = [mine, theirs].into_iter().filter_map(Result::ok).collect();
            assert_eq!(ok.len(), 1);
            assert_eq!(ok[0].buffer_id(), u64::MAX - 1);
        });
    }
}
