use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use strata_wire::check::test_buffer;
use strata_wire::{Access, AddressSpace, Backing};

const S1: SessionId = SessionId(1);
const S2: SessionId = SessionId(2);

struct Counting {
    maps: AtomicUsize,
    fail: bool,
    /// The access of the descriptor the last map was made with.
    mapped_as: std::sync::Mutex<Option<Access>>,
}

impl Mapper for Counting {
    type Source = u32;
    type Mapping = u32;
    fn map(&self, source: &u32, d: &BufferDescriptor) -> Result<u32, String> {
        self.maps.fetch_add(1, Ordering::Relaxed);
        *self.mapped_as.lock().unwrap() = Some(d.access());
        if self.fail {
            Err("not a memfd".into())
        } else {
            Ok(*source * 10)
        }
    }
}

fn reg(fail: bool) -> ImportRegistry<Counting> {
    ImportRegistry::new(Counting {
        maps: AtomicUsize::new(0),
        fail,
        mapped_as: std::sync::Mutex::new(None),
    })
}

#[test]
fn map_once_share_and_release() {
    let r = reg(false);
    let buf = test_buffer(64);
    assert_eq!(
        r.acquire(S1, &buf),
        Err(ImportError::NotImported(*buf.identity()))
    );
    r.offer(S1, *buf.identity(), 4).unwrap();
    assert_eq!(
        r.offer(S1, *buf.identity(), 5),
        Err(ImportError::AlreadyImported(*buf.identity()))
    );
    let leases: Vec<_> = (0..10).map(|_| r.acquire(S1, &buf).unwrap()).collect();
    assert!(
        leases
            .iter()
            .all(|l| **l == 40 && Arc::ptr_eq(l, &leases[0]))
    );
    assert_eq!(r.mapper().maps.load(Ordering::Relaxed), 1);
    let other = BufferDescriptor::new(
        *buf.identity(),
        buf.nbytes() + 8,
        buf.address_space(),
        buf.access(),
        *buf.backing(),
    )
    .unwrap();
    let err = r.acquire(S1, &other).unwrap_err();
    assert!(
        matches!(err, ImportError::DescriptorMismatch { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("nbytes 64 vs 72"), "{err}");
    // The owner path id is a diagnostic: another one names the same buffer.
    let relabelled = buf.with_owner_worker_path_id(buf.owner_worker_path_id() + 7);
    assert_eq!(*r.acquire(S1, &relabelled).unwrap(), 40);
    assert_eq!(Arc::strong_count(&leases[0]), 11);
    assert!(r.release(S1, buf.identity()));
    assert!(!r.release(S1, buf.identity()));
    assert_eq!(
        Arc::strong_count(&leases[0]),
        10,
        "the registry let go; tasks keep theirs"
    );
    assert!(r.is_empty());
}

/// The seed's alias rule at the worker: a task's descriptor may grant
/// less than the import, never more; the mapping is made as the import
/// says whichever task comes first; a refused acquire spoils nothing.
#[test]
fn a_task_may_narrow_an_import_never_widen_it() {
    let rw = test_buffer(64);
    assert_eq!(rw.access(), Access::ReadWrite);
    let ro = rw.narrowed(Access::Read).unwrap();
    let wo = rw.narrowed(Access::Write).unwrap();

    // Imported READWRITE: a READ task first still maps it READWRITE,
    // and READ, WRITE and READWRITE tasks all share that mapping.
    let r = reg(false);
    r.offer_as(S1, rw, 3).unwrap();
    let first = r.acquire(S1, &ro).unwrap();
    assert_eq!(
        *r.mapper().mapped_as.lock().unwrap(),
        Some(Access::ReadWrite)
    );
    for d in [&rw, &wo, &ro] {
        assert!(Arc::ptr_eq(&r.acquire(S1, d).unwrap(), &first));
    }
    assert_eq!(r.mapper().maps.load(Ordering::Relaxed), 1);

    // Imported READ: a wider descriptor is refused, naming both grants,
    // before anything is mapped; the import still serves READ tasks.
    let r = reg(false);
    r.offer_as(S1, ro, 3).unwrap();
    for wider in [&rw, &wo] {
        let err = r.acquire(S1, wider).unwrap_err();
        assert_eq!(
            err,
            ImportError::AccessWidened {
                identity: *rw.identity(),
                imported: Access::Read,
                requested: wider.access(),
            }
        );
        assert!(
            err.to_string().contains(&format!(
                "grants {} but the buffer was imported with READ",
                wider.access()
            )),
            "{err}"
        );
    }
    assert_eq!(r.mapper().maps.load(Ordering::Relaxed), 0);
    assert_eq!(*r.acquire(S1, &ro).unwrap(), 30);
    assert_eq!(*r.mapper().mapped_as.lock().unwrap(), Some(Access::Read));
    assert!(matches!(
        r.acquire(S1, &rw),
        Err(ImportError::AccessWidened { .. })
    ));

    // Offered without a grant: the first acquirer's descriptor is the
    // import's, and the same rule applies after it.
    let r = reg(false);
    r.offer(S1, *rw.identity(), 3).unwrap();
    r.acquire(S1, &ro).unwrap();
    assert!(matches!(
        r.acquire(S1, &rw),
        Err(ImportError::AccessWidened { .. })
    ));
}

#[test]
fn a_failed_map_is_remembered_and_sessions_release_their_own() {
    let r = reg(true);
    let buf = test_buffer(64);
    r.offer(S1, *buf.identity(), 1).unwrap();
    for _ in 0..3 {
        let err = r.acquire(S1, &buf).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("buffer {}: not a memfd", buf.identity())
        );
    }
    assert_eq!(r.mapper().maps.load(Ordering::Relaxed), 1);
    let r = reg(false);
    let mut descriptors = Vec::new();
    for (i, s) in [(1u64, S1), (2, S1), (3, S2)] {
        let id = CanonicalIdentity::new([0; 8], i, 1).unwrap();
        let d = BufferDescriptor::new(
            id,
            8,
            AddressSpace::Host,
            Access::Read,
            Backing::Memfd {
                st_dev: 0,
                st_ino: 0,
            },
        )
        .unwrap();
        r.offer(s, *d.identity(), u32::try_from(i).unwrap())
            .unwrap();
        descriptors.push((s, d));
    }
    assert_eq!(r.session_len(S1), 2);
    assert_eq!(r.session_len(S2), 1);
    assert_eq!(r.release_session(S1), 2);
    assert_eq!(r.release_session(S1), 0, "nothing left to release");
    assert_eq!(r.len(), 1);
    for (s, d) in &descriptors[..2] {
        assert_eq!(
            r.acquire(*s, d),
            Err(ImportError::NotImported(*d.identity()))
        );
    }
    let (s, d) = &descriptors[2];
    assert_eq!(*r.acquire(*s, d).unwrap(), 30, "the other session's stays");
}

/// IMPORT-5: a session that names a buffer another session imported, by
/// a descriptor identical to the importer's, is refused as for a buffer
/// nobody imported, naming the buffer; nothing is mapped for it, and its
/// release of the identity leaves the importer's import alone.
#[test]
fn a_session_cannot_use_or_release_another_sessions_import() {
    let r = reg(false);
    let buf = test_buffer(64);
    r.offer_as(S1, buf, 4).unwrap();
    let err = r.acquire(S2, &buf).unwrap_err();
    assert_eq!(err, ImportError::NotImported(*buf.identity()));
    assert_eq!(
        err.to_string(),
        format!(
            "buffer {} was not imported by this session (its fd was never received on this session's fd channel, or it was released)",
            buf.identity()
        )
    );
    for narrower in [Access::Read, Access::Write] {
        assert_eq!(
            r.acquire(S2, &buf.narrowed(narrower).unwrap()),
            Err(ImportError::NotImported(*buf.identity()))
        );
    }
    assert_eq!(r.mapper().maps.load(Ordering::Relaxed), 0, "nothing mapped");
    assert!(!r.release(S2, buf.identity()));
    assert_eq!(r.release_session(S2), 0);
    assert_eq!(r.session_len(S1), 1);
    assert_eq!(
        *r.acquire(S1, &buf).unwrap(),
        40,
        "the importer's still works"
    );
    // Mapped now, by its importer: still refused to the other session.
    assert_eq!(
        r.acquire(S2, &buf),
        Err(ImportError::NotImported(*buf.identity()))
    );
    assert_eq!(r.mapper().maps.load(Ordering::Relaxed), 1);
}

/// Two sessions that each import the same identity get an entry each:
/// neither offer is refused as already imported, each maps its own source
/// once, and one session's release leaves the other's mapping (and its
/// leases) as they were.
#[test]
fn two_sessions_importing_one_identity_each_keep_their_own() {
    let r = reg(false);
    let buf = test_buffer(64);
    r.offer_as(S1, buf, 4).unwrap();
    r.offer_as(S2, buf, 5).unwrap();
    assert_eq!(
        r.offer_as(S2, buf, 6),
        Err(ImportError::AlreadyImported(*buf.identity())),
        "twice in one session is still refused"
    );
    let one = r.acquire(S1, &buf).unwrap();
    let two = r.acquire(S2, &buf).unwrap();
    assert_eq!((*one, *two), (40, 50));
    assert!(!Arc::ptr_eq(&one, &two));
    assert_eq!(r.mapper().maps.load(Ordering::Relaxed), 2);
    assert!(r.release(S1, buf.identity()));
    assert_eq!(
        r.acquire(S1, &buf),
        Err(ImportError::NotImported(*buf.identity()))
    );
    assert_eq!(Arc::strong_count(&one), 1, "the registry let go of S1's");
    let again = r.acquire(S2, &buf).unwrap();
    assert!(Arc::ptr_eq(&again, &two), "S2's mapping is the same one");
    assert_eq!(Arc::strong_count(&two), 3, "S2's entry and two leases");
    assert_eq!(r.mapper().maps.load(Ordering::Relaxed), 2, "no remap");
    assert_eq!(r.len(), 1);
    assert_eq!(r.release_session(S2), 1);
    assert!(r.is_empty());
}
