//! The import registry.
//!
//! Imports belong to the session that made them: each session has its own
//! table, and a session can find only what it offered itself. A session
//! that names another session's buffer (say, by reproducing its
//! descriptor byte for byte) is told the buffer was not imported by this
//! session, in the same words as for a buffer nobody imported, so the
//! refusal does not tell it whether the other session's buffer exists.
//!
//! Protocol for one identity of one session:
//! 1. `offer` records the backing's source (an fd) in the session's table,
//!    with the descriptor it is imported as (its *grant*) when the sender
//!    named one; a second offer of an identity live in the same session is
//!    refused. Another session may offer the same identity: it gets its
//!    own entry and its own mapping.
//! 2. Every `acquire` names the session and looks only in its table, then
//!    checks the task's descriptor against the import: the same buffer
//!    (size, space, backing; not the owner path id, a diagnostic) and an
//!    access within the import's (a task may narrow the grant, never widen it). An import
//!    offered without a descriptor takes the first acquirer's.
//! 3. The first acquire that passes maps it with the import's descriptor
//!    (checks happen in the [`Mapper`]), under the entry's own lock, so
//!    concurrent acquirers wait for that one map and share its result; later
//!    acquirers get the same mapping. Mapping with the import's grant rather
//!    than the first task's keeps the mapping independent of which task came
//!    first. A failed map is remembered: every later acquire gets the same
//!    error.
//! 4. `release` (or the end of the session) removes the entry from the
//!    session's table: no new acquire can find it, the source closes, and
//!    the mapping is dropped when the last running task's lease (an `Arc`)
//!    goes. Another session's entry for the same identity is untouched.
//!
//! Invariants: IMPORT-1, an identity is mapped at most once per offer;
//! IMPORT-2, a mapping is dropped exactly once, after release and after the
//! last lease; IMPORT-3, every acquirer of a mapped entry sees the same
//! mapping, made with the import's descriptor; IMPORT-4, an acquire whose
//! access is not within the import's is refused and changes nothing;
//! IMPORT-5, an acquire or release by one session never finds, maps or
//! drops another session's entry.
//!
//! Why a table per session rather than one mapping per identity shared by
//! every session that imported it: sharing would have to prove that a
//! second session's fd is the same backing as the first's before handing
//! it the first's mapping (POSIX shared-memory descriptors carry no inode
//! to compare), decide whose grant the one mapping is made with when the
//! sessions' grants differ, and count the sessions so that only the last
//! release unmaps. Separate entries need none of that, and a session's
//! lookups cannot reach another's by construction. The price is one more
//! `mmap` of the same pages when two sessions import one buffer, which no
//! driver does on the hot path (a driver has one session per worker);
//! both mappings are shared, so they see the same bytes.
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
pub use strata_boundary::SessionId;

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
    /// No live import for the identity in the asking session: never sent
    /// by it, released, or imported by another session only (the message
    /// does not say which, so that it tells a session nothing of another's
    /// buffers).
    #[error(
        "buffer {0} was not imported by this session (its fd was never received on this session's fd channel, or it was released)"
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
    state: Mutex<State<M>>,
}

/// One session's imports, by identity.
type Table<M> = HashMap<CanonicalIdentity, Arc<Entry<M>>>;

/// Imported backings by session, then by full identity.
pub struct ImportRegistry<M: Mapper> {
    mapper: M,
    sessions: Mutex<HashMap<SessionId, Table<M>>>,
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
            sessions: Mutex::new(HashMap::new()),
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
    /// [`ImportError::AlreadyImported`] when `session` has a live import of
    /// `identity` (the source is dropped, closing it).
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
    /// [`ImportError::AlreadyImported`] when `session` has a live import of
    /// the buffer (the source is dropped, closing it).
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
        let mut sessions = lock(&self.sessions);
        let table = sessions.entry(session).or_default();
        if table.contains_key(&identity) {
            return Err(ImportError::AlreadyImported(identity));
        }
        table.insert(
            identity,
            Arc::new(Entry {
                state: Mutex::new(State::Unmapped { source, grant }),
            }),
        );
        Ok(())
    }

    /// The mapping of the buffer `descriptor` describes, as `session`
    /// imported it, mapping it if this is the first use. Only `session`'s
    /// own imports are looked at (IMPORT-5). The returned `Arc` is the task's lease: the mapping
    /// stays valid while it is held, even after a release. The mapping is
    /// made as the import's descriptor says, which may grant more than
    /// `descriptor` does: writing through it is allowed only where
    /// `descriptor.access()` allows it.
    ///
    /// # Errors
    /// [`ImportError::NotImported`] (also when only another session
    /// imported it), [`ImportError::MapFailed`],
    /// [`ImportError::DescriptorMismatch`], [`ImportError::AccessWidened`]
    /// (the last two leave the import as it was).
    pub fn acquire(
        &self,
        session: SessionId,
        descriptor: &BufferDescriptor,
    ) -> Result<Arc<M::Mapping>, ImportError> {
        let identity = *descriptor.identity();
        let entry = lock(&self.sessions)
            .get(&session)
            .and_then(|table| table.get(&identity))
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

    /// Releases `session`'s import of `identity`: the session's new
    /// acquires fail at once; the mapping goes when the last running task
    /// drops its lease. Another session's import of the same identity
    /// stays. `false` if `session` had not imported it.
    pub fn release(&self, session: SessionId, identity: &CanonicalIdentity) -> bool {
        let removed = {
            let mut sessions = lock(&self.sessions);
            let Some(table) = sessions.get_mut(&session) else {
                return false;
            };
            let removed = table.remove(identity);
            if table.is_empty() {
                sessions.remove(&session);
            }
            removed
        };
        // The source closes here, outside the registry's lock.
        removed.is_some()
    }

    /// Releases every import of `session`; returns how many.
    pub fn release_session(&self, session: SessionId) -> usize {
        let table = lock(&self.sessions).remove(&session);
        // Sources close here, outside the registry's lock.
        table.map_or(0, |t| t.len())
    }

    /// Live imports, over every session.
    pub fn len(&self) -> usize {
        lock(&self.sessions).values().map(HashMap::len).sum()
    }

    /// Live imports of `session`.
    pub fn session_len(&self, session: SessionId) -> usize {
        lock(&self.sessions).get(&session).map_or(0, HashMap::len)
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

/// What differs between two descriptors of one identity, access (which
/// may differ by narrowing) and the diagnostic owner path id aside;
/// `None` when nothing does.
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
    // Not `owner_worker_path_id`: a diagnostic, which nothing routes,
    // gates or keys on (a producer may set it, or not, per record).
    (!out.is_empty()).then(|| out.join(", "))
}

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_models;
