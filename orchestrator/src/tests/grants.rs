//! A view's grant binds the driver too: a write through a view (or the
//! buffer handle taken from one) that does not grant WRITE is refused
//! with [`ViewError::ReadOnly`] naming the buffer and the grant, and
//! nothing lands; reads and the owner's handle are not limited by it.

use strata_orchestrator_core::WorkerId;
use strata_wire::{Access, DType};

use crate::error::ViewError;
use crate::{Cluster, Error, View};

fn one() -> Cluster {
    Cluster::builder().in_process(1).start().unwrap()
}

/// Whether `e` is the read-only refusal for `view`'s buffer.
fn read_only_of(e: &Result<(), Error>, view: &View) -> bool {
    matches!(e, Err(Error::View(ViewError::ReadOnly { buffer, granted: Access::Read }))
        if *buffer == view.buffer().identity())
}

#[test]
fn a_read_only_view_refuses_the_driver_s_writes_and_nothing_lands() {
    let c = one();
    let full = c
        .buffer_from_slice(&[1.0f32; 16])
        .unwrap()
        .tensor(&[16], DType::F32)
        .unwrap();
    let ro = full.read_only().unwrap();
    let half = ro.reshape(0, &[8], &[2], DType::F32).unwrap();
    let refused: [(&str, Result<(), Error>); 6] = [
        ("View::write", ro.write(&[9.0f32; 16])),
        ("a reshaped view's write", half.write(&[9.0f32; 8])),
        ("check_write", ro.check_write()),
        (
            "its buffer's write_bytes",
            ro.buffer().write_bytes(0, &[0xff; 4]),
        ),
        (
            "its buffer's write_slice",
            ro.buffer().write_slice(4, &[9.0f32]),
        ),
        (
            "a view made from its buffer",
            ro.buffer()
                .tensor(&[16], DType::F32)
                .unwrap()
                .write(&[9.0f32; 16]),
        ),
    ];
    for (what, e) in &refused {
        assert!(read_only_of(e, &full), "{what}: {e:?}");
    }
    let e = ro.write(&[9.0f32; 16]).unwrap_err().to_string();
    assert!(
        e.contains(&full.buffer().identity().to_string()) && e.contains("grants READ"),
        "{e}"
    );
    // Nothing landed; reads through it work; the full view still writes.
    assert_eq!(ro.read::<f32>().unwrap(), vec![1.0; 16]);
    ro.check_read().unwrap();
    assert_eq!(ro.buffer().to_vec::<f32>().unwrap(), vec![1.0; 16]);
    full.write(&[2.0f32; 16]).unwrap();
    assert_eq!(ro.read::<f32>().unwrap(), vec![2.0; 16]);
    // The narrowed handle cannot be widened back by making a view of it.
    assert_eq!(ro.buffer().descriptor().access(), Access::Read);
    assert!(
        ro.buffer()
            .tensor(&[16], DType::F32)
            .unwrap()
            .with_access(Access::ReadWrite)
            .is_err()
    );
}

/// The owner's handle writes whatever it grants tasks (how a READ buffer
/// is filled); views of it follow their grant.
#[test]
fn the_owner_fills_a_read_buffer_and_its_views_follow_their_grant() {
    let c = one();
    let b = c.buffer_with(64, Access::Read).unwrap();
    b.write_slice(0, &[3.0f32; 16]).unwrap();
    let v = b.tensor(&[16], DType::F32).unwrap();
    assert!(read_only_of(&v.write(&[9.0f32; 16]), &v));
    assert_eq!(v.read::<f32>().unwrap(), vec![3.0; 16]);

    // A WRITE-only grant tells tasks not to read: the driver still reads
    // what they wrote, and writes.
    let full = c
        .buffer_from_slice(&[4.0f32; 4])
        .unwrap()
        .tensor(&[4], DType::F32)
        .unwrap();
    let wo = full.with_access(Access::Write).unwrap();
    assert_eq!(wo.read::<f32>().unwrap(), vec![4.0; 4]);
    wo.write(&[5.0f32; 4]).unwrap();
    wo.buffer().write_bytes(0, &[0; 4]).unwrap();
    assert_eq!(full.read::<f32>().unwrap(), vec![0.0, 5.0, 5.0, 5.0]);
}

#[test]
fn a_read_only_device_view_refuses_write_device() {
    let c = one();
    let w = WorkerId(0);
    let d = c.device_buffer(w, 64).unwrap();
    c.write_device(&d, 0, &[1; 64]).unwrap();
    let ro = d.tensor(&[16], DType::F32).unwrap().read_only().unwrap();
    let e = c.write_device(ro.buffer(), 0, &[2; 64]);
    assert!(read_only_of(&e, &ro), "{e:?}");
    assert!(read_only_of(&ro.check_write(), &ro));
    ro.check_read().unwrap();
    assert_eq!(c.read_device(ro.buffer(), 0, 64).unwrap(), vec![1; 64]);
}
