//! The import registry.
//!
//! Protocol for one identity:
//! 1. `offer` records the backing's source (an fd) under the session that
//!    sent it, with the descriptor it is imported as (its *grant*) when the
//!    sender named one; a second offer of a live identity is refused.
//! 2. Every `acquire` checks the task's descriptor against the import: the
//!    same buffer (size, space, backing, owner path id) and an access
//!    within the import's (a task may narrow the grant, never widen it).
//!    An import offered without a descriptor takes the first acquirer's.
//! 3. The first acquire that passes maps it with the import's descriptor
//!    (checks happen in the [`Mapper`]), under the entry's own lock, so
//!    concurrent acquirers wait for that one map and share its result; later
//!    acquirers get the same mapping. Mapping with the import's grant rather
//!    than the first task's keeps the mapping independent of which task came
//!    first. A failed map is remembered: every later acquire gets the same
//!    error.
//! 4. `release` (or the end of the session) removes the entry: no new
//!    acquire can find it, the source closes, and the mapping is dropped
//!    when the last running task's lease (an `Arc`) goes.
//!
//! Invariants: IMPORT-1, an identity is mapped at most once per offer;
//! IMPORT-2, a mapping is dropped exactly once, after release and after the
//! last lease; IMPORT-3, every acquirer of a mapped entry sees the same
//! mapping, made with the import's descriptor; IMPORT-4, an acquire whose
//! access is not within the import's is refused and changes nothing.
//!
//! The registry hands out the mapping, which may be writable while the
//! task's descriptor grants READ only; the caller must not write through a
//! lease its descriptor does not allow (the worker wraps such a lease
//! read-only).

use std::collections::HashMap;
use std::fmt;

use strata_wire::{Access, BufferDescriptor, CanonicalIdentity};

use crate::sync::{Arc, Mutex, lock};

/// The session (orchestrator connection) that imported a backing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Turns a received source (an fd) into a usable mapping, after checking it
/// against the buffer's descriptor.
pub trait Mapper: Send + Sync {
    /// What arrives over the fd channel.
    type Source: Send;
    /// The mapped backing, shared by the tasks that use it.
    type Mapping: Send + Sync;

    /// Checks and maps `source` for `descriptor`.
    ///
    /// # Errors
    /// Why the source cannot back this buffer.
    fn map(
        &self,
        source: &Self::Source,
        descriptor: &BufferDescriptor,
    ) -> Result<Self::Mapping, String>;
}

/// Why an import could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// No live import for the identity (never sent, or released).
    #[error(
        "buffer {0} is not imported on this worker (its fd was never received, or it was released)"
    )]
    NotImported(CanonicalIdentity),
    /// The identity is already imported.
    #[error("buffer {0} is already imported")]
    AlreadyImported(CanonicalIdentity),
    /// The source failed the mapper's checks.
    #[error("buffer {identity}: {reason}")]
    MapFailed {
        /// The buffer.
        identity: CanonicalIdentity,
        /// The mapper's reason.
        reason: String,
    },
    /// A task described the buffer differently from its import.
    #[error("buffer {identity}: descriptor differs from the one it was imported with ({reason})")]
    DescriptorMismatch {
        /// The buffer.
        identity: CanonicalIdentity,
        /// What differs.
        reason: String,
    },
    /// A task's descriptor grants more than the buffer was imported with.
    #[error(
        "buffer {identity}: the task's descriptor grants {requested} but the buffer was imported with {imported}; a descriptor may narrow an import's access, never widen it"
    )]
    AccessWidened {
        /// The buffer.
        identity: CanonicalIdentity,
        /// What the import grants.
        imported: Access,
        /// What the task's descriptor asked for.
        requested: Access,
    },
}

enum State<M: Mapper> {
    Unmapped {
        source: M::Source,
        /// The descriptor the sender imported the buffer as, if it said.
        grant: Option<BufferDescriptor>,
    },
    Mapped {
        _source: M::Source,
        mapping: Arc<M::Mapping>,
        descriptor: BufferDescriptor,
    },
    Failed(String),
}

struct Entry<M: Mapper> {
    session: SessionId,
    state: Mutex<State<M>>,
}

/// Imported backings by full identity.
pub struct ImportRegistry<M: Mapper> {
    mapper: M,
    entries: Mutex<HashMap<CanonicalIdentity, Arc<Entry<M>>>>,
}

