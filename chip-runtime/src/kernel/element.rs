//! Element types kernels compute on, and dispatch from a runtime dtype.

use half::{bf16, f16};
use num_complex::Complex;
use strata_wire::DType;

/// A plain-old-data type: every bit pattern is a valid value, so any device
/// or host bytes may be read as it.
///
/// # Safety
/// Implementors must be inhabited by every bit pattern of their size and
/// have no padding.
pub unsafe trait Pod: Copy + Send + Sync + std::fmt::Debug + 'static {}

macro_rules! pod {
    ($($t:ty),*) => {$(
        // SAFETY: primitive integers and IEEE floats accept every bit pattern.
        unsafe impl Pod for $t {}
    )*};
}
pod!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64, f16, bf16);

// SAFETY: `Complex` is `repr(C)` of two floats of one type (real, then
// imaginary): no padding, and every bit pattern of each is a float.
unsafe impl Pod for Complex<f32> {}
// SAFETY: as above.
unsafe impl Pod for Complex<f64> {}

/// Sixteen bytes moved whole: the raw element of the 128-bit dtypes
/// (C128) for kernels that move elements without computing on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Bits128(pub [u64; 2]);
// SAFETY: two u64s, no padding; every bit pattern is valid.
unsafe impl Pod for Bits128 {}

/// A type that is the element of one wire dtype, so a view of that dtype
/// may be read as it: the numeric types ([`Element`]) and the complex
/// ones (`num_complex::Complex<f32>` for C64, `Complex<f64>` for C128).
pub trait Typed: Pod + PartialEq {
    /// The wire dtype of this type.
    const DTYPE: DType;
}

impl Typed for Complex<f32> {
    const DTYPE: DType = DType::C64;
}
impl Typed for Complex<f64> {
    const DTYPE: DType = DType::C128;
}

/// A complex element (C64, C128): the arithmetic the built-in kernels do
/// on them, in the precision of their parts.
pub trait ComplexElement:
    Typed + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self>
{
    /// Zero.
    const ZERO: Self;
    /// One.
    const ONE: Self;
    /// `re + 0i` from an f64 (rounded to the part's precision).
    fn real(re: f64) -> Self;
    /// `alpha·self` for a real `alpha`.
    fn scale(self, alpha: f64) -> Self;
    /// The value widened to two f64s, for sums.
    fn widen(self) -> Complex<f64>;
    /// A widened sum narrowed back.
    fn narrow(v: Complex<f64>) -> Self;
}

/// `ComplexElement` for `Complex` of a float part type, through the part's
/// own conversions ([`Element`]).
macro_rules! complex_element {
    ($($p:ty),*) => {$(
        impl ComplexElement for Complex<$p> {
            const ZERO: Self = Complex::new(0.0, 0.0);
            const ONE: Self = Complex::new(1.0, 0.0);
            fn real(re: f64) -> Self {
                Complex::new(<$p>::from_f64(re), 0.0)
            }
            fn scale(self, alpha: f64) -> Self {
                let a = <$p>::from_f64(alpha);
                Complex::new(a * self.re, a * self.im)
            }
            fn widen(self) -> Complex<f64> {
                Complex::new(self.re.to_f64(), self.im.to_f64())
            }
            fn narrow(v: Complex<f64>) -> Self {
                Complex::new(<$p>::from_f64(v.re), <$p>::from_f64(v.im))
            }
        }
    )*};
}
complex_element!(f32, f64);

/// A numeric element type kernels compute on.
pub trait Element: Typed {
    /// The value as f64 (exact for every type but the 64-bit integers).
    fn to_f64(self) -> f64;
    /// The nearest value (floats round; integers saturate, NaN is 0).
    fn from_f64(v: f64) -> Self;
    /// A scalar argument as this type: f64 bits for floats, the low bits in
    /// two's complement for integers.
    fn from_scalar(bits: u64) -> Self;
    /// When a scalar argument's value cannot be this type's (an integer
    /// out of its range): the value as given, and the range, for the
    /// error; `None` when it can (every float can: they round).
    fn scalar_misfit(_bits: u64) -> Option<(String, String)> {
        None
    }
    /// Sum (wrapping for integers; rounded for 16-bit floats).
    fn add(self, other: Self) -> Self;
    /// Product (wrapping for integers; rounded for 16-bit floats).
    fn mul(self, other: Self) -> Self;
}

macro_rules! int_element {
    ($($t:ty => $d:ident),*) => {$(
        impl Typed for $t {
            const DTYPE: DType = DType::$d;
        }
        impl Element for $t {
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(v: f64) -> Self { v as $t }
            fn from_scalar(bits: u64) -> Self { bits as $t }
            fn scalar_misfit(bits: u64) -> Option<(String, String)> {
                // Signed types are sent as i64 bits, unsigned as u64.
                let range = format!("{}..={}", <$t>::MIN, <$t>::MAX);
                if <$t>::MIN == 0 {
                    (bits > <$t>::MAX as u64).then(|| (bits.to_string(), range))
                } else {
                    let v = bits as i64;
                    (v < <$t>::MIN as i64 || v > <$t>::MAX as i64).then(|| (v.to_string(), range))
                }
            }
            fn add(self, other: Self) -> Self { self.wrapping_add(other) }
            fn mul(self, other: Self) -> Self { self.wrapping_mul(other) }
        }
    )*};
}
int_element!(i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64);

