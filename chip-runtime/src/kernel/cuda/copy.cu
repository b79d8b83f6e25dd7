// copy(src R, dst W): dst = src element by element, the bits moved as they
// are (any dtype of at least one byte). Grid::Elements(1).
#define STRATA_COPY(SUFFIX, T)                                                              \
    extern "C" __global__ void copy_##SUFFIX(strata_tensor src, strata_tensor dst) {        \
        const strata_u64 n = strata_numel(dst);                                             \
        for (strata_u64 i = strata_first_element(); i < n; i += strata_element_stride()) { \
            *strata_at<T>(dst, i) = *strata_at<const T>(src, i);                            \
        }                                                                                   \
    }
STRATA_RAW_DTYPES(STRATA_COPY)
