//! The one error type of `strata-wire`.

use std::fmt;

/// Why bytes or values were rejected by the wire format.
///
/// Every rejection names the field it is about, with the offending value, so
/// a peer that sent bad bytes can be told exactly what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input ended before the structure did.
    #[error("{what} truncated: needs {needed} bytes, got {available}")]
    Truncated {
        /// What was being decoded (`tensor`, `task args`, ...).
        what: &'static str,
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes present.
        available: usize,
    },
    /// The input continues past the end of the structure.
    #[error("{what} has trailing bytes: expected {expected} bytes, got {available}")]
    TrailingBytes {
        /// What was being decoded.
        what: &'static str,
        /// Bytes the structure occupies.
        expected: usize,
        /// Bytes present.
        available: usize,
    },
    /// A field holds a value the format does not allow.
    #[error("invalid {field} = {value}: {rule}")]
    InvalidField {
        /// Path of the field, such as `tensors[3].buffer.magic`.
        field: String,
        /// The rejected value.
        value: FieldValue,
        /// The rule the value breaks.
        rule: &'static str,
    },
    /// A view reaches past the end of its buffer.
    #[error(
        "{field} out of bounds: byte_offset {byte_offset} + extent {extent} ends past nbytes {nbytes}"
    )]
    ViewOutOfBounds {
        /// Path of the view, such as `tensors[3].view`.
        field: String,
        /// Offset of the view's first byte.
        byte_offset: u64,
        /// Bytes the view spans.
        extent: u64,
        /// Size of the buffer.
        nbytes: u64,
    },
    /// A derived descriptor or view asked for more than its buffer grants.
    #[error(
        "access {requested} is wider than the granted {granted}: a derived descriptor or view may narrow its buffer's access, never widen it"
    )]
    AccessWidened {
        /// What the buffer (or the descriptor derived from) grants.
        granted: crate::Access,
        /// What the derivation asked for.
        requested: crate::Access,
    },
    /// The 2^64 buffer ids of one owner instance are used up.
    #[error("buffer ids of this owner instance are exhausted")]
    IdentitiesExhausted,
}

impl Error {
    pub(crate) fn invalid(
        field: impl Into<String>,
        value: impl Into<FieldValue>,
        rule: &'static str,
    ) -> Self {
        Error::InvalidField {
            field: field.into(),
            value: value.into(),
            rule,
        }
    }

    /// The path of the field this error is about, if it is about one field.
    pub fn field(&self) -> Option<&str> {
        match self {
            Error::InvalidField { field, .. } | Error::ViewOutOfBounds { field, .. } => Some(field),
            _ => None,
        }
    }

    /// Prefixes the field path with the path of the structure that contains
    /// it, so `magic` becomes `tensors[3].buffer.magic`.
    #[must_use]
    pub(crate) fn within(self, prefix: fmt::Arguments<'_>) -> Self {
        match self {
            Error::InvalidField { field, value, rule } => Error::InvalidField {
                field: format!("{prefix}.{field}"),
                value,
                rule,
            },
            Error::ViewOutOfBounds {
                field,
                byte_offset,
                extent,
                nbytes,
            } => Error::ViewOutOfBounds {
                field: format!("{prefix}.{field}"),
                byte_offset,
                extent,
                nbytes,
            },
            other => other,
        }
    }
}

/// A rejected field value, kept as the integer it was on the wire.
///
/// Signed so that the negative counts of a TaskArgs header are shown as they
/// were sent, wide enough for every unsigned field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldValue(pub i128);

impl fmt::Display for FieldValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 >= 256 {
            write!(f, "{} ({:#x})", self.0, self.0)
        } else {
            write!(f, "{}", self.0)
        }
    }
}

macro_rules! field_value_from {
    ($($t:ty),*) => {$(
        impl From<$t> for FieldValue {
            fn from(v: $t) -> Self {
                FieldValue(i128::from(v))
            }
        }
    )*};
}
field_value_from!(u8, u16, u32, u64, i32, i64);

impl From<usize> for FieldValue {
    fn from(v: usize) -> Self {
        // usize is at most 64 bits on every supported target.
        FieldValue(i128::try_from(v).unwrap_or(i128::MAX))
    }
}
