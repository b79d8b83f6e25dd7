// transpose(x R [.., a, b], out W [.., b, a]): out[.., j, i] = x[.., i, j],
// the bits moved as they are (any dtype of at least one byte).
// Grid::Elements(1): one thread per element of out.
#define STRATA_TRANSPOSE(SUFFIX, T)                                                         \
    extern "C" __global__ void transpose_##SUFFIX(strata_tensor x, strata_tensor out) {     \
        if (out.ndims < 2 || out.ndims > 5) return;                                         \
        const unsigned int last = out.ndims - 1;                                            \
        const strata_u64 n = strata_numel(out);                                             \
        for (strata_u64 i = strata_first_element(); i < n; i += strata_element_stride()) { \
            strata_u64 idx[5];                                                              \
            strata_unravel(out, i, idx);                                                    \
            const strata_u64 to = strata_offset_of(out, idx);                               \
            const strata_u64 swap = idx[last];                                              \
            idx[last] = idx[last - 1];                                                      \
            idx[last - 1] = swap;                                                           \
            reinterpret_cast<T*>(out.addr)[to] =                                            \
                reinterpret_cast<const T*>(x.addr)[strata_offset_of(x, idx)];               \
        }                                                                                   \
    }
STRATA_RAW_DTYPES(STRATA_TRANSPOSE)
