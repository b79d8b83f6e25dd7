//! JSON field readers for graph files: each checks one value's type and
//! range and names the value's JSON path when it is wrong.

use serde_json::{Map, Value};
use strata_wire::DType;

use super::{GraphError, ScalarDef, err};

pub(super) fn object<'a>(
    v: &'a Value,
    path: &str,
    allowed: &[&str],
) -> Result<&'a Map<String, Value>, GraphError> {
    let Some(o) = v.as_object() else {
        return err(path, format!("expected an object, found {}", kind(v)));
    };
    for k in o.keys() {
        if !allowed.contains(&k.as_str()) {
            return err(
                join(path, k),
                format!("unknown field; expected one of {}", allowed.join(", ")),
            );
        }
    }
    Ok(o)
}

pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn u64_of(v: &Value, path: &str) -> Result<u64, GraphError> {
    v.as_u64().map_or_else(
        || err(path, format!("expected a whole number ≥ 0, found {v}")),
        Ok,
    )
}

pub(super) fn u32_of(v: &Value, path: &str) -> Result<u32, GraphError> {
    let n = u64_of(v, path)?;
    u32::try_from(n).or_else(|_| err(path, format!("{n} does not fit 32 bits")))
}

pub(super) fn f64_of(v: &Value, path: &str) -> Result<f64, GraphError> {
    v.as_f64()
        .map_or_else(|| err(path, format!("expected a number, found {v}")), Ok)
}

/// A task's timeout: a positive, finite number of seconds that a
/// [`Duration`](std::time::Duration) can hold.
pub(super) fn timeout_of(v: &Value, path: &str) -> Result<std::time::Duration, GraphError> {
    let secs = v.as_f64().map_or_else(
        || {
            err(
                path,
                format!("expected a number of seconds, found {}", kind(v)),
            )
        },
        Ok,
    )?;
    if secs <= 0.0 || !secs.is_finite() {
        return err(
            path,
            format!("{v} seconds can never be met; give a positive number of seconds"),
        );
    }
    std::time::Duration::try_from_secs_f64(secs)
        .or_else(|_| err(path, format!("{v} seconds is too long to count")))
}

pub(super) fn str_of<'a>(v: &'a Value, path: &str) -> Result<&'a str, GraphError> {
    v.as_str().map_or_else(
        || err(path, format!("expected a string, found {}", kind(v))),
        Ok,
    )
}

pub(super) fn dims_of(v: &Value, path: &str) -> Result<Vec<u32>, GraphError> {
    let Some(a) = v.as_array() else {
        return err(
            path,
            format!("expected an array of whole numbers, found {}", kind(v)),
        );
    };
    if a.is_empty() || a.len() > strata_wire::MAX_DIMS {
        return err(
            path,
            format!("{} dimensions; 1 to {}", a.len(), strata_wire::MAX_DIMS),
        );
    }
    a.iter()
        .enumerate()
        .map(|(i, d)| u32_of(d, &format!("{path}[{i}]")))
        .collect()
}

pub(super) fn dtype_of(v: &Value, path: &str) -> Result<DType, GraphError> {
    let s = str_of(v, path)?;
    DType::from_name(s).map_or_else(
        || {
            err(
                path,
                format!(
                    "unknown dtype {s:?}; one of {}",
                    DType::ALL.map(DType::name).join(", ")
                ),
            )
        },
        Ok,
    )
}

pub(super) fn row_major(shape: &[u32]) -> Vec<u32> {
    let mut st = vec![1u32; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1].saturating_mul(shape[i + 1]);
    }
    st
}

pub(super) fn scalar_def(v: &Value, path: &str) -> Result<ScalarDef, GraphError> {
    match v {
        Value::Number(n) => Ok(ScalarDef::Number(n.clone())),
        Value::Object(o) if o.len() == 1 => {
            let (k, x) = o.iter().next().map_or_else(|| err(path, "empty"), Ok)?;
            let p = join(path, k);
            match k.as_str() {
                "u64" => Ok(ScalarDef::U64(u64_of(x, &p)?)),
                "i64" => x
                    .as_i64()
                    .map(ScalarDef::I64)
                    .map_or_else(|| err(p, format!("expected a whole number, found {x}")), Ok),
                "f64" => Ok(ScalarDef::F64(f64_of(x, &p)?)),
                _ => err(p, "unknown scalar type; one of u64, i64, f64"),
            }
        }
        other => err(
            path,
            format!(
                "expected a number or {{\"u64\"|\"i64\"|\"f64\": number}}, found {}",
                kind(other)
            ),
        ),
    }
}
