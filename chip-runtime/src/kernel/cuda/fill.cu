// fill(out W; value): every element of out becomes value, the scalar word
// read in out's dtype (strata_from_word: an integer's low bits, a float's
// f64 bits rounded once, a complex dtype's real part). Grid::Elements(0).
//
// An integer value out of the dtype's range fails the CPU kernel; this one
// cannot fail and would keep the value's low bits, so the chip must refuse
// such a value before launching (the check is the CPU kernel's,
// Element::scalar_misfit).
#define STRATA_FILL(SUFFIX, T)                                                              \
    extern "C" __global__ void fill_##SUFFIX(strata_tensor out, strata_u64 value) {         \
        const T v = strata_from_word<T>(value);                                             \
        const strata_u64 n = strata_numel(out);                                             \
        for (strata_u64 i = strata_first_element(); i < n; i += strata_element_stride()) { \
            *strata_at<T>(out, i) = v;                                                      \
        }                                                                                   \
    }
STRATA_NUMERIC_DTYPES(STRATA_FILL)
STRATA_COMPLEX_DTYPES(STRATA_FILL)
