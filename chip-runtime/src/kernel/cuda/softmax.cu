// softmax(x R, out W, same shape), along the last axis: per row,
// out[j] = exp(x[j] - max) / Σ exp(x[k] - max), in double (max ignores
// NaN, as fmax does), rounded once to the dtype. Grid::Rows(0): a block
// per row, its threads sharing the row's elements and combining their
// partial max and sum through shared memory.

template <typename T>
__device__ __forceinline__ void strata_softmax_rows(const strata_tensor& x, const strata_tensor& out, double* sh) {
    const unsigned int t = threadIdx.x;
    const unsigned int nt = blockDim.x < STRATA_THREADS ? blockDim.x : STRATA_THREADS;
    const strata_u64 rows = strata_rows(x);
    const strata_u64 len = strata_row_len(x);
    const strata_u64 xs = strata_row_step(x);
    const strata_u64 os = strata_row_step(out);
    const double neg_inf = strata_f64_from_bits(0xFFF0000000000000ull);
    for (strata_u64 r = strata_first_row(); r < rows; r += strata_row_stride()) {
        const T* xr = reinterpret_cast<const T*>(x.addr) + strata_row_offset(x, r);
        T* orow = reinterpret_cast<T*>(out.addr) + strata_row_offset(out, r);
        double m = neg_inf;
        if (t < nt) {
            for (strata_u64 j = t; j < len; j += nt) m = fmax(m, strata_to_double(xr[j * xs]));
        }
        m = strata_block_reduce(m, sh, t, nt, strata_max_op());
        double s = 0.0;
        if (t < nt) {
            for (strata_u64 j = t; j < len; j += nt) s += exp(strata_to_double(xr[j * xs]) - m);
        }
        s = strata_block_reduce(s, sh, t, nt, strata_sum_op());
        if (t < nt) {
            for (strata_u64 j = t; j < len; j += nt) {
                orow[j * os] = strata_from_double<T>(exp(strata_to_double(xr[j * xs]) - m) / s);
            }
        }
    }
}

#define STRATA_SOFTMAX(SUFFIX, T)                                                  \
    extern "C" __global__ void softmax_##SUFFIX(strata_tensor x, strata_tensor out) { \
        __shared__ double sh[STRATA_THREADS];                                      \
        strata_softmax_rows<T>(x, out, sh);                                        \
    }
STRATA_FLOAT_DTYPES(STRATA_SOFTMAX)
