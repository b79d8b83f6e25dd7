//! The tokio-free core of a strata worker, so that its shared-memory
//! concurrency can be model-checked with loom (loom cannot build tokio's
//! net module).
//!
//! Today it holds the [`ImportRegistry`]: imported buffer backings by
//! session and identity, each mapped exactly once, however many tasks
//! resolve it at the same time, unmapped once released and no running task
//! uses it, and never found by a session that did not import it.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use strata_worker_core::{ImportRegistry, Mapper, SessionId};
//! use strata_wire::{BufferDescriptor, check::test_buffer};
//!
//! /// Pretends to map: the "mapping" is the source string, uppercased.
//! struct Upper(AtomicUsize);
//! impl Mapper for Upper {
//!     type Source = String;
//!     type Mapping = String;
//!     fn map(&self, source: &String, _: &BufferDescriptor) -> Result<String, String> {
//!         self.0.fetch_add(1, Ordering::Relaxed);
//!         Ok(source.to_uppercase())
//!     }
//! }
//!
//! let reg = ImportRegistry::new(Upper(AtomicUsize::new(0)));
//! let buf = test_buffer(64);
//! reg.offer(SessionId(1), *buf.identity(), "fd".to_owned()).unwrap();
//! let a = reg.acquire(SessionId(1), &buf).unwrap();
//! let b = reg.acquire(SessionId(1), &buf).unwrap();
//! assert_eq!(*a, "FD");
//! assert_eq!(reg.mapper().0.load(Ordering::Relaxed), 1, "mapped once");
//! assert!(reg.acquire(SessionId(2), &buf).is_err(), "another session's");
//! assert!(reg.release(SessionId(1), buf.identity()));
//! assert!(reg.acquire(SessionId(1), &buf).is_err(), "released");
//! assert_eq!(*b, "FD", "running tasks keep their mapping");
//! ```

#![forbid(unsafe_code)]

mod registry;
mod sync;

pub use registry::{ImportError, ImportRegistry, Mapper, SessionId};
