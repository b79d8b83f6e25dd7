//! Packed-byte strings kept for the next task's view bytes.
//!
//! A staged task's packed bytes are tens of megabytes that live until
//! tonic has encoded them. Freshly allocated, every page of them is a page
//! fault and a page the kernel zeroes before the pack writes it — measured
//! as the largest single cost of sending view bytes. Recycled, the pages
//! stay resident and are only written. The pool keeps at most
//! [`KEEP_BYTES`] per endpoint, so a worker that once received a large
//! view costs at most that much memory for as long as it is connected.

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

/// Most bytes of capacity one pool keeps.
const KEEP_BYTES: usize = 128 << 20;

type Shelf = Mutex<Vec<Vec<u8>>>;

/// Strings whose bytes went out, kept for reuse (cheap to clone: shared).
#[derive(Debug, Clone, Default)]
pub(crate) struct Recycler(Arc<Shelf>);

impl Recycler {
    /// An empty string with room for at least `len` bytes: a kept one when
    /// one is large enough (the smallest such), else a new one.
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
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
    pub(crate) fn wrap(&self, bytes: Vec<u8>) -> Bytes {
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
}
