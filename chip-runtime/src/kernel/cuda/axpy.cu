// axpy(x R, y RW; alpha): y = alpha·x + y element by element, alpha the
// scalar's f64 bits (real for complex dtypes too). Real floats compute in
// double and round once; complex ones in their parts' precision, alpha
// rounded to it first. Grid::Elements(1).

template <typename T>
__device__ __forceinline__ T strata_axpy_element(double alpha, T x, T y) {
    return strata_from_double<T>(alpha * strata_to_double(x) + strata_to_double(y));
}
template <>
__device__ __forceinline__ strata_c64 strata_axpy_element<strata_c64>(double alpha, strata_c64 x, strata_c64 y) {
    const float a = (float)alpha;
    strata_c64 r;
    r.re = a * x.re + y.re;
    r.im = a * x.im + y.im;
    return r;
}
template <>
__device__ __forceinline__ strata_c128 strata_axpy_element<strata_c128>(double alpha, strata_c128 x, strata_c128 y) {
    strata_c128 r;
    r.re = alpha * x.re + y.re;
    r.im = alpha * x.im + y.im;
    return r;
}

#define STRATA_AXPY(SUFFIX, T)                                                              \
    extern "C" __global__ void axpy_##SUFFIX(strata_tensor x, strata_tensor y, strata_u64 alpha) { \
        const double a = strata_f64_from_bits(alpha);                                       \
        const strata_u64 n = strata_numel(y);                                               \
        for (strata_u64 i = strata_first_element(); i < n; i += strata_element_stride()) { \
            T* yi = strata_at<T>(y, i);                                                     \
            *yi = strata_axpy_element<T>(a, *strata_at<const T>(x, i), *yi);                \
        }                                                                                   \
    }
STRATA_FLOAT_DTYPES(STRATA_AXPY)
STRATA_COMPLEX_DTYPES(STRATA_AXPY)
