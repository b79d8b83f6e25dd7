//! A graph buffer's initial contents: constants and seeded uniform
//! values encoded as the buffer's dtype, and elements decoded back for
//! an output's expectation.

use std::path::Path;

use serde_json::Value;
use strata_wire::{Access, DType};

use super::fields::{dims_of, dtype_of, f64_of, join, object, str_of, u32_of, u64_of};
use super::{BufferDef, GraphError, Init, err};

/// Deterministic uniform values in `[low, high)` (splitmix64).
pub(super) fn uniform(seed: u64, n: usize, low: f64, high: f64) -> impl Iterator<Item = f64> {
    let mut rng = strata_wire::check::Rng(seed);
    (0..n).map(move |_| low + (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * (high - low))
}

/// Numbers per element: 2 for complex dtypes (real, imaginary), else 1.
pub(super) fn parts(dtype: DType) -> usize {
    if dtype.is_complex() { 2 } else { 1 }
}

/// Whether `const` and `random` can fill a buffer of `dtype` ([`encode`]
/// writes it): every whole-byte numeric dtype, not the 8-bit and 4-bit
/// floats.
pub(super) fn encodable(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F64
            | DType::F16
            | DType::BF16
            | DType::C64
            | DType::C128
            | DType::I8
            | DType::I16
            | DType::I32
            | DType::I64
            | DType::U8
            | DType::U16
            | DType::U32
            | DType::U64
            | DType::Bool
    )
}

/// `values` encoded as little-endian elements of `dtype` (whole-byte,
/// numeric dtypes; complex ones take [`parts`] values per element, the
/// real part first).
pub(super) fn encode(dtype: DType, values: impl Iterator<Item = f64>, integral: bool) -> Vec<u8> {
    use strata_chip_runtime::half::{bf16, f16};
    let mut out = Vec::new();
    for v in values {
        let v = if integral
            && !matches!(
                dtype,
                DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::C64 | DType::C128
            ) {
            v.floor()
        } else {
            v
        };
        match dtype {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 | DType::C128 => out.extend_from_slice(&v.to_le_bytes()),
            DType::C64 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
            DType::I8 => out.extend_from_slice(&(v as i8).to_le_bytes()),
            DType::I16 => out.extend_from_slice(&(v as i16).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
            DType::U8 => out.push(v as u8),
            DType::Bool => out.push(u8::from(v != 0.0)),
            DType::U16 => out.extend_from_slice(&(v as u16).to_le_bytes()),
            DType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
            DType::U64 => out.extend_from_slice(&(v as u64).to_le_bytes()),
            // Refused when the graph is read (`encodable`).
            _ => {}
        }
    }
    out
}

/// Little-endian elements of `dtype` as f64 ([`parts`] per element: a
/// complex element as its real then its imaginary part).
pub(super) fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    use strata_chip_runtime::half::{bf16, f16};
    let w = ((dtype.bits() / 8) as usize / parts(dtype)).max(1);
    bytes
        .chunks_exact(w)
        .map(|c| match dtype {
            DType::F32 => f64::from(f32::from_le_bytes(c.try_into().unwrap_or_default())),
            DType::F64 | DType::C128 => f64::from_le_bytes(c.try_into().unwrap_or_default()),
            DType::C64 => f64::from(f32::from_le_bytes(c.try_into().unwrap_or_default())),
            DType::F16 => f16::from_le_bytes(c.try_into().unwrap_or_default()).to_f64(),
            DType::BF16 => bf16::from_le_bytes(c.try_into().unwrap_or_default()).to_f64(),
            DType::I8 => f64::from(c[0] as i8),
            DType::I16 => f64::from(i16::from_le_bytes(c.try_into().unwrap_or_default())),
            DType::I32 => f64::from(i32::from_le_bytes(c.try_into().unwrap_or_default())),
            DType::I64 => i64::from_le_bytes(c.try_into().unwrap_or_default()) as f64,
            DType::U16 => f64::from(u16::from_le_bytes(c.try_into().unwrap_or_default())),
            DType::U32 => f64::from(u32::from_le_bytes(c.try_into().unwrap_or_default())),
            DType::U64 => u64::from_le_bytes(c.try_into().unwrap_or_default()) as f64,
            _ => f64::from(c[0]),
        })
        .collect()
}

