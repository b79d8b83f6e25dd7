//! Shared blocks on every chip: device memory of its own that leaves the
//! chip as a file descriptor, mapped elsewhere (this process, or another)
//! to the same bytes; refused where it is not a shared block or does not
//! check out.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use strata_chip_runtime::shared::{Place, SharedMemory};
use strata_chip_runtime::{Device, DeviceBlock, Error, Region, Registry};
use strata_wire::ArgTag;

use crate::common::{CUDA_KEYS, MODES, device_f32_arg, run};
use crate::conformance::each_chip;

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// A fill of `value` over the F32 elements of `block`, as a task's
/// device-buffer argument.
fn fill(dev: &dyn Device, reg: &Registry, block: DeviceBlock, value: f32) {
    run(
        dev,
        reg,
        "fill",
        vec![device_f32_arg(block, ArgTag::Output)],
        vec![f64::from(value).to_bits()],
    )
    .unwrap();
}

/// A shared block is handed out zeroed; its descriptor maps to the same
/// bytes both ways (copies to and from the chip, a kernel's writes);
/// every export is a descriptor of its own; freeing it leaves a mapping
/// made before valid.
#[test]
fn a_shared_block_maps_elsewhere_to_the_same_bytes() {
    each_chip(11, &MODES, CUDA_KEYS, &["fill"], |dev, reg, _| {
        let len = (1 << 20) + 64;
        let before = dev.stats().shared;
        let block = dev.alloc(Region::Shared, len).unwrap();
        assert_eq!(block.region, Region::Shared);
        assert!(dev.stats().shared >= before + len, "counted while live");
        let mut back = vec![1u8; len as usize];
        dev.copy_from_device(&block, 0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0), "a shared block is zeroed");
        let bytes = pattern(len as usize, 7);
        dev.copy_to_device(&block, 0, &bytes).unwrap();
        let shared = dev.export(&block).unwrap();
        assert!(shared.len >= len);
        let again = dev.export(&block).unwrap();
        assert_ne!(shared.fd.as_raw_fd(), again.fd.as_raw_fd());
        let mapped = shared.map().unwrap();
        assert_eq!(mapped.place(), shared.place);
        let mut seen = vec![0u8; len as usize];
        mapped.read(0, &mut seen).unwrap();
        assert_eq!(seen, bytes, "the mapping sees the chip's bytes");
        // Written there, seen by the chip.
        let other = pattern(4096, 99);
        mapped.write(8192, &other).unwrap();
        dev.copy_from_device(&block, 8192, &mut back[..4096])
            .unwrap();
        assert_eq!(back[..4096], other[..]);
        // A kernel's writes reach the mapping.
        fill(dev, reg, block, 2.5);
        mapped.read(0, &mut seen[..16]).unwrap();
        assert_eq!(seen[..16], [2.5f32.to_le_bytes(); 4].concat());
        assert!(mapped.read(mapped.len() - 4, &mut [0u8; 8]).is_err());
        drop(again);
        dev.free(block.addr).unwrap();
        assert_eq!(dev.stats().shared, before, "no longer counted once freed");
        // The chip let go; the mapping holds the memory still.
        mapped.read(0, &mut seen[..16]).unwrap();
        assert_eq!(seen[..16], [2.5f32.to_le_bytes(); 4].concat());
        assert!(matches!(
            dev.export(&block),
            Err(Error::UnknownBlock { .. })
        ));
    });
}

