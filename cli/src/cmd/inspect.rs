//! `strata inspect FILE`: decode a wire-format file and print it as JSON.
//!
//! Exit status: 0 on success, 2 when the bytes are rejected by the
//! validator (the message names the field), 1 when the file cannot be read.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use serde_json::{Value, json};
use strata_wire::{
    Backing, BufferDescriptor, CanonicalIdentity, DESCRIPTOR_MAGIC, Decoded, Tensor, decode_any,
};

/// Exit status for input the validator rejects.
pub const EXIT_INVALID: u8 = 2;

/// Reads, decodes and prints `file`; see the module docs for the exit status.
pub fn run(file: &Path, compact: bool) -> ExitCode {
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("strata inspect: cannot read {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
    };
    match decode_any(&bytes) {
        Ok(decoded) => {
            let value = to_json(&decoded);
            let text = if compact {
                value.to_string()
            } else {
                pretty(&value)
            };
            match writeln!(std::io::stdout().lock(), "{text}") {
                Ok(()) => ExitCode::SUCCESS,
                // A reader that stops early (`| head`) is not an error.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("strata inspect: cannot write output: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("strata inspect: {}: invalid: {e}", file.display());
            ExitCode::from(EXIT_INVALID)
        }
    }
}

fn pretty(v: &Value) -> String {
    // Serializing a Value cannot fail; fall back to the compact form anyway.
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// The JSON form of a decoded file: fields by name, dtype and enum fields
/// by name, identities and addresses in hex.
pub fn to_json(decoded: &Decoded) -> Value {
    match decoded {
        Decoded::Tensor(t) => json!({ "kind": "tensor", "tensor": tensor_json(t) }),
        Decoded::TaskArgs(args) => json!({
            "kind": "task_args",
            "tensor_count": args.tensors().len(),
            "scalar_count": args.scalars().len(),
            "tensors": args.tensors().iter().map(tensor_json).collect::<Vec<_>>(),
            "scalars": args.scalars(),
        }),
    }
}

/// The JSON form of one tensor (an extension dtype, outside the seed
/// format's codes, also says so: `"dtype_extension": true`).
pub fn tensor_json(t: &Tensor) -> Value {
    let mut v = json!({
        "buffer": descriptor_json(t.buffer()),
        "byte_offset": t.byte_offset(),
        "ndims": t.ndims(),
        "shape": t.shape(),
        "strides": t.strides(),
        "dtype": t.dtype().name(),
        "extent_bytes": t.extent_bytes(),
        "contiguous": t.is_contiguous(),
    });
    if t.dtype().is_extension() {
        v["dtype_extension"] = json!(true);
    }
    v
}

fn descriptor_json(d: &BufferDescriptor) -> Value {
    let body = match *d.backing() {
        Backing::ForkShm { addr }
        | Backing::VmmWindow { addr }
        | Backing::DeviceMalloc { addr }
        | Backing::ForkCow { addr } => {
            json!({ "address": format!("{:#018x}", addr.get()) })
        }
        Backing::PosixShm { name } => json!({ "name": name.as_str() }),
        Backing::RemoteSidecar => json!({}),
        Backing::Memfd { st_dev, st_ino } => json!({ "st_dev": st_dev, "st_ino": st_ino }),
        // A backing added to the wire crate after this: its kind is named
        // below; a test lists every kind this build shows.
        _ => json!({}),
    };
    json!({
        "magic": format!("{DESCRIPTOR_MAGIC:#06x}"),
        "address_space": d.address_space().name(),
        "access": d.access().name(),
        "backend_kind": d.backing().kind().name(),
        "identity": identity_json(d.identity()),
        "nbytes": d.nbytes(),
        "owner_worker_path_id": d.owner_worker_path_id(),
        "owner_worker_path": d.owner_path().map(|p| p.to_string()),
        "body": body,
    })
}

fn identity_json(id: &CanonicalIdentity) -> Value {
    json!({
        "owner_instance_id": id.owner_hex(),
        "buffer_id": format!("{:#018x}", id.buffer_id()),
        "generation": id.generation(),
        "hex": id.encode().iter().map(|b| format!("{b:02x}")).collect::<String>(),
    })
}

#[cfg(test)]
mod tests {
    use strata_wire::{
        Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity, DType, Tensor,
    };

    use super::{descriptor_json, tensor_json};

    /// Every backing kind this build decodes shows its fields (a sidecar
    /// has none): the match that renders them has a catch-all arm for
    /// kinds added to the wire crate later, so this test is what notices
    /// one.
    #[test]
    fn every_backing_kind_shows_its_fields() {
        use std::num::NonZeroU64;

        use strata_wire::{BackendKind, ShmName};
        let addr = NonZeroU64::new(0x1000).unwrap();
        let cases = [
            (
                Backing::ForkShm { addr },
                AddressSpace::Host,
                Access::ReadWrite,
                "address",
            ),
            (
                Backing::PosixShm {
                    name: ShmName::new("simpler.0").unwrap(),
                },
                AddressSpace::Host,
                Access::ReadWrite,
                "name",
            ),
            (
                Backing::VmmWindow { addr },
                AddressSpace::Device,
                Access::ReadWrite,
                "address",
            ),
            (
                Backing::RemoteSidecar,
                AddressSpace::Host,
                Access::ReadWrite,
                "",
            ),
            (
                Backing::DeviceMalloc { addr },
                AddressSpace::Device,
                Access::ReadWrite,
                "address",
            ),
            (
                Backing::ForkCow { addr },
                AddressSpace::Host,
                Access::Read,
                "address",
            ),
            (
                Backing::Memfd {
                    st_dev: 1,
                    st_ino: 2,
                },
                AddressSpace::Host,
                Access::ReadWrite,
                "st_ino",
            ),
        ];
        let kinds = (0..=u8::MAX).filter_map(BackendKind::from_code).count();
        assert_eq!(cases.len(), kinds, "a backing kind this test does not show");
        let id = CanonicalIdentity::new(*b"inspect!", 1, 1).unwrap();
        for (backing, space, access, field) in cases {
            let kind = backing.kind().name();
            let d = BufferDescriptor::new(id, 4096, space, access, backing).unwrap();
            let v = descriptor_json(&d);
            assert_eq!(v["backend_kind"], kind);
            let body = v["body"].as_object().unwrap();
            if field.is_empty() {
                assert!(body.is_empty(), "{kind}: {body:?}");
            } else {
                assert!(body.contains_key(field), "{kind}: {body:?}");
            }
        }
    }

    /// The owner's path id shows as `<path#N>` beside the number; 0 (no
    /// owning worker) shows as null.
    #[test]
    fn the_owner_path_id_shows_as_a_path_label() {
        let id = CanonicalIdentity::new(*b"inspect!", 1, 1).unwrap();
        let addr = std::num::NonZeroU64::new(0x40).unwrap();
        let d = BufferDescriptor::new(
            id,
            4096,
            AddressSpace::Device,
            Access::ReadWrite,
            Backing::DeviceMalloc { addr },
        )
        .unwrap();
        let v = descriptor_json(&d);
        assert_eq!(v["owner_worker_path_id"], 0);
        assert!(v["owner_worker_path"].is_null());
        let v = descriptor_json(&d.with_owner_worker_path_id(3));
        assert_eq!(v["owner_worker_path_id"], 3);
        assert_eq!(v["owner_worker_path"], "<path#3>");
    }

    #[test]
    fn an_extension_dtype_is_named_and_marked() {
        let id = CanonicalIdentity::new(*b"inspect!", 1, 1).unwrap();
        let buf = BufferDescriptor::new(
            id,
            4096,
            AddressSpace::Host,
            Access::Read,
            Backing::Memfd {
                st_dev: 1,
                st_ino: 2,
            },
        )
        .unwrap();
        for (dtype, name, extension) in [
            (DType::F32, "F32", false),
            (DType::F64, "F64", true),
            (DType::C64, "C64", true),
            (DType::C128, "C128", true),
        ] {
            let t = Tensor::new(buf, 16, &[4, 2], &[2, 1], dtype).unwrap();
            let v = tensor_json(&t);
            assert_eq!(v["dtype"], name);
            assert_eq!(v.get("dtype_extension").is_some(), extension, "{name}");
            assert_eq!(v["extent_bytes"], 8 * u64::from(dtype.bits() / 8), "{name}");
        }
    }
}
