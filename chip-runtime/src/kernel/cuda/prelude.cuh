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

// Elements of t.
__device__ __forceinline__ strata_u64 strata_numel(const strata_tensor& t) {
    strata_u64 n = 1;
    for (unsigned int k = 0; k < t.ndims; ++k) n *= t.shape[k];
    return n;
}

// Element offset (in elements, from addr) of the element whose row-major
// index over t's shape is i.
__device__ __forceinline__ strata_u64 strata_offset(const strata_tensor& t, strata_u64 i) {
    strata_u64 off = t.start_offset;
    for (int k = (int)t.ndims - 1; k >= 0; --k) {
        strata_u64 n = t.shape[k];
        off += (i % n) * t.stride[k];
        i /= n;
    }
    return off;
}

// The element whose row-major index over t's shape is i.
template <typename T>
__device__ __forceinline__ T* strata_at(const strata_tensor& t, strata_u64 i) {
    return reinterpret_cast<T*>(t.addr) + strata_offset(t, i);
}