/// A chip maps an exported block (here its own export: the same memory
/// at another address) and uses it in place: kernels there write the
/// exporter's bytes and copies see them, both ways; freeing the import
/// leaves the block, and freeing the block leaves the import.
#[test]
fn an_imported_block_is_the_exporters_memory_in_place() {
    each_chip(14, &MODES, CUDA_KEYS, &["fill"], |dev, reg, _| {
        let len = (1 << 20) + 64;
        let block = dev.alloc(Region::Shared, len).unwrap();
        dev.copy_to_device(&block, 0, &pattern(len as usize, 5))
            .unwrap();
        let before = dev.stats().shared;
        let imported = dev.import(dev.export(&block).unwrap()).unwrap();
        assert_eq!(imported.region, Region::Shared);
        assert_ne!(imported.addr, block.addr);
        assert!(imported.len >= len);
        assert!(dev.stats().shared > before, "an import is counted");
        let mut seen = vec![0u8; len as usize];
        dev.copy_from_device(&imported, 0, &mut seen).unwrap();
        assert_eq!(
            seen,
            pattern(len as usize, 5),
            "not zeroed: the exporter's bytes"
        );
        fill(dev, reg, imported, 4.0);
        dev.copy_from_device(&block, 0, &mut seen[..16]).unwrap();
        assert_eq!(
            seen[..16],
            [4f32.to_le_bytes(); 4].concat(),
            "a kernel wrote in place"
        );
        dev.copy_to_device(&block, 64, &[9u8; 8]).unwrap();
        dev.copy_from_device(&imported, 64, &mut seen[..8]).unwrap();
        assert_eq!(seen[..8], [9u8; 8]);
        // Memory of another kind of place is refused, naming both.
        let export = dev.export(&block).unwrap();
        let elsewhere = match export.place {
            Place::Host => Place::Cuda(0),
            Place::Cuda(_) => Place::Host,
        };
        let e = dev
            .import(SharedMemory {
                place: elsewhere,
                ..export
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("not {elsewhere}")), "{e}");
        dev.free(block.addr).unwrap();
        fill(dev, reg, imported, 6.0);
        dev.copy_from_device(&imported, 0, &mut seen[..4]).unwrap();
        assert_eq!(seen[..4], 6f32.to_le_bytes(), "the import holds the memory");
        dev.free(imported.addr).unwrap();
        assert!(dev.check_block(&imported).is_err());
    });
}

/// What a chip cannot map is refused before it is used, naming why:
/// memory of another kind of place, a host descriptor that does not check
/// out; a block one simulated chip exports maps on another.
#[test]
fn an_import_a_chip_cannot_map_is_refused() {
    let a = strata_chip_runtime::SimDevice::from_spec("sim:mem=1MiB").unwrap();
    let b = strata_chip_runtime::SimDevice::from_spec("sim:mem=1MiB,mode=unified").unwrap();
    let block = a.alloc(Region::Shared, 4096).unwrap();
    a.copy_to_device(&block, 0, &[3u8; 4096]).unwrap();
    let theirs = b.import(a.export(&block).unwrap()).unwrap();
    let mut seen = [0u8; 4096];
    b.copy_from_device(&theirs, 0, &mut seen).unwrap();
    assert_eq!(seen, [3u8; 4096], "another chip's block, mapped");
    b.copy_to_device(&theirs, 0, &[8u8; 16]).unwrap();
    a.copy_from_device(&block, 0, &mut seen[..16]).unwrap();
    assert_eq!(seen[..16], [8u8; 16]);

    let gpu = SharedMemory {
        place: Place::Cuda(0),
        ..a.export(&block).unwrap()
    };
    let e = b.import(gpu).unwrap_err().to_string();
    assert!(e.contains("maps host memory, not memory of GPU 0"), "{e}");
    let unsealed = memfd::MemfdOptions::default()
        .allow_sealing(true)
        .create("t")
        .unwrap();
    unsealed.as_file().set_len(4096).unwrap();
    let e = b
        .import(SharedMemory {
            fd: OwnedFd::from(unsealed.into_file()),
            len: 4096,
            place: Place::Host,
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("not sealed against shrinking"), "{e}");
    let long = SharedMemory {
        len: 1 << 20,
        ..a.export(&block).unwrap()
    };
    let e = b.import(long).unwrap_err().to_string();
    assert!(e.contains("fewer than"), "{e}");
}

/// Only a shared block leaves the chip; a freed one is gone.
#[test]
fn only_shared_blocks_are_exported() {
    each_chip(12, &MODES, CUDA_KEYS, &[], |dev, _, _| {
        let block = dev.alloc(Region::Persistent, 4096).unwrap();
        let e = dev.export(&block).unwrap_err();
        assert!(e.to_string().contains("only shared blocks"), "{e}");
        dev.free(block.addr).unwrap();
        let shared = dev.alloc(Region::Shared, 100).unwrap();
        assert!(dev.check_block(&shared).is_ok());
        let wider = DeviceBlock {
            len: 1 << 30,
            ..shared
        };
        assert!(
            dev.check_block(&wider).is_err(),
            "a block is no longer than allocated"
        );
        dev.free(shared.addr).unwrap();
        assert!(dev.check_block(&shared).is_err());
        assert!(dev.free(shared.addr).is_err(), "freed twice");
    });
}

/// A host descriptor that does not check out is refused before it is
/// mapped: not sealed against shrinking, shorter than claimed, not on
/// tmpfs, or of no length.
#[test]
fn a_host_descriptor_that_does_not_check_out_is_refused() {
    let unsealed = memfd::MemfdOptions::default()
        .allow_sealing(true)
        .create("t")
        .unwrap();
    unsealed.as_file().set_len(4096).unwrap();
    let fd = OwnedFd::from(unsealed.into_file());
    let m = SharedMemory {
        fd,
        len: 4096,
        place: Place::Host,
    };
    let e = m.map().unwrap_err();
    assert!(
        e.to_string().contains("not sealed against shrinking"),
        "{e}"
    );

    let sealed = memfd::MemfdOptions::default()
        .allow_sealing(true)
        .create("t")
        .unwrap();
    sealed.as_file().set_len(4096).unwrap();
    sealed.add_seals(&[memfd::FileSeal::SealShrink]).unwrap();
    let fd = OwnedFd::from(sealed.into_file());
    let short = SharedMemory {
        fd,
        len: 8192,
        place: Place::Host,
    };
    let e = short.map().unwrap_err();
    assert!(e.to_string().contains("fewer than the 8192 claimed"), "{e}");
    let none = SharedMemory { len: 0, ..short };
    assert!(none.map().is_err());

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, [0u8; 4096]).unwrap();
    let file = OwnedFd::from(std::fs::File::open(&path).unwrap());
    let on_disk = SharedMemory {
        fd: file,
        len: 4096,
        place: Place::Host,
    };
    match on_disk.map() {
        // /tmp may itself be a tmpfs; then the seal check refuses it.
        Err(e) => assert!(
            e.to_string().contains("not tmpfs") || e.to_string().contains("sealed"),
            "{e}"
        ),
        Ok(_) => panic!("a plain file was mapped as a shared block"),
    }
}

