// strata's CUDA prelude: compiled in front of every kernel source.
//
// A tensor argument arrives by value as a strata_tensor, the 128-byte
// ChipTensor layout (docs/wire-format.md): addr is a device address and
// element [i0, .., in] lies start_offset + sum(ik * stride[k]) elements
// from it. Scalars arrive as unsigned long long, the task's 64-bit words.

typedef unsigned long long strata_u64;
typedef long long strata_i64;

struct __align__(64) strata_tensor {
    strata_u64 addr;
    strata_u64 size;
    strata_u64 start_offset;
    unsigned int shape[5];
    unsigned int stride[5];
    unsigned int ndims;
    unsigned char dtype;
    unsigned char address_space;
    unsigned char contiguous;
    unsigned char pad_[57];
};

// Loops over axes run to the constant 5 and skip the axes past ndims,
// rather than stopping at ndims: fully unrolled, they index a tensor's
// arrays by constants, and a parameter indexed by a run-time value would
// be copied to local memory by every thread.
#if defined(__CUDACC__)
#define STRATA_UNROLL _Pragma("unroll")
#else
#define STRATA_UNROLL
#endif

// Elements of t.
__device__ __forceinline__ strata_u64 strata_numel(const strata_tensor& t) {
    strata_u64 n = 1;
    STRATA_UNROLL
    for (unsigned int k = 0; k < 5; ++k) {
        if (k < t.ndims) n *= t.shape[k];
    }
    return n;
}

// Element offset (in elements, from addr) of the element whose row-major
// index over t's shape is i. A contiguous view (row-major, no gap: the
// chip sets the flag from the strides) skips the divisions.
__device__ __forceinline__ strata_u64 strata_offset(const strata_tensor& t, strata_u64 i) {
    if (t.contiguous) return t.start_offset + i;
    strata_u64 off = t.start_offset;
    STRATA_UNROLL
    for (int k = 4; k >= 0; --k) {
        if ((unsigned int)k < t.ndims) {
            const strata_u64 n = t.shape[k];
            off += (i % n) * t.stride[k];
            i /= n;
        }
    }
    return off;
}

// Extent and stride of axis k (0 past the last axis), by constant indices.
__device__ __forceinline__ unsigned int strata_shape_at(const strata_tensor& t, unsigned int k) {
    unsigned int v = 0;
    STRATA_UNROLL
    for (unsigned int j = 0; j < 5; ++j) {
        if (j == k && j < t.ndims) v = t.shape[j];
    }
    return v;
}
__device__ __forceinline__ unsigned int strata_stride_at(const strata_tensor& t, unsigned int k) {
    unsigned int v = 0;
    STRATA_UNROLL
    for (unsigned int j = 0; j < 5; ++j) {
        if (j == k && j < t.ndims) v = t.stride[j];
    }
    return v;
}

// The element whose row-major index over t's shape is i.
template <typename T>
__device__ __forceinline__ T* strata_at(const strata_tensor& t, strata_u64 i) {
    return reinterpret_cast<T*>(t.addr) + strata_offset(t, i);
}

// ---- Launch shapes ---------------------------------------------------------
//
// Grid::Elements launches blockDim.x threads on gridDim.x blocks: a kernel
// walks its elements with strata_first_element / strata_element_stride (a
// grid-stride loop), so any grid covers every element. Grid::Rows launches
// one block per row: a kernel walks its rows with strata_first_row /
// strata_row_stride (blockIdx.y counts on from gridDim.x, so more rows than
// one axis of blocks holds still work) and shares each row among the
// block's threads.

// Threads a block of Elements and Rows launches; the shared arrays of the
// row kernels hold this many, and threads past it sit out.
#define STRATA_THREADS 256u

