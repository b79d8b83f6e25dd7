//! Element types of tensors and their sizes.

/// The element type of a tensor. The discriminant is the wire code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 binary32.
    F32 = 0,
    /// IEEE 754 binary16.
    F16 = 1,
    /// Signed 32-bit integer.
    I32 = 2,
    /// Signed 16-bit integer.
    I16 = 3,
    /// Signed 8-bit integer.
    I8 = 4,
    /// Unsigned 8-bit integer.
    U8 = 5,
    /// bfloat16.
    BF16 = 6,
    /// Signed 64-bit integer.
    I64 = 7,
    /// Unsigned 64-bit integer.
    U64 = 8,
    /// Unsigned 16-bit integer.
    U16 = 9,
    /// Unsigned 32-bit integer.
    U32 = 10,
    /// One byte per boolean.
    Bool = 11,
    /// 8-bit float, 4 exponent bits, 3 mantissa bits, finite only.
    Fp8E4M3Fn = 12,
    /// 8-bit exponent-only float (a scale factor).
    Fp8E8M0 = 13,
    /// 4-bit float, two values per byte (element 2k in the low nibble).
    Fp4E2M1 = 14,
    /// IEEE 754 binary64: a strata extension, outside the seed's codes
    /// (see [`DType::is_extension`]).
    F64 = 64,
    /// Complex of two binary32 (real part first, as numpy's `complex64`):
    /// a strata extension.
    C64 = 65,
    /// Complex of two binary64 (real part first, as numpy's
    /// `complex128`): a strata extension.
    C128 = 66,
}

impl DType {
    /// The first code past the seed format's own: codes from here on are
    /// strata's extensions, which a consumer of the seed format refuses as
    /// unknown. Everything else about them (identity, overlap, inference)
    /// is the same as for seed dtypes.
    pub const FIRST_EXTENSION_CODE: u8 = 64;

    /// Every dtype, in code order.
    pub const ALL: [DType; 18] = [
        DType::F32,
        DType::F16,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U8,
        DType::BF16,
        DType::I64,
        DType::U64,
        DType::U16,
        DType::U32,
        DType::Bool,
        DType::Fp8E4M3Fn,
        DType::Fp8E8M0,
        DType::Fp4E2M1,
        DType::F64,
        DType::C64,
        DType::C128,
    ];

    /// The dtype with wire code `code`, if there is one.
    pub const fn from_code(code: u8) -> Option<DType> {
        Some(match code {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::I32,
            3 => DType::I16,
            4 => DType::I8,
            5 => DType::U8,
            6 => DType::BF16,
            7 => DType::I64,
            8 => DType::U64,
            9 => DType::U16,
            10 => DType::U32,
            11 => DType::Bool,
            12 => DType::Fp8E4M3Fn,
            13 => DType::Fp8E8M0,
            14 => DType::Fp4E2M1,
            64 => DType::F64,
            65 => DType::C64,
            66 => DType::C128,
            _ => return None,
        })
    }

    /// The wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Whether this is a strata extension (code at or past
    /// [`DType::FIRST_EXTENSION_CODE`]), not a seed dtype.
    pub const fn is_extension(self) -> bool {
        self.code() >= Self::FIRST_EXTENSION_CODE
    }

    /// Bits per element: 4 for FP4E2M1, a multiple of 8 otherwise (128
    /// for C128).
    pub const fn bits(self) -> u32 {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 16,
            DType::I8 | DType::U8 | DType::Bool | DType::Fp8E4M3Fn | DType::Fp8E8M0 => 8,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 64,
            DType::C128 => 128,
            DType::Fp4E2M1 => 4,
        }
    }

    /// Whether elements are complex numbers (C64, C128): two floats, the
    /// real part first.
    pub const fn is_complex(self) -> bool {
        matches!(self, DType::C64 | DType::C128)
    }

    /// Whether several elements share one byte (FP4E2M1).
    pub const fn is_sub_byte(self) -> bool {
        self.bits() < 8
    }

    /// The alignment unit of a byte offset: the element size in bytes, or 1
    /// for sub-byte types, whose views start on a byte boundary; for the
    /// complex types the size of one part (4 for C64, 8 for C128), as
    /// numpy aligns them.
    pub const fn align_bytes(self) -> u64 {
        match self {
            DType::C64 => 4,
            DType::C128 => 8,
            _ => match self.bits() {
                4 | 8 => 1,
                16 => 2,
                32 => 4,
                _ => 8,
            },
        }
    }

    /// The canonical upper-case name, as used in JSON and graph files.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::I32 => "I32",
            DType::I16 => "I16",
            DType::I8 => "I8",
            DType::U8 => "U8",
            DType::BF16 => "BF16",
            DType::I64 => "I64",
            DType::U64 => "U64",
            DType::U16 => "U16",
            DType::U32 => "U32",
            DType::Bool => "BOOL",
            DType::Fp8E4M3Fn => "FP8E4M3FN",
            DType::Fp8E8M0 => "FP8E8M0",
            DType::Fp4E2M1 => "FP4E2M1",
            DType::F64 => "F64",
            DType::C64 => "C64",
            DType::C128 => "C128",
        }
    }

    /// The dtype named `name` (case-insensitive), if there is one.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
    }

    /// Bytes spanned by `elems` consecutive elements starting on a byte
    /// boundary, or `None` on overflow.
    pub fn bytes_for(self, elems: u64) -> Option<u64> {
        match self.bits() {
            4 => Some(elems.div_ceil(2)),
            bits => elems.checked_mul(u64::from(bits / 8)),
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_sizes_match_the_wire_format() {
        let sizes_bits = [32, 16, 32, 16, 8, 8, 16, 64, 64, 16, 32, 8, 8, 8, 4];
        for (code, bits) in sizes_bits.into_iter().enumerate() {
            let code = u8::try_from(code).unwrap();
            let d = DType::from_code(code).unwrap();
            assert_eq!(d.code(), code);
            assert_eq!(d.bits(), bits, "{d}");
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(DType::from_name(&d.name().to_lowercase()), Some(d));
        }
        assert_eq!(DType::from_code(15), None);
        assert_eq!(DType::from_code(63), None);
        let f64 = DType::from_code(64).unwrap();
        assert_eq!(
            (f64, f64.bits(), f64.is_extension()),
            (DType::F64, 64, true)
        );
        assert!(!DType::Fp4E2M1.is_extension());
        assert_eq!(DType::from_name("f64"), Some(DType::F64));
        for (code, d, bits, align) in [(65, DType::C64, 64, 4), (66, DType::C128, 128, 8)] {
            assert_eq!(DType::from_code(code), Some(d));
            assert_eq!((d.code(), d.bits(), d.align_bytes()), (code, bits, align));
            assert!(d.is_extension() && d.is_complex());
            assert_eq!(DType::from_name(&d.name().to_lowercase()), Some(d));
            assert_eq!(d.bytes_for(3), Some(u64::from(bits / 8) * 3));
        }
        assert!(!DType::F64.is_complex());
        assert_eq!(DType::from_code(67), None);
        assert_eq!(DType::from_code(255), None);
        assert_eq!(DType::Fp4E2M1.bytes_for(3), Some(2));
        assert_eq!(DType::Fp4E2M1.align_bytes(), 1);
        assert_eq!(DType::I64.align_bytes(), 8);
    }
}