pub(super) fn buffer_def(
    name: &str,
    b: &Value,
    path: &str,
    dir: &Path,
) -> Result<BufferDef, GraphError> {
    let o = object(
        b,
        path,
        &["shape", "dtype", "size", "init", "access", "device"],
    )?;
    let init = match o.get("init") {
        None => Init::Zeros,
        Some(Value::String(s)) if s == "zeros" => Init::Zeros,
        Some(Value::String(s)) => {
            return err(
                join(path, "init"),
                format!(
                    "unknown init {s:?}: \"zeros\", or an object with exactly one of const, random, npy"
                ),
            );
        }
        Some(i) => {
            let ip = join(path, "init");
            let io = object(i, &ip, &["const", "random", "npy"])?;
            match (io.get("const"), io.get("random"), io.get("npy")) {
                (Some(c), None, None) => Init::Const(f64_of(c, &join(&ip, "const"))?),
                (None, Some(r), None) => {
                    let rp = join(&ip, "random");
                    let ro = object(r, &rp, &["seed", "low", "high"])?;
                    let seed = match ro.get("seed") {
                        Some(s) => u64_of(s, &join(&rp, "seed"))?,
                        None => 0,
                    };
                    let low = ro
                        .get("low")
                        .map(|v| f64_of(v, &join(&rp, "low")))
                        .transpose()?
                        .unwrap_or(-1.0);
                    let high = ro
                        .get("high")
                        .map(|v| f64_of(v, &join(&rp, "high")))
                        .transpose()?
                        .unwrap_or(1.0);
                    if low >= high {
                        return err(rp, format!("low {low} is not below high {high}"));
                    }
                    Init::Random { seed, low, high }
                }
                (None, None, Some(p)) => Init::Npy(dir.join(str_of(p, &join(&ip, "npy"))?)),
                _ => {
                    return err(
                        ip,
                        "\"zeros\", or an object with exactly one of const, random, npy",
                    );
                }
            }
        }
    };
    let access = match o.get("access") {
        None => Access::ReadWrite,
        Some(a) => {
            let s = str_of(a, &join(path, "access"))?;
            match s.to_ascii_lowercase().as_str() {
                "read" => Access::Read,
                "write" => Access::Write,
                "readwrite" => Access::ReadWrite,
                _ => {
                    return err(
                        join(path, "access"),
                        format!("unknown access {s:?}; one of read, write, readwrite"),
                    );
                }
            }
        }
    };
    let device = o
        .get("device")
        .map(|d| u32_of(d, &join(path, "device")))
        .transpose()?;
    let mut layout = match (o.get("shape"), o.get("dtype")) {
        (Some(s), Some(d)) => Some((
            dims_of(s, &join(path, "shape"))?,
            dtype_of(d, &join(path, "dtype"))?,
        )),
        (Some(_), None) => return err(join(path, "dtype"), "missing (a shape needs a dtype)"),
        (None, Some(_)) => return err(join(path, "shape"), "missing (a dtype needs a shape)"),
        (None, None) => None,
    };
    if let Init::Npy(file) = &init {
        let (shape, dtype) = npy_layout(file, &join(path, "init.npy"))?;
        match &layout {
            Some((s, d)) if (s, d) != (&shape, &dtype) => {
                return err(
                    join(path, "init.npy"),
                    format!(
                        "the file holds {shape:?} {}, but the buffer says {s:?} {}",
                        dtype.name(),
                        d.name()
                    ),
                );
            }
            _ => layout = Some((shape, dtype)),
        }
    }
    if matches!(init, Init::Const(_) | Init::Random { .. }) {
        match &layout {
            None => {
                return err(
                    join(path, "init"),
                    "const and random need a shape and dtype",
                );
            }
            Some((_, d)) if !encodable(*d) => {
                return err(
                    join(path, "init"),
                    format!("const and random do not support {}", d.name()),
                );
            }
            _ => {}
        }
    }
    let nbytes = match (&layout, o.get("size")) {
        (Some(_), Some(_)) => {
            return err(join(path, "size"), "give size or shape and dtype, not both");
        }
        (Some((shape, dtype)), None) => {
            let elems = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(u64::from(d)));
            elems
                .and_then(|e| dtype.bytes_for(e))
                .map_or_else(|| err(join(path, "shape"), "too large"), Ok)?
        }
        (None, Some(s)) => u64_of(s, &join(path, "size"))?,
        (None, None) => return err(path, "needs shape and dtype, size, or init.npy"),
    };
    if nbytes == 0 {
        return err(path, "a buffer needs at least one byte");
    }
    if device.is_some() && matches!(init, Init::Npy(_)) {
        // Fine: the bytes are copied to the device.
    }
    Ok(BufferDef {
        name: name.to_owned(),
        nbytes,
        layout,
        access,
        device,
        init,
        scope: None,
    })
}

/// Shape and dtype of a `.npy` file, from its header.
pub(super) fn npy_layout(file: &Path, path: &str) -> Result<(Vec<u32>, DType), GraphError> {
    let f = std::fs::File::open(file).or_else(|e| err(path, format!("{}: {e}", file.display())))?;
    let npy = npyz::NpyFile::new(std::io::BufReader::new(f))
        .or_else(|e| err(path, format!("{}: not a .npy file: {e}", file.display())))?;
    let ts = match npy.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        other => {
            return err(
                path,
                format!("{}: structured dtype {other:?}", file.display()),
            );
        }
    };
    let dtype = strata_orchestrator::npy::dtype_of(&ts).map_or_else(
        || {
            err(
                path,
                format!("{}: dtype {ts:?} is not supported", file.display()),
            )
        },
        Ok,
    )?;
    if npy.order() != npyz::Order::C {
        return err(
            path,
            format!(
                "{}: Fortran-order arrays are not supported; save with C order",
                file.display()
            ),
        );
    }
    let shape: Vec<u32> = match npy.shape() {
        [] => vec![1],
        s => s
            .iter()
            .map(|&d| u32::try_from(d).unwrap_or(u32::MAX))
            .collect(),
    };
    Ok((shape, dtype))
}
