//! `Cluster::posix_buffer`: a host buffer over a POSIX shared-memory
//! object opened (or created) by name, used by in-process workers by copy.

use strata_wire::{Backing, DType};

use crate::error::BufferError;
use crate::{Cluster, Error, Task};

fn cluster() -> Cluster {
    Cluster::builder().in_process(2).start().unwrap()
}

fn name(what: &str) -> String {
    format!("strata-{what}-{}", std::process::id())
}

fn exists(name: &str) -> bool {
    std::path::Path::new(&format!("/dev/shm/{name}")).exists()
}

/// An object that does not exist is created zeroed at the size asked,
/// tasks write it, another opener sees their bytes, and its name goes
/// when the buffer is released.
#[test]
fn a_created_object_holds_what_tasks_write_and_is_unlinked_when_released() {
    let c = cluster();
    let n = name("created");
    let buf = c.posix_buffer(&n, 64 * 4).unwrap();
    assert!(exists(&n));
    match buf.descriptor().backing() {
        Backing::PosixShm { name } => assert_eq!(name.as_str(), n),
        other => panic!("a POSIX_SHM buffer, not {other:?}"),
    }
    assert_eq!(buf.to_bytes().unwrap(), vec![0u8; 256]);
    let all = buf.tensor(&[64], DType::F32).unwrap();
    let half = buf.view(128, &[16, 2], &[2, 1], DType::F32).unwrap();
    c.submit(Task::new("fill").output(&all).scalar_f64(1.5))
        .unwrap();
    c.submit(Task::new("fill").output(&half).scalar_f64(-2.0))
        .unwrap();
    c.wait_all().unwrap();
    let got = all.read::<f32>().unwrap();
    assert!(got[..32].iter().all(|&v| v == 1.5), "{got:?}");
    assert!(got[32..].iter().all(|&v| v == -2.0), "{got:?}");
    // Another opener of the name (here the driver itself, as another
    // program would) sees the bytes.
    let again = c.posix_buffer(&n, 256).unwrap();
    assert_eq!(again.to_bytes().unwrap(), buf.to_bytes().unwrap());
    drop((all, half, again));
    drop(buf);
    c.wait_all().unwrap();
    assert!(
        !exists(&n),
        "the name of an object strata created goes with it"
    );
}

#[test]
fn bad_names_sizes_and_small_objects_are_refused_naming_why() {
    let c = cluster();
    let refused = |name: &str, nbytes: u64| match c.posix_buffer(name, nbytes) {
        Err(Error::Buffer(e)) => e,
        other => panic!("{name:?} {nbytes}: {other:?}"),
    };
    let e = refused("a/b", 64);
    assert!(e.to_string().contains("may not contain '/'"), "{e}");
    let e = refused("", 64);
    assert!(e.to_string().contains("1 to 32 bytes"), "{e}");
    assert!(matches!(refused(&name("empty"), 0), BufferError::Empty));
    assert!(!exists(&name("empty")), "nothing is created for a refusal");
    // An existing object smaller than asked.
    let n = name("small");
    let small = c.posix_buffer(&n, 64).unwrap();
    let e = refused(&n, 128);
    assert!(
        e.to_string().contains(&format!(
            "the POSIX shared-memory object '{n}' for a buffer of 128 bytes: it holds 64 bytes"
        )),
        "{e}"
    );
    drop(small);
}
