//! Byte strings kept for the next view's bytes, on both sides of a remote
//! link: the driver packs a task's views into them, the worker receives
//! staged bytes into them.
//!
//! View bytes are tens of megabytes that live until they are sent or their
//! task lets go of them. Freshly allocated, every page of them is a page
//! fault and a page the kernel zeroes before the pack or the socket writes
//! it — measured as the largest single cost of moving view bytes. Recycled,
//! the pages stay resident and are only written. A pool keeps at most
//! [`KEEP_BYTES`] of capacity, so a peer that once moved a large view costs
//! at most that much memory for as long as it lives. A kept string is never
//! seen past what the next user wrote into it (it comes back empty, and the
//! `Bytes` of [`Recycler::wrap`] covers only what was written), so one
//! session's bytes never show through in another's.

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

/// Most bytes of capacity one pool keeps.
pub const KEEP_BYTES: usize = 128 << 20;

type Shelf = Mutex<Vec<Vec<u8>>>;

/// Strings whose bytes went out, kept for reuse (cheap to clone: shared).
#[derive(Debug, Clone, Default)]
pub struct Recycler(Arc<Shelf>);

impl Recycler {
    /// An empty string with room for at least `len` bytes: a kept one when
    /// one is large enough (the smallest such), else a new one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let mut shelf = lock(&self.0);
        let best = shelf
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= len)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => shelf.swap_remove(i),
            None => Vec::with_capacity(len),
        }
    }

    /// `bytes` as a message field (no copy); its string comes back to this
    /// pool when the last reference is dropped, if there is room.
    pub fn wrap(&self, bytes: Vec<u8>) -> Bytes {
        Bytes::from_owner(Kept {
            bytes,
            pool: Arc::downgrade(&self.0),
        })
    }
}

fn lock(shelf: &Shelf) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
    shelf.lock().unwrap_or_else(|e| e.into_inner())
}

/// A string on its way out, returning to its pool when dropped.
struct Kept {
    bytes: Vec<u8>,
    pool: Weak<Shelf>,
}

impl AsRef<[u8]> for Kept {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        let mut bytes = std::mem::take(&mut self.bytes);
        let mut shelf = lock(&pool);
        let kept: usize = shelf.iter().map(Vec::capacity).sum();
        if kept + bytes.capacity() <= KEEP_BYTES {
            bytes.clear();
            shelf.push(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_comes_back_once_its_bytes_are_dropped() {
        let pool = Recycler::default();
        let mut v = pool.take(1000);
        v.extend_from_slice(&[5; 1000]);
        let ptr = v.as_ptr();
        let b = pool.wrap(v);
        let c = b.clone();
        assert_eq!(&b[..], &[5; 1000][..]);
        drop(b);
        let other = pool.take(10);
        assert_ne!(other.as_ptr(), ptr, "still in use by a clone");
        drop(c);
        let again = pool.take(10);
        assert_eq!(again.as_ptr(), ptr, "reused");
        assert!(again.is_empty());
        // Nothing larger than the pool keeps is kept.
        drop(pool.wrap(Vec::with_capacity(KEEP_BYTES + 1)));
        assert!(lock(&pool.0).is_empty());
    }

    #[test]
    fn a_kept_string_comes_back_empty_and_is_reused_until_the_pool_is_full() {
        let pool = Recycler::default();
        let mut v = pool.take(100);
        v.extend_from_slice(&[9; 100]);
        let at = v.as_ptr();
        let b = pool.wrap(v);
        assert_eq!(&b[..], &[9; 100][..]);
        let other = pool.take(10);
        assert_ne!(other.as_ptr(), at, "still lent");
        drop(b);
        let again = pool.take(10);
        assert_eq!(again.as_ptr(), at, "reused");
        assert!(again.is_empty(), "nothing of the last user shows");
        drop(pool.wrap(Vec::with_capacity(KEEP_BYTES + 1)));
        assert!(lock(&pool.0).is_empty(), "too large to keep");
    }
}
