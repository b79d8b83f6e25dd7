//! Running one task: resolve every argument, launch the kernel, complete.
//!
//! Steps, each failing the task (never the worker) with a cause that says
//! which step and which argument:
//! 1. refuse a task that requires a feature this worker does not know or
//!    did not offer its session ([`FailureKind::Unsupported`]); find the
//!    callable;
//! 2. resolve each tensor's backing: a device buffer of the session by
//!    identity, inline bytes that came with the task (unpacked into a
//!    private host buffer, or, for a lone contiguous view the kernel only
//!    reads, read where they were received), an imported fd mapped
//!    once by identity (an identity whose fd was refused on arrival fails
//!    with that refusal; a kind of buffer the session does not take is
//!    [`FailureKind::Unsupported`]), or an imported POSIX shared-memory
//!    object, whose bytes the task's views span are read into a private
//!    buffer now (an object shrunk since its import fails the task);
//! 3. launch on the device (which validates the arguments against the
//!    signature and the chip's dtypes before anything runs), with the session's start gate: a
//!    task of a session that has ended fails instead of starting, whether
//!    it was still here or already queued on a lane;
//! 4. on completion, write the views a successful task wrote over POSIX
//!    shared-memory objects back into them (an object shrunk meanwhile
//!    fails the task instead), and pack the written inline arguments into
//!    the reply.
//!
//! Every lease (mapping, device buffer, inline buffer) is held by the
//! completion closure, so nothing a running kernel touches is unmapped or
//! freed under it.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use strata_chip_runtime::{
    ArgBacking, CacheUse, HostBuffer, HostBytes, HostMemory, Launch, LaunchArg, LaunchReport,
};
use strata_client::offload::off_runtime;
use strata_proto::TaskId;
use strata_proto::convert::{
    CacheArg, FailureCause, FailureKind, Features, TaskCompletion, TaskOutcome, TaskRequest,
};
use strata_wire::{AddressSpace, BufferDescriptor, CanonicalIdentity, Footprint, Tensor};
use strata_worker_core::ImportError;

use crate::imports::{CopiedImport, Import};
use crate::node::{Node, Session};

/// Called once with the task's completion.
pub(crate) type Done = Box<dyn FnOnce(TaskCompletion) + Send>;

/// An argument whose bytes came with the task and that the kernel
/// writes: packed into the completion.
struct InlineArg {
    index: u32,
    view: Tensor,
    host: Arc<HostBuffer>,
}

/// An argument over a POSIX_SHM import that the kernel writes: its bytes
/// go back to the object from the private copy once the task succeeds.
struct CopyBack {
    index: u32,
    /// The view over the private copy.
    view: Tensor,
    host: Arc<HostBuffer>,
    /// Where the private copy starts in the object.
    origin: u64,
    import: Arc<Import>,
}

/// A POSIX_SHM buffer's private copy for one task: the bytes its views
/// span, from `origin` (64-byte aligned).
struct Copy {
    origin: u64,
    host: Arc<HostBuffer>,
    desc: BufferDescriptor,
}

/// Runs `req` and calls `done` exactly once.
pub(crate) fn execute(node: &Arc<Node>, session: &Session, req: TaskRequest, done: Done) {
    run(node, session, req, done, false);
}

/// As [`execute`], from a thread that only feeds the device (the ring's
/// reader): the device may run the kernel on this thread when it would
/// start at once anyway ([`strata_chip_runtime::Device::launch_here`]), which saves
/// waking a lane thread.
pub(crate) fn execute_here(node: &Arc<Node>, session: &Session, req: TaskRequest, done: Done) {
    run(node, session, req, done, true);
}

