// transpose(x R [.., a, b], out W [.., b, a]): out[.., j, i] = x[.., i, j],
// the bits moved as they are (any dtype of at least one byte).
// Grid::Elements(1): one thread per element of out, which walks out's
// index once for both offsets (x's strides with the last two swapped).
#define STRATA_TRANSPOSE(SUFFIX, T)                                                         \
    extern "C" __global__ void transpose_##SUFFIX(strata_tensor x, strata_tensor out) {     \
        if (out.ndims < 2 || out.ndims > 5) return;                                         \
        const unsigned int last = out.ndims - 1;                                            \
        const strata_u64 x_for_last = strata_stride_at(x, last - 1);                        \
        const strata_u64 x_for_before = strata_stride_at(x, last);                          \
        const strata_u64 n = strata_numel(out);                                             \
        for (strata_u64 i = strata_first_element(); i < n; i += strata_element_stride()) { \
            strata_u64 rest = i, to = out.start_offset, from = x.start_offset;              \
            STRATA_UNROLL                                                                   \
            for (int k = 4; k >= 0; --k) {                                                  \
                const unsigned int a = (unsigned int)k;                                     \
                if (a < out.ndims) {                                                        \
                    const strata_u64 len = out.shape[k];                                    \
                    const strata_u64 c = rest % len;                                        \
                    rest /= len;                                                            \
                    to += c * out.stride[k];                                                \
                    from += c * (a == last ? x_for_last                                     \
                                 : a + 1 == last ? x_for_before : (strata_u64)x.stride[k]); \
                }                                                                           \
            }                                                                               \
            reinterpret_cast<T*>(out.addr)[to] = reinterpret_cast<const T*>(x.addr)[from];  \
        }                                                                                   \
    }
STRATA_RAW_DTYPES(STRATA_TRANSPOSE)