impl<M: Mapper> fmt::Debug for ImportRegistry<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportRegistry")
            .field("imports", &self.len())
            .finish()
    }
}

impl<M: Mapper> ImportRegistry<M> {
    /// An empty registry mapping with `mapper`.
    pub fn new(mapper: M) -> Self {
        ImportRegistry {
            mapper,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The mapper.
    pub fn mapper(&self) -> &M {
        &self.mapper
    }

    /// Records `source` as the backing of `identity`, owned by `session`,
    /// without saying what it grants: the first task that acquires it sets
    /// the import's descriptor. Prefer [`ImportRegistry::offer_as`].
    ///
    /// # Errors
    /// [`ImportError::AlreadyImported`] (the source is dropped, closing it).
    pub fn offer(
        &self,
        session: SessionId,
        identity: CanonicalIdentity,
        source: M::Source,
    ) -> Result<(), ImportError> {
        self.insert(session, identity, None, source)
    }

    /// Records `source` as the backing of the buffer `grant` describes,
    /// owned by `session`: tasks may use it through `grant` or any
    /// narrower descriptor of it, and it is mapped as `grant` says.
    ///
    /// # Errors
    /// [`ImportError::AlreadyImported`] (the source is dropped, closing it).
    pub fn offer_as(
        &self,
        session: SessionId,
        grant: BufferDescriptor,
        source: M::Source,
    ) -> Result<(), ImportError> {
        self.insert(session, *grant.identity(), Some(grant), source)
    }

    fn insert(
        &self,
        session: SessionId,
        identity: CanonicalIdentity,
        grant: Option<BufferDescriptor>,
        source: M::Source,
    ) -> Result<(), ImportError> {
        let mut entries = lock(&self.entries);
        if entries.contains_key(&identity) {
            return Err(ImportError::AlreadyImported(identity));
        }
        entries.insert(
            identity,
            Arc::new(Entry {
                session,
                state: Mutex::new(State::Unmapped { source, grant }),
            }),
        );
        Ok(())
    }

    /// The mapping of the buffer `descriptor` describes, mapping it if this
    /// is the first use. The returned `Arc` is the task's lease: the mapping
    /// stays valid while it is held, even after a release. The mapping is
    /// made as the import's descriptor says, which may grant more than
    /// `descriptor` does: writing through it is allowed only where
    /// `descriptor.access()` allows it.
    ///
    /// # Errors
    /// [`ImportError::NotImported`], [`ImportError::MapFailed`],
    /// [`ImportError::DescriptorMismatch`], [`ImportError::AccessWidened`]
    /// (the last two leave the import as it was).
    pub fn acquire(&self, descriptor: &BufferDescriptor) -> Result<Arc<M::Mapping>, ImportError> {
        let identity = *descriptor.identity();
        let entry = lock(&self.entries)
            .get(&identity)
            .cloned()
            .ok_or(ImportError::NotImported(identity))?;
        let mut state = lock(&entry.state);
        let imported = match &*state {
            State::Mapped {
                mapping,
                descriptor: imported,
                ..
            } => {
                check_within(imported, descriptor)?;
                return Ok(Arc::clone(mapping));
            }
            State::Failed(reason) => {
                return Err(ImportError::MapFailed {
                    identity,
                    reason: reason.clone(),
                });
            }
            State::Unmapped { grant, .. } => grant.unwrap_or(*descriptor),
        };
        // Checked before the source is taken: a task that asks for too much
        // is refused without spoiling the import for the others (IMPORT-4).
        check_within(&imported, descriptor)?;
        // First use: map under the entry lock, so concurrent acquirers of
        // this identity wait for this one map (IMPORT-1).
        let State::Unmapped { source, .. } =
            std::mem::replace(&mut *state, State::Failed(String::new()))
        else {
            return Err(ImportError::NotImported(identity));
        };
        match self.mapper.map(&source, &imported) {
            Ok(mapping) => {
                let mapping = Arc::new(mapping);
                *state = State::Mapped {
                    _source: source,
                    mapping: Arc::clone(&mapping),
                    descriptor: imported,
                };
                Ok(mapping)
            }
            Err(reason) => {
                // The source is dropped here (its fd closed): a backing that
                // failed its checks is never retried.
                *state = State::Failed(reason.clone());
                Err(ImportError::MapFailed { identity, reason })
            }
        }
    }

    /// Releases `identity`: new acquires fail at once; the mapping goes when
    /// the last running task drops its lease. `false` if it was not imported.
    pub fn release(&self, identity: &CanonicalIdentity) -> bool {
        lock(&self.entries).remove(identity).is_some()
    }

    /// Releases every import of `session`; returns how many.
    pub fn release_session(&self, session: SessionId) -> usize {
        let mut entries = lock(&self.entries);
        let before = entries.len();
        entries.retain(|_, e| e.session != session);
        before - entries.len()
    }

    /// Live imports.
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    /// Whether there are no live imports.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether a task may use the import `imported` through `task`: the same
/// buffer, and an access within the import's.
fn check_within(imported: &BufferDescriptor, task: &BufferDescriptor) -> Result<(), ImportError> {
    let identity = *imported.identity();
    if let Some(reason) = differences(imported, task) {
        return Err(ImportError::DescriptorMismatch { identity, reason });
    }
    if !task.access().is_within(imported.access()) {
        return Err(ImportError::AccessWidened {
            identity,
            imported: imported.access(),
            requested: task.access(),
        });
    }
    Ok(())
}

/// What differs between two descriptors of one identity, access aside
/// (which may differ by narrowing); `None` when nothing does.
fn differences(a: &BufferDescriptor, b: &BufferDescriptor) -> Option<String> {
    let mut out = Vec::new();
    if a.nbytes() != b.nbytes() {
        out.push(format!("nbytes {} vs {}", a.nbytes(), b.nbytes()));
    }
    if a.address_space() != b.address_space() {
        out.push(format!(
            "address space {} vs {}",
            a.address_space().name(),
            b.address_space().name()
        ));
    }
    if a.backing() != b.backing() {
        out.push(format!("backing {:?} vs {:?}", a.backing(), b.backing()));
    }
    if a.owner_worker_path_id() != b.owner_worker_path_id() {
        out.push(format!(
            "owner worker path id {} vs {}",
            a.owner_worker_path_id(),
            b.owner_worker_path_id()
        ));
    }
    (!out.is_empty()).then(|| out.join(", "))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use strata_wire::check::test_buffer;
    use strata_wire::{Access, AddressSpace, Backing};

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
            r.acquire(&buf),
            Err(ImportError::NotImported(*buf.identity()))
        );
        r.offer(SessionId(1), *buf.identity(), 4).unwrap();
        assert_eq!(
            r.offer(SessionId(1), *buf.identity(), 5),
            Err(ImportError::AlreadyImported(*buf.identity()))
        );
        let leases: Vec<_> = (0..10).map(|_| r.acquire(&buf).unwrap()).collect();
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
        let err = r.acquire(&other).unwrap_err();
        assert!(
            matches!(err, ImportError::DescriptorMismatch { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("nbytes 64 vs 72"), "{err}");
        assert_eq!(Arc::strong_count(&leases[0]), 11);
        assert!(r.release(buf.identity()));
        assert!(!r.release(buf.identity()));
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
        r.offer_as(SessionId(1), rw, 3).unwrap();
        let first = r.acquire(&ro).unwrap();
        assert_eq!(
            *r.mapper().mapped_as.lock().unwrap(),
            Some(Access::ReadWrite)
        );
        for d in [&rw, &wo, &ro] {
            assert!(Arc::ptr_eq(&r.acquire(d).unwrap(), &first));
        }
        assert_eq!(r.mapper().maps.load(Ordering::Relaxed), 1);

        // Imported READ: a wider descriptor is refused, naming both grants,
        // before anything is mapped; the import still serves READ tasks.
        let r = reg(false);
        r.offer_as(SessionId(1), ro, 3).unwrap();
        for wider in [&rw, &wo] {
            let err = r.acquire(wider).unwrap_err();
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
        assert_eq!(*r.acquire(&ro).unwrap(), 30);
        assert_eq!(*r.mapper().mapped_as.lock().unwrap(), Some(Access::Read));
        assert!(matches!(
            r.acquire(&rw),
            Err(ImportError::AccessWidened { .. })
        ));

        // Offered without a grant: the first acquirer's descriptor is the
        // import's, and the same rule applies after it.
        let r = reg(false);
        r.offer(SessionId(1), *rw.identity(), 3).unwrap();
        r.acquire(&ro).unwrap();
        assert!(matches!(
            r.acquire(&rw),
            Err(ImportError::AccessWidened { .. })
        ));
    }

    #[test]
    fn a_failed_map_is_remembered_and_sessions_release_their_own() {
        let r = reg(true);
        let buf = test_buffer(64);
        r.offer(SessionId(1), *buf.identity(), 1).unwrap();
        for _ in 0..3 {
            let err = r.acquire(&buf).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("buffer {}: not a memfd", buf.identity())
            );
        }
        assert_eq!(r.mapper().maps.load(Ordering::Relaxed), 1);
        let r = reg(false);
        for (i, s) in [(1u64, 1u64), (2, 1), (3, 2)] {
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
            r.offer(SessionId(s), *d.identity(), 0).unwrap();
        }
        assert_eq!(r.release_session(SessionId(1)), 2);
        assert_eq!(r.len(), 1);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::sync::Arc;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::thread;
    use strata_wire::check::test_buffer;

    /// A mapping that counts its drops.
    struct Tracked(Arc<AtomicUsize>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    struct Fake {
        maps: Arc<AtomicUsize>,
        drops: Arc<AtomicUsize>,
    }
    impl Mapper for Fake {
        type Source = ();
        type Mapping = Tracked;
        fn map(&self, _: &(), _: &BufferDescriptor) -> Result<Tracked, String> {
            self.maps.fetch_add(1, Ordering::SeqCst);
            Ok(Tracked(Arc::clone(&self.drops)))
        }
    }

    fn setup() -> (
        Arc<ImportRegistry<Fake>>,
        Arc<AtomicUsize>,
        Arc<AtomicUsize>,
        BufferDescriptor,
    ) {
        let maps = Arc::new(AtomicUsize::new(0));
        let drops = Arc::new(AtomicUsize::new(0));
        let reg = Arc::new(ImportRegistry::new(Fake {
            maps: Arc::clone(&maps),
            drops: Arc::clone(&drops),
        }));
        let buf = test_buffer(64);
        reg.offer(SessionId(1), *buf.identity(), ()).unwrap();
        (reg, maps, drops, buf)
    }

    /// Two tasks resolve the same identity at once: it is mapped exactly
    /// once and both get that mapping (IMPORT-1, IMPORT-3).
    #[test]
    fn concurrent_acquires_map_once() {
        loom::model(|| {
            let (reg, maps, drops, buf) = setup();
            let r = Arc::clone(&reg);
            let t = thread::spawn(move || r.acquire(&buf).map(|m| Arc::as_ptr(&m) as usize));
            let mine = reg.acquire(&buf).map(|m| Arc::as_ptr(&m) as usize);
            let theirs = t.join().unwrap();
            assert_eq!(mine.unwrap(), theirs.unwrap());
            assert_eq!(maps.load(Ordering::SeqCst), 1);
            assert!(reg.release(buf.identity()));
            assert_eq!(
                drops.load(Ordering::SeqCst),
                1,
                "dropped once, after release and the last lease"
            );
        });
    }

    /// A release racing a task's acquire: the task either gets the mapping
    /// and keeps it valid until it lets go, or is told the buffer is not
    /// imported; the mapping is dropped exactly once, never under a lease
    /// (IMPORT-2).
    #[test]
    fn release_waits_for_the_last_lease() {
        loom::model(|| {
            let (reg, _maps, drops, buf) = setup();
            let r = Arc::clone(&reg);
            let d = Arc::clone(&drops);
            let t = thread::spawn(move || {
                if let Ok(lease) = r.acquire(&buf) {
                    assert_eq!(d.load(Ordering::SeqCst), 0, "mapping dropped under a lease");
                    drop(lease);
                }
            });
            assert!(reg.release(buf.identity()));
            t.join().unwrap();
            let dropped = drops.load(Ordering::SeqCst);
            let mapped = reg.mapper().maps.load(Ordering::SeqCst);
            assert_eq!(dropped, mapped, "every mapping made is dropped once");
            assert!(dropped <= 1);
        });
    }
}
