// reduce_sum(x R [.., n], out W [..] or [1] for rank 1): out[r] = Σ of row
// r of x (the last axis), accumulated in double (complex: two doubles)
// and rounded once to the dtype (complex: each part). Grid::Rows(0): a
// block per row, its threads' partial sums combined in shared memory.
// Row r's sum lands at out's row-major index r.

template <typename T>
__device__ __forceinline__ void strata_sum_rows(const strata_tensor& x, const strata_tensor& out, double* sh) {
    const unsigned int t = threadIdx.x;
    const unsigned int nt = blockDim.x < STRATA_THREADS ? blockDim.x : STRATA_THREADS;
    const strata_u64 rows = strata_rows(x);
    const strata_u64 len = strata_row_len(x);
    const strata_u64 xs = strata_row_step(x);
    for (strata_u64 r = strata_first_row(); r < rows; r += strata_row_stride()) {
        const T* xr = reinterpret_cast<const T*>(x.addr) + strata_row_offset(x, r);
        double s = 0.0;
        if (t < nt) {
            for (strata_u64 j = t; j < len; j += nt) s += strata_to_double(xr[j * xs]);
        }
        s = strata_block_reduce(s, sh, t, nt, strata_sum_op());
        if (t == 0) *strata_at<T>(out, r) = strata_from_double<T>(s);
    }
}

// Complex rows: the real and imaginary parts summed apart.
template <typename C, typename P>
__device__ __forceinline__ void strata_sum_complex_rows(const strata_tensor& x, const strata_tensor& out, double* sh) {
    const unsigned int t = threadIdx.x;
    const unsigned int nt = blockDim.x < STRATA_THREADS ? blockDim.x : STRATA_THREADS;
    const strata_u64 rows = strata_rows(x);
    const strata_u64 len = strata_row_len(x);
    const strata_u64 xs = strata_row_step(x);
    for (strata_u64 r = strata_first_row(); r < rows; r += strata_row_stride()) {
        const C* xr = reinterpret_cast<const C*>(x.addr) + strata_row_offset(x, r);
        double re = 0.0, im = 0.0;
        if (t < nt) {
            for (strata_u64 j = t; j < len; j += nt) {
                re += (double)xr[j * xs].re;
                im += (double)xr[j * xs].im;
            }
        }
        re = strata_block_reduce(re, sh, t, nt, strata_sum_op());
        im = strata_block_reduce(im, sh, t, nt, strata_sum_op());
        if (t == 0) {
            C* o = strata_at<C>(out, r);
            o->re = (P)re;
            o->im = (P)im;
        }
    }
}

#define STRATA_REDUCE_SUM(SUFFIX, T)                                                  \
    extern "C" __global__ void reduce_sum_##SUFFIX(strata_tensor x, strata_tensor out) { \
        __shared__ double sh[STRATA_THREADS];                                         \
        strata_sum_rows<T>(x, out, sh);                                               \
    }
STRATA_FLOAT_DTYPES(STRATA_REDUCE_SUM)

extern "C" __global__ void reduce_sum_c64(strata_tensor x, strata_tensor out) {
    __shared__ double sh[STRATA_THREADS];
    strata_sum_complex_rows<strata_c64, float>(x, out, sh);
}
extern "C" __global__ void reduce_sum_c128(strata_tensor x, strata_tensor out) {
    __shared__ double sh[STRATA_THREADS];
    strata_sum_complex_rows<strata_c128, double>(x, out, sh);
}