fn run(node: &Arc<Node>, session: &Session, req: TaskRequest, done: Done, here: bool) {
    node.counters.in_flight.fetch_add(1, Ordering::Relaxed);
    let counting = counted(node, done);
    let id = req.id;
    // A task of an ended session does not start: checked here, before its
    // arguments are resolved (its imports are gone, which would give a
    // misleading cause), and again by the device when a lane would start
    // it, through the session's gate in the launch.
    if let Err(e) = session.gate.check() {
        return counting(TaskCompletion::failed(
            id,
            FailureCause::new(e.failure_kind(), e.to_string()),
        ));
    }
    match prepare(node, session, req) {
        Err(cause) => counting(TaskCompletion::failed(id, cause)),
        Ok((launch, held, inline, copies)) => {
            let finish: strata_chip_runtime::device::Completion = Box::new(move |outcome| {
                drop(held);
                // Only a task that succeeded writes its copies back.
                let completion = match outcome.map(|r| write_back(&copies).map(|()| r)) {
                    Ok(Err(cause)) => TaskCompletion::failed(id, cause),
                    Ok(Ok(report)) => complete(id, Ok(report), inline),
                    Err(e) => complete(id, Err(e), inline),
                };
                counting(completion);
            });
            // The device calls its completion only for launches it accepted;
            // a refused launch is completed here. The slot makes sure
            // exactly one of the two paths runs `finish`.
            let slot = Arc::new(Mutex::new(Some(finish)));
            let from_device = Arc::clone(&slot);
            let relay: strata_chip_runtime::device::Completion = Box::new(move |outcome| {
                if let Some(f) = take(&from_device) {
                    f(outcome);
                }
            });
            let launched = if here {
                node.device.launch_here(launch, relay)
            } else {
                node.device.launch(launch, relay)
            };
            if let Err(e) = launched {
                if let Some(f) = take(&slot) {
                    f(Err(e));
                }
            }
        }
    }
}

fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// Wraps `done` so that the worker's counters follow every completion.
fn counted(node: &Arc<Node>, done: Done) -> Done {
    let node = Arc::clone(node);
    Box::new(move |c: TaskCompletion| {
        let counter = match c.outcome {
            TaskOutcome::Success => Some(&node.counters.succeeded),
            TaskOutcome::Failure(_) => Some(&node.counters.failed),
            // It did not run: it comes again.
            TaskOutcome::Resend(_) => None,
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        node.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        done(c);
    })
}

/// Leases held for the duration of a task.
type Held = Vec<Box<dyn std::any::Any + Send + Sync>>;

/// Refuses a task that requires features `session` was not offered:
/// bits this build does not know first (the task was built for a newer
/// worker), then known ones its handshake did not state.
fn check_required(session: &Session, required: Features) -> Result<(), FailureCause> {
    let unknown = required.unknown();
    if !unknown.is_empty() {
        return Err(FailureCause::new(
            FailureKind::Unsupported,
            format!(
                "the task requires features this worker does not know: {unknown} (required_features {:#x})",
                required.bits()
            ),
        ));
    }
    let offered = session.capabilities.features;
    let missing = required.difference(offered);
    if !missing.is_empty() {
        return Err(FailureCause::new(
            FailureKind::Unsupported,
            format!(
                "the task requires {missing}, which this worker does not offer this session (it offers {offered})"
            ),
        ));
    }
    Ok(())
}

/// What a prepared task holds until it completes.
type Prepared = (Launch, Held, Vec<InlineArg>, Vec<CopyBack>);

fn prepare(node: &Node, session: &Session, req: TaskRequest) -> Result<Prepared, FailureCause> {
    check_required(session, req.required_features)?;
    let kernel = node.kernels.get(req.callable).map_err(|_| {
        let mut names: Vec<String> = node
            .kernels
            .descriptors()
            .map(|d| d.qualified_name())
            .collect();
        names.sort();
        FailureCause::new(
            FailureKind::Refused,
            format!(
                "unknown callable {}; this worker has {}",
                req.callable,
                names.join(", ")
            ),
        )
    })?;
    let writes: Vec<bool> = kernel
        .descriptor()
        .args
        .iter()
        .map(|a| a.access.allows_write())
        .collect();
    let mut held: Held = Vec::new();
    let mut inline_args = Vec::new();
    let mut copies: HashMap<CanonicalIdentity, Copy> = HashMap::new();
    let mut copy_backs = Vec::new();
    let by_import: Vec<bool> = req.inline.iter().map(Option::is_none).collect();
    let mut args = Vec::with_capacity(req.args.tensors().len());
    // Arguments the driver left out because the chip holds their bytes
    // travel as inline views without bytes: a private buffer of zeros,
    // which the chip's copy stands in for (or the launch fails, and the
    // driver sends the bytes).
    let mut inline = req.inline;
    let mut on_chip = vec![false; inline.len()];
    for c in req.cache.iter().filter(|c| c.held) {
        let i = c.index as usize;
        if let (Some(slot @ None), Some(h)) = (inline.get_mut(i), on_chip.get_mut(i)) {
            *slot = Some(Bytes::new());
            *h = true;
        }
    }
    let inline_bytes: usize = inline.iter().flatten().map(Bytes::len).sum();
    let mut staged = off_runtime(inline_bytes as u64, || {
        unpack_inline(req.args.tensors(), &inline, &writes, &on_chip)
    })
    .map_err(|why| FailureCause::new(FailureKind::ImportRefused, why))?;
    for (i, ((tensor, tag), inline)) in req
        .args
        .tensors()
        .iter()
        .zip(&req.tags)
        .zip(inline)
        .enumerate()
    {
        let bad = |why: String| {
            FailureCause::new(FailureKind::ImportRefused, format!("argument {i}: {why}"))
        };
        let mut cache = None;
        let (tensor, backing) = match (tensor.buffer().address_space(), inline) {
            (AddressSpace::Device, Some(_)) => {
                return Err(bad("a DEVICE buffer cannot travel inline".into()));
            }
            (AddressSpace::Device, None) => {
                unsupported_kind(session, i, tensor.buffer())?;
                let buf = session
                    .device_buffer(tensor.identity())
                    .map_err(|why| bad(why.describe(tensor.identity())))?;
                let block = buf.block;
                held.push(Box::new(buf));
                (*tensor, ArgBacking::Device(block))
            }
            (AddressSpace::Host, Some(_)) => {
                let (view, host) = staged[i]
                    .take()
                    .ok_or_else(|| bad("no inline bytes".into()))?;
                // Its copy on the chip is keyed by the view the driver
                // named, not by where its bytes were unpacked.
                cache = cache_use(&req.cache, session, i).map(|u| CacheUse {
                    footprint: Some(Footprint::of(tensor)),
                    ..u
                });
                let backing: Arc<dyn HostMemory> = match host {
                    Private::Copy(host) => {
                        if writes.get(i).copied().unwrap_or(false) {
                            inline_args.push(InlineArg {
                                index: i as u32,
                                view,
                                host: Arc::clone(&host),
                            });
                        }
                        host
                    }
                    Private::Received(bytes) => Arc::new(bytes),
                };
                (view, ArgBacking::Host(backing))
            }
            (AddressSpace::Host, None) => {
                // Only the session's own imports: another session's
                // descriptor, however exact, finds nothing here.
                let mapping = node
                    .imports()
                    .acquire(session.id, tensor.buffer())
                    .map_err(|e| {
                        // A refused fd was never offered, so the registry only
                        // knows it is missing; the session knows why.
                        let refused = match &e {
                            ImportError::NotImported(identity) => session.refusal(identity),
                            _ => None,
                        };
                        match refused {
                            Some(reason) => bad(format!(
                                "{} buffer {} was refused at import: {reason}",
                                tensor.buffer().backing().kind().name(),
                                tensor.identity()
                            )),
                            None => match unsupported_kind(session, i, tensor.buffer()) {
                                Err(unsupported) => unsupported,
                                Ok(()) => bad(e.to_string()),
                            },
                        }
                    })?;
                let access = tensor.buffer().access();
                match &*mapping {
                    Import::Mapped(m) => {
                        // A mapped buffer's copy may stay on the chip, as
                        // the task says, for this session alone.
                        cache = cache_use(&req.cache, session, i);
                        (
                            *tensor,
                            ArgBacking::Host(crate::imports::lease(Arc::clone(m), access)),
                        )
                    }
                    // Bytes copied for this task only: nothing of them
                    // stays on the chip.
                    Import::Copied(object) => {
                        let copy = match copies.entry(*tensor.identity()) {
                            Entry::Occupied(e) => e.into_mut(),
                            Entry::Vacant(e) => e.insert(
                                copy_in(object, tensor, req.args.tensors(), &by_import)
                                    .map_err(bad)?,
                            ),
                        };
                        let view = Tensor::new(
                            copy.desc,
                            tensor.byte_offset() - copy.origin,
                            tensor.shape(),
                            tensor.strides(),
                            tensor.dtype(),
                        )
                        .map_err(|e| bad(e.to_string()))?;
                        let host = Arc::clone(&copy.host);
                        if writes.get(i).copied().unwrap_or(false) && access.allows_write() {
                            copy_backs.push(CopyBack {
                                index: i as u32,
                                view,
                                host: Arc::clone(&host),
                                origin: copy.origin,
                                import: Arc::clone(&mapping),
                            });
                        }
                        let memory = crate::imports::read_only_unless(host, access.allows_write());
                        (view, ArgBacking::Host(memory))
                    }
                }
            }
        };
        args.push(LaunchArg {
            tensor,
            tag: *tag,
            backing,
            cache,
        });
    }
    Ok((
        Launch {
            kernel,
            args,
            scalars: req.args.scalars().to_vec(),
            gate: Some(session.gate.clone()),
            priority: req.priority,
        },
        held,
        inline_args,
        copy_backs,
    ))
}

/// Reads the bytes that the views of `tensor`'s buffer in this task span
/// (every argument over it that did not come inline) out of the POSIX
/// shared-memory object into a private buffer, from a 64-byte boundary so
/// that every dtype's alignment holds, with a descriptor of that size.
fn copy_in(
    object: &CopiedImport,
    tensor: &Tensor,
    tensors: &[Tensor],
    by_import: &[bool],
) -> Result<Copy, String> {
    let identity = tensor.identity();
    let group = tensors
        .iter()
        .zip(by_import)
        .filter(|(t, imported)| **imported && t.identity() == identity)
        .map(|(t, _)| t);
    let origin = group.clone().map(Tensor::byte_offset).min().unwrap_or(0) & !63;
    let end = group.map(Tensor::end_byte).max().unwrap_or(0);
    let len = usize::try_from(end - origin)
        .map_err(|_| format!("its views span {} bytes", end - origin))?;
    let d = tensor.buffer();
    let bytes = object.read(origin, len)?;
    let host = HostBuffer::from_bytes(&bytes).map_err(|e| e.to_string())?;
    let desc = BufferDescriptor::new(
        *identity,
        end - origin,
        d.address_space(),
        d.access(),
        *d.backing(),
    )
    .map_err(|e| e.to_string())?;
    Ok(Copy {
        origin,
        host: Arc::new(host),
        desc,
    })
}

/// Writes the views a successful task wrote back into their POSIX
/// shared-memory objects, run after run (the bytes between runs are not
/// the task's and are left alone).
fn write_back(copies: &[CopyBack]) -> Result<(), FailureCause> {
    for c in copies {
        let Import::Copied(object) = &*c.import else {
            continue;
        };
        let end = c.origin + c.view.end_byte();
        let first = c.view.byte_offset();
        let mut result = Ok(());
        strata_chip_runtime::staging::for_each_run(&c.view, |off, len| {
            if result.is_err() {
                return;
            }
            let from = first as usize + off;
            result = c
                .host
                .read(from, len)
                .map_err(|e| e.to_string())
                .and_then(|bytes| object.write(c.origin + from as u64, &bytes, end));
        });
        result.map_err(|why| {
            FailureCause::new(
                FailureKind::Device,
                format!(
                    "argument {}: the task ran, but its writes could not be stored: {why}",
                    c.index
                ),
            )
        })?;
    }
    Ok(())
}

/// Refuses argument `i` backed by `buffer` when its kind is not one the
/// session takes (a DEVICE buffer that is not DEVICE_MALLOC; a HOST one
/// without its bytes, of a kind this session does not import, such as
/// any kind over TCP).
fn unsupported_kind(
    session: &Session,
    i: usize,
    buffer: &BufferDescriptor,
) -> Result<(), FailureCause> {
    let kind = buffer.backing().kind();
    let takes = session.capabilities.backends;
    if takes.contains(kind) {
        return Ok(());
    }
    let host = if session.capabilities.features.contains(Features::HOST_BYTES) {
        "; a HOST buffer's bytes may travel with its task instead"
    } else {
        ""
    };
    Err(FailureCause::new(
        FailureKind::Unsupported,
        format!(
            "argument {i}: this worker does not take {} buffers in this session (it takes {takes}{host})",
            kind.name()
        ),
    ))
}

/// How argument `i` uses the device cache, as the task says, for this
/// session alone.
fn cache_use(cache: &[CacheArg], session: &Session, i: usize) -> Option<CacheUse> {
    cache
        .iter()
        .find(|c| c.index as usize == i)
        .map(|c| CacheUse {
            owner: session.id.0,
            version: c.version,
            written: c.written,
            deferred: c.deferred,
            held: c.held,
            footprint: None,
        })
}

/// Where an inline argument's bytes live on the worker.
#[derive(Clone)]
enum Private {
    /// A private buffer laid out like the original from a 64-byte
    /// boundary, the packed bytes unpacked into it; shared by the inline
    /// views of one buffer.
    Copy(Arc<HostBuffer>),
    /// The received bytes themselves, read-only: the view is the only
    /// inline view of its buffer, the kernel only reads it, and it is
    /// contiguous, so its packed bytes are its extent and need no copy.
    Received(HostBytes),
}

/// An inline argument's view, rebased onto where its bytes live.
type Rebased = (Tensor, Private);

/// The host memory of the arguments whose bytes came with the task. The
/// inline views over one buffer identity share one private buffer
/// covering all of them, each rebased by the same amount, so that their
/// relative positions (and the launch's overlap checks between them) are
/// those of the original buffer; a lone contiguous view the kernel only
/// reads is read where it was received. Returns, per argument, its rebased
/// view and memory (`None` for arguments without inline bytes).
fn unpack_inline(
    tensors: &[Tensor],
    inline: &[Option<Bytes>],
    writes: &[bool],
    held: &[bool],
) -> Result<Vec<Option<Rebased>>, String> {
    let mut out: Vec<Option<Rebased>> = vec![None; tensors.len()];
    let mut done = vec![false; tensors.len()];
    for i in 0..tensors.len() {
        if done[i] || inline.get(i).is_none_or(|d| d.is_none()) {
            continue;
        }
        if tensors[i].buffer().address_space() != AddressSpace::Host {
            continue;
        }
        let identity = *tensors[i].identity();
        let group: Vec<usize> = (i..tensors.len())
            .filter(|&j| {
                tensors[j].identity() == &identity && inline.get(j).is_some_and(|d| d.is_some())
            })
            .collect();
        if let [only] = group[..]
            && !held.get(only).copied().unwrap_or(false)
        {
            if let Some(received) =
                in_place(&tensors[only], inline[only].as_ref(), writes.get(only))
            {
                out[only] = Some(received.map_err(|e| format!("argument {only}: {e}"))?);
                done[only] = true;
                continue;
            }
        }
        // Rebase by a multiple of 64 bytes, which keeps every dtype's
        // offset alignment.
        let lo = group
            .iter()
            .map(|&j| tensors[j].byte_offset())
            .min()
            .unwrap_or(0)
            & !63;
        let hi = group
            .iter()
            .map(|&j| tensors[j].end_byte())
            .max()
            .unwrap_or(0);
        if hi - lo > strata_proto::MAX_INLINE_EXTENT {
            return Err(format!(
                "argument {i}: the inline views of buffer {identity} span {} bytes; at most {} (stage smaller views, or use a worker on the driver's host)",
                hi - lo,
                strata_proto::MAX_INLINE_EXTENT
            ));
        }
        let len = usize::try_from(hi - lo)
            .map_err(|_| format!("argument {i}: inline views span {} bytes", hi - lo))?;
        let d = tensors[i].buffer();
        let desc = BufferDescriptor::new(
            identity,
            hi - lo,
            d.address_space(),
            d.access(),
            *d.backing(),
        )
        .map_err(|e| format!("argument {i}: {e}"))?;
        // Zeroed pages from the kernel: a view that came without bytes (an
        // OUTPUT) starts from zeros, and the others are unpacked straight
        // into place.
        let host = Arc::new(HostBuffer::new(len).map_err(|e| e.to_string())?);
        for &j in &group {
            let t = &tensors[j];
            let view = Tensor::new(
                desc,
                t.byte_offset() - lo,
                t.shape(),
                t.strides(),
                t.dtype(),
            )
            .map_err(|e| format!("argument {j}: {e}"))?;
            let packed = inline[j].as_deref().unwrap_or_default();
            if !packed.is_empty() && host.unpack(&view, packed).is_err() {
                return Err(format!(
                    "argument {j}: inline bytes do not fit the view ({} bytes)",
                    packed.len()
                ));
            }
            out[j] = Some((view, Private::Copy(Arc::clone(&host))));
            done[j] = true;
        }
    }
    Ok(out)
}

/// The view rebased to byte 0 of its received bytes, when the kernel only
/// reads it and it is row-major contiguous, so that its packed bytes are
/// its extent, byte for byte; `None` when it needs a private copy. Equal
/// lengths are not enough: a view whose elements overlap *and* leave gaps
/// (shape [2, 2, 2], strides [5, 1, 1]) packs repeated bytes that can add
/// up to exactly its extent while lying elsewhere (the differential test
/// through real workers caught that).
fn in_place(
    t: &Tensor,
    packed: Option<&Bytes>,
    writes: Option<&bool>,
) -> Option<Result<Rebased, strata_wire::Error>> {
    let packed = packed.filter(|p| !p.is_empty())?;
    if writes.copied().unwrap_or(true)
        || !t.is_contiguous()
        || packed.len() as u64 != t.extent_bytes()
    {
        return None;
    }
    let d = t.buffer();
    let rebased = BufferDescriptor::new(
        *t.identity(),
        t.extent_bytes(),
        d.address_space(),
        d.access(),
        *d.backing(),
    )
    .and_then(|desc| Tensor::new(desc, 0, t.shape(), t.strides(), t.dtype()));
    Some(rebased.map(|view| (view, Private::Received(HostBytes::new(packed.clone())))))
}

fn complete(
    id: TaskId,
    outcome: Result<LaunchReport, strata_chip_runtime::Error>,
    inline: Vec<InlineArg>,
) -> TaskCompletion {
    match outcome {
        Err(e @ strata_chip_runtime::Error::NotHeld { .. }) => {
            TaskCompletion::bare(id, TaskOutcome::Resend(e.to_string()))
        }
        Err(e) => TaskCompletion::failed(id, FailureCause::new(e.failure_kind(), e.to_string())),
        Ok(r) => {
            let packed: Option<Vec<(u32, Bytes)>> = inline
                .into_iter()
                .map(|a| {
                    // A contiguous view that is its whole private buffer,
                    // which no other argument shares: the buffer leaves as
                    // the view's bytes, without packing it into a fresh
                    // string (a copy, and a fault on every new page).
                    let whole = a.view.byte_offset() == 0
                        && a.view.is_contiguous()
                        && a.view.extent_bytes() == a.host.len() as u64
                        && strata_chip_runtime::staging::packed_len(&a.view) == a.host.len() as u64;
                    let host = if whole {
                        match Arc::try_unwrap(a.host) {
                            Ok(buffer) => return Some((a.index, buffer.into_bytes())),
                            Err(shared) => shared,
                        }
                    } else {
                        a.host
                    };
                    host.pack(&a.view)
                        .ok()
                        .map(|bytes| (a.index, Bytes::from(bytes)))
                })
                .collect();
            // The inline copy was sized from the view when the task
            // arrived, so it always holds the view's extent; a short one
            // is a bug on this side, reported rather than sent truncated.
            let Some(outputs) = packed else {
                return TaskCompletion::failed(
                    id,
                    FailureCause::new(
                        FailureKind::Other,
                        "an output's inline copy is shorter than its view",
                    ),
                );
            };
            TaskCompletion {
                id,
                outcome: TaskOutcome::Success,
                lane: r.lane as u32,
                queued_ns: nanos(r.queued),
                busy_ns: nanos(r.busy),
                kernel_ns: nanos(r.kernel),
                staged_in: r.staged_in,
                staged_out: r.staged_out,
                copy_in_ns: nanos(r.copy_in),
                copy_out_ns: nanos(r.copy_out),
                cache: cache_counters(r.cache),
                outputs,
                held: Vec::new(),
            }
        }
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The chip's cache counters as the protocol carries them.
pub(crate) fn cache_counters(
    c: strata_chip_runtime::CacheStats,
) -> strata_proto::convert::CacheCounters {
    strata_proto::convert::CacheCounters {
        hits: c.hits,
        hit_bytes: c.hit_bytes,
        misses: c.misses,
        loaded: c.loaded,
        written_back: c.written_back,
        write_backs: c.write_backs,
        evictions: c.evictions,
        device_to_device: c.device_to_device,
        bypassed: c.bypassed,
        entries: c.entries,
        held: c.held,
        dirty: c.dirty,
        prefetched: c.prefetched,
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use strata_wire::{Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity, DType};

    use super::*;

    fn view(shape: &[u32], strides: &[u32]) -> Tensor {
        let id = CanonicalIdentity::new([1; 8], 1, 1).unwrap();
        let d = BufferDescriptor::new(
            id,
            64,
            AddressSpace::Host,
            Access::ReadWrite,
            Backing::RemoteSidecar,
        )
        .unwrap();
        Tensor::new(d, 0, shape, strides, DType::U8).unwrap()
    }

    /// Only a contiguous view the kernel only reads is read where its
    /// bytes arrived; one whose overlaps and gaps make its packed length
    /// equal its extent is copied into place.
    #[test]
    fn only_contiguous_read_only_views_are_read_in_place() {
        let contiguous = view(&[2, 4], &[4, 1]);
        let bytes = Bytes::from(vec![1u8; 8]);
        assert!(in_place(&contiguous, Some(&bytes), Some(&false)).is_some());
        assert!(in_place(&contiguous, Some(&bytes), Some(&true)).is_none());
        // Elements at 0,1,1,2 and 5,6,6,7: 8 packed bytes, an extent of 8.
        let tricky = view(&[2, 2, 2], &[5, 1, 1]);
        assert_eq!(tricky.extent_bytes(), 8);
        assert_eq!(strata_chip_runtime::staging::packed_len(&tricky), 8);
        assert!(in_place(&tricky, Some(&bytes), Some(&false)).is_none());
    }
}
