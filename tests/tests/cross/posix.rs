//! POSIX shared-memory buffers, simpler's own host buffers,
//! through real worker processes.
//!
//! A producer that knows nothing of strata (`tests/producers/
//! posix_shm_producer.py`: Python's standard library, `struct` against the
//! documented record layout) creates the object, fills it and writes the
//! BufferDescriptor and Tensor records that name it and views of it.
//! strata decodes and validates those records, opens the object by the
//! name they carry (`Cluster::posix_buffer`), runs tasks on the views they
//! describe on worker processes (which copy the bytes in and out, never
//! mapping the object), and the producer reads the results back.

use std::path::PathBuf;
use std::process::Command;

use strata_orchestrator::{Cluster, Task, WorkerId};
use strata_tests::strata_bin;
use strata_wire::{Backing, BufferDescriptor, DType, Tensor};

fn producer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("producers/posix_shm_producer.py")
}

/// Runs the producer with `args`; its stdout.
fn produce(args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(producer())
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "producer {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Unlinks the producer's object however the test ends.
struct Unlink(String);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = nix::sys::mman::shm_unlink(format!("/{}", self.0).as_str());
    }
}

#[test]
fn records_from_a_foreign_producer_name_a_posix_object_that_tasks_read_and_write() {
    const ROWS: usize = 8;
    const COLS: usize = 12;
    let name = format!("strata-producer-{}", std::process::id());
    let _unlink = Unlink(name.clone());
    let json: serde_json::Value =
        serde_json::from_str(&produce(&["create", &name, "8", "12"])).unwrap();

    // The producer's records decode and validate as strata's own.
    let desc = BufferDescriptor::decode(&unhex(json["descriptor"].as_str().unwrap())).unwrap();
    let nbytes = json["nbytes"].as_u64().unwrap();
    assert_eq!(desc.nbytes(), nbytes);
    match desc.backing() {
        Backing::PosixShm { name: n } => assert_eq!(n.as_str(), name),
        other => panic!("a POSIX_SHM record, not {other:?}"),
    }
    let view = |key: &str| {
        let t = Tensor::decode(&unhex(json["views"][key].as_str().unwrap())).unwrap();
        assert_eq!(*t.buffer(), desc, "{key} names the same buffer");
        t
    };
    let (matrix, transposed, out, even) = (
        view("matrix"),
        view("transposed"),
        view("out"),
        view("even_columns"),
    );
    assert_eq!(transposed.shape(), [COLS as u32, ROWS as u32]);

    // strata opens the object the records name, and runs tasks on the
    // views they describe, on two worker processes.
    let c = Cluster::builder()
        .local(2)
        .worker_binary(strata_bin())
        .start()
        .expect("cluster");
    let name_in_record = match desc.backing() {
        Backing::PosixShm { name } => name.as_str().to_owned(),
        _ => unreachable!(),
    };
    let buf = c.posix_buffer(&name_in_record, desc.nbytes()).unwrap();
    let at = |t: &Tensor| {
        buf.view(t.byte_offset(), t.shape(), t.strides(), t.dtype())
            .unwrap()
    };
    // out, as a COLS x ROWS matrix, = the transpose (a transposed view
    // in); then the even columns of out, as ROWS x COLS, = the even
    // columns of the matrix squared (strided views in and out, ordered
    // after the copy by the bytes they share).
    let out_t = buf
        .view(
            out.byte_offset(),
            &[COLS as u32, ROWS as u32],
            &[ROWS as u32, 1],
            DType::F32,
        )
        .unwrap();
    let out_even = buf
        .view(out.byte_offset(), even.shape(), even.strides(), DType::F32)
        .unwrap();
    c.submit(Task::new("copy").input(&at(&transposed)).output(&out_t))
        .unwrap();
    let evens = at(&even);
    c.submit(
        Task::new("mul")
            .input(&evens)
            .input(&evens)
            .output(&out_even),
    )
    .unwrap();
    c.wait_all().unwrap();
    assert_eq!(at(&matrix).shape(), [ROWS as u32, COLS as u32]);
    // The workers hold the object's fd but never map it.
    for w in 0..2 {
        let pid = c.worker_pid(WorkerId(w)).unwrap();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        assert!(
            !maps.contains(&format!("/dev/shm/{name}")),
            "worker {w} mapped the object:\n{maps}"
        );
    }
    drop(buf);
    drop(c);

    // The producer reads the results back from its object.
    let bytes = unhex(produce(&["read", &name, &nbytes.to_string()]).trim());
    let f = |k: usize| f32::from_le_bytes(bytes[4 * k..4 * k + 4].try_into().unwrap());
    let m = |r: usize, col: usize| (r * COLS + col) as f32;
    let mut want = vec![0f32; ROWS * COLS];
    for r in 0..ROWS {
        for col in 0..COLS {
            want[col * ROWS + r] = m(r, col);
        }
    }
    for r in 0..ROWS {
        for col in (0..COLS).step_by(2) {
            want[r * COLS + col] = m(r, col) * m(r, col);
        }
    }
    for r in 0..ROWS {
        for col in 0..COLS {
            assert_eq!(f(r * COLS + col), m(r, col), "the matrix is untouched");
        }
    }
    for (k, w) in want.iter().enumerate() {
        assert_eq!(f(ROWS * COLS + k), *w, "out element {k}");
    }
    // The object was the producer's: strata left it in place.
    assert!(std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    produce(&["unlink", &name]);
}
