//! Little-endian field readers and writers over fixed-size records.
//!
//! Decoders first check the record length, then read fields in layout order
//! through [`Reader`]; every read is checked, so a mistake in this crate's
//! layout code surfaces as an error, never as a panic.

use crate::Error;

/// Sequential little-endian reader over one record.
pub(crate) struct Reader<'a> {
    what: &'static str,
    total: usize,
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(what: &'static str, bytes: &'a [u8]) -> Self {
        Reader {
            what,
            total: bytes.len(),
            rest: bytes,
        }
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        let Some((head, rest)) = self.rest.split_first_chunk::<N>() else {
            return Err(Error::Truncated {
                what: self.what,
                needed: self.offset().saturating_add(N),
                available: self.total,
            });
        };
        self.rest = rest;
        Ok(*head)
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if n > self.rest.len() {
            return Err(Error::Truncated {
                what: self.what,
                needed: self.offset().saturating_add(n),
                available: self.total,
            });
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Error> {
        Ok(u8::from_le_bytes(self.array()?))
    }
    pub(crate) fn u16(&mut self) -> Result<u16, Error> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn i32(&mut self) -> Result<i32, Error> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Byte offset of the next read within the record.
    pub(crate) fn offset(&self) -> usize {
        self.total - self.rest.len()
    }
}

/// Sequential little-endian writer into a fixed-size record.
pub(crate) struct Writer<const N: usize> {
    buf: [u8; N],
    at: usize,
}

impl<const N: usize> Writer<N> {
    pub(crate) fn new() -> Self {
        Writer { buf: [0; N], at: 0 }
    }

    pub(crate) fn put(&mut self, bytes: &[u8]) {
        let end = self.at + bytes.len();
        if let Some(dst) = self.buf.get_mut(self.at..end) {
            dst.copy_from_slice(bytes);
        } else {
            debug_assert!(false, "record layout overflows {N} bytes");
        }
        self.at = end;
    }

    pub(crate) fn zeros(&mut self, n: usize) {
        self.at += n;
    }

    pub(crate) fn finish(self) -> [u8; N] {
        debug_assert_eq!(self.at, N, "record layout does not fill {N} bytes");
        self.buf
    }
}

pub(crate) fn exact_len(what: &'static str, bytes: &[u8], size: usize) -> Result<(), Error> {
    match bytes.len().cmp(&size) {
        std::cmp::Ordering::Less => Err(Error::Truncated {
            what,
            needed: size,
            available: bytes.len(),
        }),
        std::cmp::Ordering::Greater => Err(Error::TrailingBytes {
            what,
            expected: size,
            available: bytes.len(),
        }),
        std::cmp::Ordering::Equal => Ok(()),
    }
}