/// The variables a child process of [`another_process_maps_the_block`]
/// finds its descriptor by.
const CHILD_FD: &str = "STRATA_SHARED_TEST_FD";
const CHILD_LEN: &str = "STRATA_SHARED_TEST_LEN";
const CHILD_PLACE: &str = "STRATA_SHARED_TEST_PLACE";

/// Another process maps the block by the descriptor it inherited, sees
/// the chip's bytes, and writes bytes the chip then sees.
#[test]
fn another_process_maps_the_block() {
    if std::env::var_os(CHILD_FD).is_some() {
        return child_side();
    }
    each_chip(13, &MODES, CUDA_KEYS, &[], |dev, _, _| {
        let len: u64 = 3 << 20;
        let block = dev.alloc(Region::Shared, len).unwrap();
        dev.copy_to_device(&block, 0, &pattern(len as usize, 3))
            .unwrap();
        let shared = dev.export(&block).unwrap();
        // Inherited: not close-on-exec.
        nix::fcntl::fcntl(
            &shared.fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .unwrap();
        let place = match shared.place {
            Place::Host => "host".to_owned(),
            Place::Cuda(n) => format!("cuda:{n}"),
        };
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "shared::another_process_maps_the_block",
                "--exact",
                "--nocapture",
            ])
            .env(CHILD_FD, shared.fd.as_raw_fd().to_string())
            .env(CHILD_LEN, shared.len.to_string())
            .env(CHILD_PLACE, place)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the child failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut back = vec![0u8; 4096];
        dev.copy_from_device(&block, len - 4096, &mut back).unwrap();
        assert_eq!(back, pattern(4096, 201), "the chip sees the child's bytes");
        drop(shared);
        dev.free(block.addr).unwrap();
    });
}

/// The child of [`another_process_maps_the_block`].
fn child_side() {
    let var = |k: &str| std::env::var(k).unwrap();
    let raw: i32 = var(CHILD_FD).parse().unwrap();
    let len: u64 = var(CHILD_LEN).parse().unwrap();
    let place = match var(CHILD_PLACE).as_str() {
        "host" => Place::Host,
        s => Place::Cuda(s.trim_start_matches("cuda:").parse().unwrap()),
    };
    // SAFETY: the parent passed this descriptor, open, for us to own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mapped = Arc::new(SharedMemory { fd, len, place }.map().unwrap());
    let mut seen = vec![0u8; 3 << 20];
    mapped.read(0, &mut seen).unwrap();
    assert_eq!(seen, pattern(3 << 20, 3), "the child sees the chip's bytes");
    mapped.write((3 << 20) - 4096, &pattern(4096, 201)).unwrap();
}