impl Typed for f32 {
    const DTYPE: DType = DType::F32;
}

impl Element for f32 {
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn from_scalar(bits: u64) -> Self {
        f64::from_bits(bits) as f32
    }
    fn add(self, other: Self) -> Self {
        self + other
    }
    fn mul(self, other: Self) -> Self {
        self * other
    }
}

impl Typed for f64 {
    const DTYPE: DType = DType::F64;
}

impl Element for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
    fn from_scalar(bits: u64) -> Self {
        f64::from_bits(bits)
    }
    fn add(self, other: Self) -> Self {
        self + other
    }
    fn mul(self, other: Self) -> Self {
        self * other
    }
}

macro_rules! half_element {
    ($($t:ty => $d:ident),*) => {$(
        impl Typed for $t {
            const DTYPE: DType = DType::$d;
        }
        impl Element for $t {
            fn to_f64(self) -> f64 { self.to_f64() }
            fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            fn from_scalar(bits: u64) -> Self { <$t>::from_f64(f64::from_bits(bits)) }
            fn add(self, other: Self) -> Self { <$t>::from_f32(self.to_f32() + other.to_f32()) }
            fn mul(self, other: Self) -> Self { <$t>::from_f32(self.to_f32() * other.to_f32()) }
        }
    )*};
}
half_element!(f16 => F16, bf16 => BF16);

/// Runs `$body` with `$T` bound to the float type of `$dtype` (F32, F64,
/// F16, BF16), or evaluates to an `Err` naming the dtype.
#[macro_export]
#[doc(hidden)]
macro_rules! with_float {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            ::strata_wire::DType::F32 => {
                type $T = f32;
                $body
            }
            ::strata_wire::DType::F64 => {
                type $T = f64;
                $body
            }
            ::strata_wire::DType::F16 => {
                type $T = $crate::half::f16;
                $body
            }
            ::strata_wire::DType::BF16 => {
                type $T = $crate::half::bf16;
                $body
            }
            other => Err(format!(
                "dtype {other} is not a float type this kernel supports"
            )),
        }
    };
}

/// Runs `$body` with `$T` bound to the numeric type of `$dtype` (floats and
/// integers), or evaluates to an `Err` naming the dtype.
#[macro_export]
#[doc(hidden)]
macro_rules! with_numeric {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            ::strata_wire::DType::I8 => { type $T = i8; $body }
            ::strata_wire::DType::I16 => { type $T = i16; $body }
            ::strata_wire::DType::I32 => { type $T = i32; $body }
            ::strata_wire::DType::I64 => { type $T = i64; $body }
            ::strata_wire::DType::U8 => { type $T = u8; $body }
            ::strata_wire::DType::U16 => { type $T = u16; $body }
            ::strata_wire::DType::U32 => { type $T = u32; $body }
            ::strata_wire::DType::U64 => { type $T = u64; $body }
            other => $crate::with_float!(other, $T => $body),
        }
    };
}

/// Runs `$body` with `$T` bound to an unsigned integer of the dtype's width
/// (for kernels that move elements without computing on them), or an `Err`
/// for sub-byte dtypes.
#[macro_export]
#[doc(hidden)]
macro_rules! with_bits {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype.bits() {
            8 => {
                type $T = u8;
                $body
            }
            16 => {
                type $T = u16;
                $body
            }
            32 => {
                type $T = u32;
                $body
            }
            64 => {
                type $T = u64;
                $body
            }
            128 => {
                type $T = $crate::kernel::Bits128;
                $body
            }
            _ => Err(format!(
                "dtype {} has sub-byte elements, which this kernel does not move",
                $dtype
            )),
        }
    };
}

/// Runs `$body` with `$T` bound to the complex type of `$dtype` (C64,
/// C128) when it is one; otherwise evaluates to nothing, so that the
/// caller goes on to its real dtypes.
#[macro_export]
#[doc(hidden)]
macro_rules! if_complex {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            ::strata_wire::DType::C64 => {
                type $T = $crate::num_complex::Complex<f32>;
                return $body;
            }
            ::strata_wire::DType::C128 => {
                type $T = $crate::num_complex::Complex<f64>;
                return $body;
            }
            _ => {}
        }
    };
}

/// The complex dtypes.
pub const COMPLEX_DTYPES: &[DType] = &[DType::C64, DType::C128];

/// The dtypes [`with_float!`] accepts.
pub const FLOAT_DTYPES: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

/// The dtypes [`with_numeric!`] accepts.
pub const NUMERIC_DTYPES: &[DType] = &[
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
];

/// Every dtype of at least one byte ([`with_bits!`] accepts these).
pub fn byte_dtypes() -> Vec<DType> {
    DType::ALL
        .into_iter()
        .filter(|d| !d.is_sub_byte())
        .collect()
}
