//! dtypes between numpy and strata: numpy's (anything `numpy.dtype`
//! takes) and strata's own names (`"bf16"`, `"fp8e4m3fn"`...).

use pyo3::prelude::*;
use pyo3::types::PyString;
use strata_orchestrator::npy;
use strata_wire::DType;

use crate::errors::invalid_view;

/// The strata dtype `obj` names: a strata name (case-insensitive: `"f32"`,
/// `"bf16"`; tried first, so `"f16"` is half precision as in strata, not
/// numpy's float128), or anything `numpy.dtype()` accepts whose type
/// strata shares.
pub(crate) fn parse(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    if let Ok(s) = obj.cast::<PyString>() {
        let s = s.to_cow()?;
        if let Some(d) = DType::from_name(&s) {
            return Ok(d);
        }
    }
    // A type (`np.float32`, `float`): remembered by identity, each kept
    // alive by the table, so that `view(np.int32)` in a loop does not ask
    // numpy every time.
    let is_type = obj.is_instance_of::<pyo3::types::PyType>();
    if is_type {
        let known = TYPES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, d)) = known.iter().find(|(t, _)| t.as_ptr() == obj.as_ptr()) {
            return Ok(*d);
        }
    }
    let d = parse_by_numpy(obj)?;
    if is_type {
        let mut known = TYPES.lock().unwrap_or_else(|e| e.into_inner());
        if known.len() < 64 {
            known.push((obj.clone().unbind(), d));
        }
    }
    Ok(d)
}

/// Types already parsed, and what they named.
static TYPES: std::sync::Mutex<Vec<(Py<PyAny>, DType)>> = std::sync::Mutex::new(Vec::new());

fn parse_by_numpy(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let np = obj.py().import("numpy")?;
    let dt = np.call_method1("dtype", (obj,)).map_err(|e| {
        invalid_view(format!(
            "dtype {}: not a dtype ({e})",
            obj.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })?;
    let ts: String = dt.getattr("str")?.extract()?;
    npy::dtype_of(&ts).ok_or_else(|| {
        invalid_view(format!(
            "dtype {ts}: strata has f64, f32, f16, bf16, c64, c128, i8-i64, u8-u64, bool and the fp8/fp4 types; numpy's {ts} is none of them"
        ))
    })
}

/// numpy's type string for `d`; dtypes numpy lacks (bf16, fp8) as
/// unsigned integers of their width (their bits); `None` for fp4.
pub(crate) fn typestr(d: DType) -> Option<&'static str> {
    npy::type_str(d).or(match d.bits() {
        8 => Some("|u1"),
        16 => Some("<u2"),
        _ => None,
    })
}

/// Bytes per element (`None` for fp4).
pub(crate) fn itemsize(d: DType) -> Option<usize> {
    match d.bits() {
        b if b % 8 == 0 => Some(b as usize / 8),
        _ => None,
    }
}

/// The Python value of `d`: a `numpy.dtype` where numpy has it, else
/// strata's name in lower case (`"bf16"`).
pub(crate) fn to_py(py: Python<'_>, d: DType) -> PyResult<Py<PyAny>> {
    match npy::type_str(d) {
        Some(ts) => Ok(py.import("numpy")?.call_method1("dtype", (ts,))?.unbind()),
        None => Ok(PyString::new(py, &d.name().to_ascii_lowercase())
            .into_any()
            .unbind()),
    }
}

/// Every dtype's strata name, lower case, in code order: what the
/// package must map (a test creates an array of each and reads its dtype
/// back).
#[pyo3::pyfunction]
pub(crate) fn _dtype_names() -> Vec<String> {
    DType::ALL
        .iter()
        .map(|d| d.name().to_ascii_lowercase())
        .collect()
}

/// Whether a scalar in `d`'s kind is a float (sent as f64 bits): a
/// complex dtype's scalars are real (one 64-bit word each).
pub(crate) fn is_float(d: DType) -> bool {
    matches!(
        d,
        DType::F32
            | DType::F64
            | DType::C64
            | DType::C128
            | DType::F16
            | DType::BF16
            | DType::Fp8E4M3Fn
            | DType::Fp8E8M0
            | DType::Fp4E2M1
    )
}

/// The values an integer scalar for an argument of dtype `d` may take
/// (inclusive), when `d` is an integer dtype.
pub(crate) fn int_range(d: DType) -> Option<(i128, i128)> {
    Some(match d {
        DType::Bool => (0, 1),
        DType::U8 => (0, u8::MAX.into()),
        DType::U16 => (0, u16::MAX.into()),
        DType::U32 => (0, u32::MAX.into()),
        DType::U64 => (0, u64::MAX.into()),
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::I64 => (i64::MIN.into(), i64::MAX.into()),
        _ => return None,
    })
}

/// Whether a scalar in `d`'s kind is an unsigned integer.
pub(crate) fn is_unsigned(d: DType) -> bool {
    matches!(
        d,
        DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::Bool
    )
}

/// `d` as a dtype, float32 when not given.
pub(crate) fn dtype_or_f32(d: Option<Bound<'_, PyAny>>) -> PyResult<DType> {
    match d {
        Some(d) => parse(&d),
        None => Ok(DType::F32),
    }
}