__device__ __forceinline__ strata_u64 strata_first_element() {
    return (strata_u64)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ strata_u64 strata_element_stride() {
    return (strata_u64)gridDim.x * blockDim.x;
}
__device__ __forceinline__ strata_u64 strata_first_row() {
    return (strata_u64)blockIdx.y * gridDim.x + blockIdx.x;
}
__device__ __forceinline__ strata_u64 strata_row_stride() {
    return (strata_u64)gridDim.x * gridDim.y;
}

// Rows of t: every index of the axes before the last (1 for rank 1).
__device__ __forceinline__ strata_u64 strata_rows(const strata_tensor& t) {
    strata_u64 n = 1;
    STRATA_UNROLL
    for (unsigned int k = 0; k < 4; ++k) {
        if (k + 1 < t.ndims) n *= t.shape[k];
    }
    return n;
}

// Elements of a row of t (the last axis).
__device__ __forceinline__ strata_u64 strata_row_len(const strata_tensor& t) {
    return t.ndims == 0 ? 1 : strata_shape_at(t, t.ndims - 1);
}

// Element offset of element 0 of row r of t; element j of the row is
// strata_row_step(t) elements further per step.
__device__ __forceinline__ strata_u64 strata_row_offset(const strata_tensor& t, strata_u64 r) {
    strata_u64 off = t.start_offset;
    STRATA_UNROLL
    for (int k = 3; k >= 0; --k) {
        if ((unsigned int)k + 1 < t.ndims) {
            const strata_u64 n = t.shape[k];
            off += (r % n) * t.stride[k];
            r /= n;
        }
    }
    return off;
}

__device__ __forceinline__ strata_u64 strata_row_step(const strata_tensor& t) {
    return t.ndims == 0 ? 0 : strata_stride_at(t, t.ndims - 1);
}

// The row-major index i over t's shape as a multi-index (idx[0..ndims]).
__device__ __forceinline__ void strata_unravel(const strata_tensor& t, strata_u64 i, strata_u64 idx[5]) {
    STRATA_UNROLL
    for (int k = 4; k >= 0; --k) {
        if ((unsigned int)k < t.ndims) {
            const strata_u64 n = t.shape[k];
            idx[k] = i % n;
            i /= n;
        }
    }
}

// Element offset of the multi-index idx of t.
__device__ __forceinline__ strata_u64 strata_offset_of(const strata_tensor& t, const strata_u64 idx[5]) {
    strata_u64 off = t.start_offset;
    STRATA_UNROLL
    for (unsigned int k = 0; k < 5; ++k) {
        if (k < t.ndims) off += idx[k] * t.stride[k];
    }
    return off;
}

// The reduction of the block's first nt threads' v (nt <= STRATA_THREADS)
// through sh, a __shared__ array of STRATA_THREADS; every thread of the
// block must call it (it synchronizes), and every thread gets the result.
// Any nt works, not only powers of two.
template <typename Op>
__device__ __forceinline__ double strata_block_reduce(double v, double* sh, unsigned int t, unsigned int nt, Op op) {
    if (t < nt) sh[t] = v;
    __syncthreads();
    unsigned int half = 1;
    while (half < nt) half <<= 1;
    for (half >>= 1; half > 0; half >>= 1) {
        if (t < half && t + half < nt) sh[t] = op(sh[t], sh[t + half]);
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();  // sh is free again when this returns
    return r;
}

struct strata_sum_op {
    __device__ __forceinline__ double operator()(double a, double b) const { return a + b; }
};
struct strata_max_op {
    __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
};

// ---- Element types -----------------------------------------------------------
//
// One type per dtype, of the dtype's size and alignment: the 16-bit floats
// are their bits, the complex types two parts, real first (numpy's layout,
// aligned as one part: a C64 view may start on any 4-byte boundary).
// Arithmetic mirrors the CPU kernels exactly: integers wrap; F16 and BF16
// compute in float and round once to nearest even; conversions from
// double round as the half crate does (below).

typedef signed char strata_i8;
typedef short strata_i16;
typedef int strata_i32;
typedef unsigned char strata_u8;
typedef unsigned short strata_u16;
typedef unsigned int strata_u32;
typedef float strata_f32;
typedef double strata_f64;

struct strata_f16 { unsigned short bits; };
struct strata_bf16 { unsigned short bits; };
struct strata_c64 { float re, im; };
struct strata_c128 { double re, im; };

// Raw elements moved without computing on them (copy, transpose), typed
// by size and the dtype's alignment.
struct strata_bits32x2 { unsigned int lo, hi; };  // C64: 8 bytes, aligned 4
struct strata_bits64x2 { strata_u64 lo, hi; };    // C128: 16 bytes, aligned 8

__device__ __forceinline__ unsigned int strata_f32_bits(float f) {
    union { float f; unsigned int u; } c;
    c.f = f;
    return c.u;
}
__device__ __forceinline__ float strata_f32_from_bits(unsigned int u) {
    union { float f; unsigned int u; } c;
    c.u = u;
    return c.f;
}
__device__ __forceinline__ strata_u64 strata_f64_bits(double d) {
    union { double d; strata_u64 u; } c;
    c.d = d;
    return c.u;
}
__device__ __forceinline__ double strata_f64_from_bits(strata_u64 u) {
    union { double d; strata_u64 u; } c;
    c.u = u;
    return c.d;
}

// float -> f16, round to nearest even (NaN stays NaN, quiet, its top
// payload bits kept): the half crate's conversion, bit for bit.
__device__ __forceinline__ strata_f16 strata_f16_from_float(float value) {
    unsigned int x = strata_f32_bits(value);
    unsigned int sign = x & 0x80000000u;
    unsigned int exp = x & 0x7F800000u;
    unsigned int man = x & 0x007FFFFFu;
    strata_f16 h;
    if (exp == 0x7F800000u) {
        unsigned int nan_bit = man == 0 ? 0u : 0x0200u;
        h.bits = (unsigned short)((sign >> 16) | 0x7C00u | nan_bit | (man >> 13));
        return h;
    }
    unsigned int half_sign = sign >> 16;
    int half_exp = (int)(exp >> 23) - 127 + 15;
    if (half_exp >= 0x1F) {
        h.bits = (unsigned short)(half_sign | 0x7C00u);
        return h;
    }
    if (half_exp <= 0) {
        if (14 - half_exp > 24) {
            h.bits = (unsigned short)half_sign;
            return h;
        }
        man |= 0x00800000u;
        unsigned int half_man = man >> (14 - half_exp);
        unsigned int round_bit = 1u << (13 - half_exp);
        if ((man & round_bit) != 0 && (man & (3u * round_bit - 1u)) != 0) half_man += 1;
        h.bits = (unsigned short)(half_sign | half_man);
        return h;
    }
    unsigned int bits = half_sign | ((unsigned int)half_exp << 10) | (man >> 13);
    unsigned int round_bit = 0x00001000u;
    if ((man & round_bit) != 0 && (man & (3u * round_bit - 1u)) != 0) bits += 1;
    h.bits = (unsigned short)bits;
    return h;
}

// f16 -> float, exact.
__device__ __forceinline__ float strata_f16_to_float(strata_f16 h) {
    unsigned int i = h.bits;
    unsigned int sign = (i & 0x8000u) << 16;
    unsigned int exp = i & 0x7C00u;
    unsigned int man = i & 0x03FFu;
    if (exp == 0x7C00u) {
        return strata_f32_from_bits(man == 0 ? (sign | 0x7F800000u) : (sign | 0x7FC00000u | (man << 13)));
    }
    if (exp == 0) {
        // Zero or subnormal: man * 2^-24, exact in float.
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return strata_f32_from_bits(sign | ((exp >> 10) - 15 + 127) << 23 | (man << 13));
}

// f64 -> f16 through float, as the half crate converts on x86-64 with F16C
// (every x86-64 CPU since 2013): round to float, then to f16.
__device__ __forceinline__ strata_f16 strata_f16_from_double(double v) {
    return strata_f16_from_float((float)v);
}

__device__ __forceinline__ double strata_f16_to_double(strata_f16 h) {
    return (double)strata_f16_to_float(h);
}

// float -> bf16, round to nearest even (NaN: quiet, payload kept).
__device__ __forceinline__ strata_bf16 strata_bf16_from_float(float value) {
    unsigned int x = strata_f32_bits(value);
    strata_bf16 b;
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        b.bits = (unsigned short)((x >> 16) | 0x0040u);
        return b;
    }
    unsigned int round_bit = 0x00008000u;
    unsigned int r = x >> 16;
    if ((x & round_bit) != 0 && (x & (3u * round_bit - 1u)) != 0) r += 1;
    b.bits = (unsigned short)r;
    return b;
}

// f64 -> bf16 as the half crate converts: from the top 32 bits of the
// double (its low 32 mantissa bits play no part in the rounding), to
// nearest even.
__device__ __forceinline__ strata_bf16 strata_bf16_from_double(double value) {
    strata_u64 val = strata_f64_bits(value);
    unsigned int x = (unsigned int)(val >> 32);
    unsigned int sign = x & 0x80000000u;
    unsigned int exp = x & 0x7FF00000u;
    unsigned int man = x & 0x000FFFFFu;
    strata_bf16 b;
    if (exp == 0x7FF00000u) {
        unsigned int nan_bit = (man == 0 && (unsigned int)val == 0) ? 0u : 0x0040u;
        b.bits = (unsigned short)((sign >> 16) | 0x7F80u | nan_bit | (man >> 13));
        return b;
    }
    unsigned int half_sign = sign >> 16;
    long long half_exp = (long long)(exp >> 20) - 1023 + 127;
    if (half_exp >= 0xFF) {
        b.bits = (unsigned short)(half_sign | 0x7F80u);
        return b;
    }
    if (half_exp <= 0) {
        if (7 - half_exp > 21) {
            b.bits = (unsigned short)half_sign;
            return b;
        }
        man |= 0x00100000u;
        unsigned int half_man = man >> (14 - half_exp);
        unsigned int round_bit = 1u << (13 - half_exp);
        if ((man & round_bit) != 0 && (man & (3u * round_bit - 1u)) != 0) half_man += 1;
        b.bits = (unsigned short)(half_sign | half_man);
        return b;
    }
    unsigned int bits = half_sign | ((unsigned int)half_exp << 7) | (man >> 13);
    unsigned int round_bit = 0x00001000u;
    if ((man & round_bit) != 0 && (man & (3u * round_bit - 1u)) != 0) bits += 1;
    b.bits = (unsigned short)bits;
    return b;
}

// bf16 -> float, exact (NaN: quiet).
__device__ __forceinline__ float strata_bf16_to_float(strata_bf16 b) {
    unsigned int i = b.bits;
    if ((i & 0x7FFFu) > 0x7F80u) i |= 0x0040u;
    return strata_f32_from_bits(i << 16);
}

__device__ __forceinline__ double strata_bf16_to_double(strata_bf16 b) {
    return (double)strata_bf16_to_float(b);
}

// ---- Element arithmetic: what the CPU kernels do per dtype -----------------

// The value as a double (floats: exact).
__device__ __forceinline__ double strata_to_double(float v) { return (double)v; }
__device__ __forceinline__ double strata_to_double(double v) { return v; }
__device__ __forceinline__ double strata_to_double(strata_f16 v) { return strata_f16_to_double(v); }
__device__ __forceinline__ double strata_to_double(strata_bf16 v) { return strata_bf16_to_double(v); }

// The double rounded to T (the CPU kernels' from_f64).
template <typename T> __device__ T strata_from_double(double v);
template <> __device__ __forceinline__ float strata_from_double<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double strata_from_double<double>(double v) { return v; }
template <> __device__ __forceinline__ strata_f16 strata_from_double<strata_f16>(double v) { return strata_f16_from_double(v); }
template <> __device__ __forceinline__ strata_bf16 strata_from_double<strata_bf16>(double v) { return strata_bf16_from_double(v); }

// A scalar word as T: an integer's low bits (two's complement), a float's
// f64 bits rounded to T, a complex dtype's real part (imaginary 0).
template <typename T> __device__ __forceinline__ T strata_from_word(strata_u64 w) { return (T)w; }
template <> __device__ __forceinline__ float strata_from_word<float>(strata_u64 w) { return (float)strata_f64_from_bits(w); }
template <> __device__ __forceinline__ double strata_from_word<double>(strata_u64 w) { return strata_f64_from_bits(w); }
template <> __device__ __forceinline__ strata_f16 strata_from_word<strata_f16>(strata_u64 w) { return strata_f16_from_double(strata_f64_from_bits(w)); }
template <> __device__ __forceinline__ strata_bf16 strata_from_word<strata_bf16>(strata_u64 w) { return strata_bf16_from_double(strata_f64_from_bits(w)); }
template <> __device__ __forceinline__ strata_c64 strata_from_word<strata_c64>(strata_u64 w) {
    strata_c64 c;
    c.re = (float)strata_f64_from_bits(w);
    c.im = 0.0f;
    return c;
}
template <> __device__ __forceinline__ strata_c128 strata_from_word<strata_c128>(strata_u64 w) {
    strata_c128 c;
    c.re = strata_f64_from_bits(w);
    c.im = 0.0;
    return c;
}

// Sums and products. Integers wrap: they compute in the unsigned type of
// at least their width that C++ does not promote (so no signed overflow).
#define STRATA_WRAPPING(T, W)                                                                    \
    __device__ __forceinline__ T strata_add(T a, T b) { return (T)((W)a + (W)b); }              \
    __device__ __forceinline__ T strata_mul(T a, T b) { return (T)((W)a * (W)b); }
STRATA_WRAPPING(strata_i8, unsigned int)
STRATA_WRAPPING(strata_i16, unsigned int)
STRATA_WRAPPING(strata_i32, unsigned int)
STRATA_WRAPPING(strata_i64, strata_u64)
STRATA_WRAPPING(strata_u8, unsigned int)
STRATA_WRAPPING(strata_u16, unsigned int)
STRATA_WRAPPING(strata_u32, unsigned int)
STRATA_WRAPPING(strata_u64, strata_u64)
#undef STRATA_WRAPPING

__device__ __forceinline__ float strata_add(float a, float b) { return a + b; }
__device__ __forceinline__ float strata_mul(float a, float b) { return a * b; }
__device__ __forceinline__ double strata_add(double a, double b) { return a + b; }
__device__ __forceinline__ double strata_mul(double a, double b) { return a * b; }
__device__ __forceinline__ strata_f16 strata_add(strata_f16 a, strata_f16 b) {
    return strata_f16_from_float(strata_f16_to_float(a) + strata_f16_to_float(b));
}
__device__ __forceinline__ strata_f16 strata_mul(strata_f16 a, strata_f16 b) {
    return strata_f16_from_float(strata_f16_to_float(a) * strata_f16_to_float(b));
}
__device__ __forceinline__ strata_bf16 strata_add(strata_bf16 a, strata_bf16 b) {
    return strata_bf16_from_float(strata_bf16_to_float(a) + strata_bf16_to_float(b));
}
__device__ __forceinline__ strata_bf16 strata_mul(strata_bf16 a, strata_bf16 b) {
    return strata_bf16_from_float(strata_bf16_to_float(a) * strata_bf16_to_float(b));
}

// Complex: (a + ib)(c + id) = (ac - bd) + i(ad + bc), each product rounded
// before the sum (sources compile with fused multiply-add off).
__device__ __forceinline__ strata_c64 strata_add(strata_c64 a, strata_c64 b) {
    strata_c64 c;
    c.re = a.re + b.re;
    c.im = a.im + b.im;
    return c;
}
__device__ __forceinline__ strata_c64 strata_mul(strata_c64 a, strata_c64 b) {
    strata_c64 c;
    c.re = a.re * b.re - a.im * b.im;
    c.im = a.re * b.im + a.im * b.re;
    return c;
}
__device__ __forceinline__ strata_c128 strata_add(strata_c128 a, strata_c128 b) {
    strata_c128 c;
    c.re = a.re + b.re;
    c.im = a.im + b.im;
    return c;
}
__device__ __forceinline__ strata_c128 strata_mul(strata_c128 a, strata_c128 b) {
    strata_c128 c;
    c.re = a.re * b.re - a.im * b.im;
    c.im = a.re * b.im + a.im * b.re;
    return c;
}

// ---- Dtype lists -------------------------------------------------------------
//
// X(suffix, type) once per dtype of a group: the suffix is the entry
// symbol's (the lower-case dtype name), the type the element's. A source
// defines a macro for one entry and expands a list over it, as the
// built-in kernels do. The numeric and complex types compute; the raw
// ones only move (every dtype of at least one byte, by size).
#define STRATA_FLOAT_DTYPES(X) X(f32, float) X(f64, double) X(f16, strata_f16) X(bf16, strata_bf16)
#define STRATA_INTEGER_DTYPES(X)                                                  \
    X(i8, strata_i8) X(i16, strata_i16) X(i32, strata_i32) X(i64, strata_i64)     \
    X(u8, strata_u8) X(u16, strata_u16) X(u32, strata_u32) X(u64, strata_u64)
#define STRATA_NUMERIC_DTYPES(X) STRATA_FLOAT_DTYPES(X) STRATA_INTEGER_DTYPES(X)
#define STRATA_COMPLEX_DTYPES(X) X(c64, strata_c64) X(c128, strata_c128)
#define STRATA_RAW_DTYPES(X)                                                          \
    X(f32, strata_u32) X(f16, strata_u16) X(i32, strata_u32) X(i16, strata_u16)       \
    X(i8, strata_u8) X(u8, strata_u8) X(bf16, strata_u16) X(i64, strata_u64)          \
    X(u64, strata_u64) X(u16, strata_u16) X(u32, strata_u32) X(bool, strata_u8)       \
    X(fp8e4m3fn, strata_u8) X(fp8e8m0, strata_u8) X(f64, strata_u64)                  \
    X(c64, strata_bits32x2) X(c128, strata_bits64x2)
