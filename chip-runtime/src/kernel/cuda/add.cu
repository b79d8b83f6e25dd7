// add(a R, b R, out W): out = a + b element by element (integers wrap,
// F16/BF16 round the float result once, complex as (re, im) pairs).
// Grid::Elements(2).
#define STRATA_BINARY(SUFFIX, T)                                                            \
    extern "C" __global__ void add_##SUFFIX(strata_tensor a, strata_tensor b, strata_tensor out) { \
        const strata_u64 n = strata_numel(out);                                             \
        for (strata_u64 i = strata_first_element(); i < n; i += strata_element_stride()) { \
            *strata_at<T>(out, i) = strata_add(*strata_at<const T>(a, i), *strata_at<const T>(b, i)); \
        }                                                                                   \
    }
STRATA_NUMERIC_DTYPES(STRATA_BINARY)
STRATA_COMPLEX_DTYPES(STRATA_BINARY)
