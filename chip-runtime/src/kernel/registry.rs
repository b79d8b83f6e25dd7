//! The callables a device can run, by handle and by name.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Kernel, KernelHandle, Signature, builtin};
use crate::Error;

/// Kernels by handle; also findable by `name@version`.
#[derive(Clone, Default)]
pub struct Registry {
    by_handle: HashMap<KernelHandle, Arc<dyn Kernel>>,
    by_name: HashMap<(String, u32), KernelHandle>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<String> = self.descriptors().map(Signature::qualified_name).collect();
        names.sort();
        f.debug_tuple("Registry").field(&names).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// A registry holding every built-in kernel.
    pub fn with_builtins() -> Self {
        let mut r = Registry::new();
        for k in builtin::all() {
            // Built-in names are distinct (tested), so this cannot conflict.
            let _ = r.register(k);
        }
        r
    }

    /// Adds a kernel and returns its handle. Registering the same
    /// descriptor again is a no-op.
    ///
    /// # Errors
    /// [`Error::ConflictingKernel`] when another kernel with the same name
    /// and version but a different signature is registered.
    pub fn register(&mut self, kernel: Arc<dyn Kernel>) -> Result<KernelHandle, Error> {
        let desc = kernel.descriptor();
        let handle = desc.handle();
        let key = (desc.name.clone(), desc.version);
        match self.by_name.get(&key) {
            Some(existing) if *existing != handle => {
                return Err(Error::ConflictingKernel(desc.qualified_name()));
            }
            Some(_) => return Ok(handle),
            None => {}
        }
        self.by_name.insert(key, handle);
        self.by_handle.insert(handle, kernel);
        Ok(handle)
    }

    /// The kernel with `handle`.
    ///
    /// # Errors
    /// [`Error::UnknownKernel`].
    pub fn get(&self, handle: KernelHandle) -> Result<Arc<dyn Kernel>, Error> {
        self.by_handle
            .get(&handle)
            .cloned()
            .ok_or(Error::UnknownKernel(handle))
    }

    /// The handle of `name@version`, if registered.
    pub fn find(&self, name: &str, version: u32) -> Option<KernelHandle> {
        self.by_name.get(&(name.to_owned(), version)).copied()
    }

    /// Every registered descriptor.
    pub fn descriptors(&self) -> impl Iterator<Item = &Signature> {
        self.by_handle.values().map(|k| k.descriptor())
    }

    /// Number of kernels.
    pub fn len(&self) -> usize {
        self.by_handle.len()
    }

    /// Whether no kernel is registered.
    pub fn is_empty(&self) -> bool {
        self.by_handle.is_empty()
    }
}
