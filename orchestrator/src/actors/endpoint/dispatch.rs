//! Members to the worker and completions back: buffers imported by fd on
//! first use (shared memory), view bytes staged with each task and landed
//! from each completion (staged links), batches kept under the message
//! limit.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use bytes::Bytes;

use strata_proto::convert::{TaskCompletion, TaskOutcome, TaskRequest};
use strata_wire::{ArgTag, BufferDescriptor, CanonicalIdentity, Footprint, TaskArgs, Tensor};
use tracing::warn;

use strata_orchestrator_core::{Event, FailureCause, FailureKind};

use super::EndpointActor;
use crate::actors::{DispatchItem, MemberFailure, Notice, Report};
use crate::buffer::{Backing, HostShared};
use crate::link::{FileRange, HostFile, LinkError, Memory, StageBody};

/// Views a task's message leaves out, to be staged on the data connection
/// before it: argument index and bytes.
type Ahead = Vec<(u32, StageBody)>;

/// A member on the worker.
pub(super) struct InFlight {
    pub(super) task: strata_orchestrator_core::TaskId,
    pub(super) member: usize,
    /// Host views whose bytes travel (staged links): argument index,
    /// view, buffer, how the task uses it.
    staged: Vec<(u32, Tensor, Arc<HostShared>, ArgTag)>,
    sent: u64,
    /// Bytes left out because the chip held them, and how many times the
    /// member was sent again for want of them.
    held_bytes: u64,
    resent: u32,
    /// Byte sets whose bytes were left out as held on the chip, and the
    /// member itself, to send again with them if the chip no longer has
    /// them (`TaskOutcome::Resend`).
    held: Vec<Footprint>,
    resend: Option<DispatchItem>,
    /// The versions the chip holds of the byte sets it writes once it
    /// succeeds.
    holds: Vec<(Footprint, u64)>,
    /// The byte sets it reads whose bytes go with it, at their versions:
    /// the chip holds them once it has run, so members sent after it
    /// leave them out (the worker starts a session's tasks in order; one
    /// that starts before the copy is made comes back to be resent).
    sends: Vec<(Footprint, u64)>,
    pub(super) callable: strata_chip_runtime::KernelHandle,
    /// Its timeout, and its deadline once sent.
    pub(super) timeout: Option<std::time::Duration>,
    pub(super) deadline: Option<tokio::time::Instant>,
}

impl EndpointActor {
    fn finish(&self, item: &DispatchItem, result: Result<(), MemberFailure>) {
        let _ = self.up.send(Notice::Completed {
            event: Event::Finished {
                task: item.task,
                member: item.member,
                result: result.map_err(MemberFailure::into_cause),
            },
            report: Report::default(),
        });
    }

    fn staged(&self) -> bool {
        self.link.facts().memory == Memory::Staged
    }

    pub(super) async fn dispatch(&mut self, items: Vec<DispatchItem>) {
        let refused = match self.import_new(&items).await {
            Ok(r) => r,
            Err(e) => return self.lost(format!("fd channel: {e}")),
        };
        // Batches stay under the message limit; one task over it fails
        // alone (its bytes could never travel) instead of breaking the
        // connection for everyone.
        let room = self.link.facts().max_message.saturating_sub(64 * 1024);
        let mut batches: Vec<Vec<TaskRequest>> = vec![Vec::new()];
        let mut size = 0usize;
        // Members with a timeout, whose clocks start once they are sent.
        let mut timed = Vec::new();
        for item in &items {
            if let Some(cause) = &item.fail {
                self.finish(item, Err(MemberFailure::Reported(cause.clone())));
                continue;
            }
            let (mut req, mut f, ahead) = match self.request(item, &refused) {
                Ok(r) => r,
                Err(cause) => {
                    self.finish(item, Err(cause));
                    continue;
                }
            };
            // Views for the data connection go first, whatever their
            // message's size; then views too large for the message go
            // ahead of it, largest first, until the rest fits (written
            // views too large for the completion come back the same way:
            // the worker holds them and `complete` fetches them).
            let staged = match self.stage_each(&mut req, ahead).await {
                Ok(()) if wire_size(&req) > room && self.staged() => {
                    self.stage_ahead(&mut req, room).await
                }
                r => r,
            };
            match staged {
                Ok(()) => {}
                // The worker refused the bytes: this member fails alone.
                Err((arg, bytes, LinkError::Refused(why))) => {
                    self.finish(
                        item,
                        Err(MemberFailure::StagedAhead {
                            arg,
                            bytes,
                            why: why.to_string(),
                        }),
                    );
                    continue;
                }
                // The connection failed: the worker is lost, and with it
                // every member placed on it (the scheduler knows them).
                Err((arg, bytes, e)) => {
                    return self.lost(format!(
                        "staging the {bytes} bytes of argument {arg} of {}: {e}",
                        item.task
                    ));
                }
            }
            let bytes = wire_size(&req);
            if bytes > room {
                self.finish(
                    item,
                    Err(MemberFailure::TooLarge {
                        bytes,
                        room,
                        worker: self.name.clone(),
                    }),
                );
                continue;
            }
            if size + bytes > room {
                batches.push(Vec::new());
                size = 0;
            }
            size += bytes;
            if let Some(t) = item.timeout {
                timed.push((item.task, t));
            }
            self.hold(std::mem::take(&mut f.sends));
            self.in_flight.insert(item.task.0, f);
            batches.last_mut().expect("a batch").push(req);
        }
        for batch in batches.into_iter().filter(|b| !b.is_empty()) {
            if let Err(e) = self.link.send(batch).await {
                return self.lost(format!("sending tasks: {e}"));
            }
        }
        if !timed.is_empty() {
            self.start_clocks(&timed);
        }
    }

    /// Stages the largest inline inputs of `req` ahead of it, one `Stage`
    /// call each, until the rest fits `room`; each becomes a reference
    /// ([`TaskRequest::staged`]).
    ///
    /// # Errors
    /// The argument, its size and the link's error for the first view that
    /// could not be staged.
    async fn stage_ahead(
        &mut self,
        req: &mut TaskRequest,
        room: usize,
    ) -> Result<(), (u32, usize, LinkError)> {
        while wire_size(req) > room {
            let Some(arg) = req
                .inline
                .iter()
                .enumerate()
                .filter_map(|(i, d)| d.as_ref().filter(|d| !d.is_empty()).map(|d| (i, d.len())))
                .max_by_key(|&(_, len)| len)
                .map(|(i, _)| i)
            else {
                break;
            };
            let Some(data) = req.inline[arg].take() else {
                break;
            };
            self.stages += 1;
            let id = self.stages;
            let bytes = data.len();
            self.link
                .stage(id, StageBody::Packed(data))
                .await
                .map_err(|e| (arg as u32, bytes, e))?;
            req.staged.push((arg as u32, id));
        }
        Ok(())
    }

    /// Stages each of `ahead` (views for the data connection) before
    /// `req`, which then names them ([`TaskRequest::staged`]).
    ///
    /// # Errors
    /// As [`Self::stage_ahead`].
    async fn stage_each(
        &mut self,
        req: &mut TaskRequest,
        ahead: Ahead,
    ) -> Result<(), (u32, usize, LinkError)> {
        for (arg, body) in ahead {
            self.stages += 1;
            let id = self.stages;
            let bytes = usize::try_from(body.len()).unwrap_or(usize::MAX);
            self.link
                .stage(id, body)
                .await
                .map_err(|e| (arg, bytes, e))?;
            req.staged.push((arg, id));
        }
        Ok(())
    }

    /// Fetches the written views the worker held for `f` (their bytes were
    /// too large for the completion's message).
    async fn fetch_held(
        &self,
        f: &InFlight,
        held: &[(u32, u64)],
    ) -> Result<(Vec<(u32, Bytes)>, Vec<(u32, u64)>), Fetched> {
        let mut out = Vec::with_capacity(held.len());
        let mut landed = Vec::new();
        for &(arg, id) in held {
            let Some((_, view, host, tag)) = f
                .staged
                .iter()
                .find(|(i, .., tag)| *i == arg && tag.writes())
            else {
                return Err(Fetched::Failed(MemberFailure::Fetch {
                    arg,
                    why: "the worker held bytes for an argument the task does not write back"
                        .into(),
                }));
            };
            let expect = strata_chip_runtime::staging::packed_len(view);
            // A contiguous view the task only writes, on a data
            // connection, lands straight in the memfd as it arrives: a
            // fetch cut short leaves part of it written, which is what a
            // failed task's output may be (consumers are skipped; a retry
            // writes it whole). A view it also reads is fetched whole
            // first, so that a failure leaves its old bytes as they were.
            let straight =
                self.link.facts().data_from.is_some() && view.is_contiguous() && !tag.reads();
            let land = straight.then(|| FileRange {
                host: Arc::clone(host) as Arc<dyn HostFile>,
                offset: view.byte_offset(),
                len: expect,
            });
            let bytes = self
                .link
                .fetch(id, expect, land)
                .await
                .map_err(|e| match e {
                    LinkError::Refused(why) => Fetched::Failed(MemberFailure::Fetch {
                        arg,
                        why: why.to_string(),
                    }),
                    e => Fetched::Lost(format!(
                        "fetching the bytes {} wrote to argument {arg}: {e}",
                        f.task
                    )),
                })?;
            match bytes {
                Some(bytes) => out.push((arg, bytes)),
                None => landed.push((arg, expect)),
            }
        }
        Ok((out, landed))
    }

    /// Passes the memfd of every host buffer these members use that the
    /// worker has not imported yet (shared-memory links). Returns the
    /// buffers it refused, with why; an error when the link itself failed.
    async fn import_new(
        &mut self,
        items: &[DispatchItem],
    ) -> Result<HashMap<CanonicalIdentity, String>, LinkError> {
        let mut refused = HashMap::default();
        if self.staged() {
            return Ok(refused);
        }
        let mut new: Vec<Arc<HostShared>> = Vec::new();
        let mut seen = HashSet::default();
        for item in items {
            for a in item.args.iter() {
                if let Backing::Host(h) = &a.backing {
                    let id = *h.descriptor().identity();
                    if !self.imported.contains(&id) && seen.insert(id) {
                        new.push(Arc::clone(h));
                    }
                }
            }
        }
        for chunk in new.chunks(strata_proto::MAX_FDS_PER_MESSAGE) {
            // Imported as the buffer's own descriptor, so that tasks may use
            // it through narrowed views whichever task comes first.
            let buffers: Vec<(BufferDescriptor, BorrowedFd<'_>)> =
                chunk.iter().map(|h| (*h.descriptor(), h.fd())).collect();
            let results = self.link.import(&buffers).await?;
            let mut bytes = 0u64;
            for (h, r) in chunk.iter().zip(results) {
                let id = *h.descriptor().identity();
                match r {
                    Ok(()) => {
                        self.imported.insert(id);
                        h.imported_by(self.id);
                        bytes += h.descriptor().nbytes();
                    }
                    Err(why) => {
                        warn!(worker = %self.id, buffer = %id, %why, "buffer refused");
                        refused.insert(id, why);
                    }
                }
            }
            let _ = self.up.send(Notice::Imported { bytes });
        }
        Ok(refused)
    }

    fn request(
        &self,
        item: &DispatchItem,
        refused: &HashMap<CanonicalIdentity, String>,
    ) -> Result<(TaskRequest, InFlight, Ahead), MemberFailure> {
        let staged_link = self.staged();
        let data_from = self.link.facts().data_from;
        let mut ahead = Vec::new();
        let mut tensors = Vec::with_capacity(item.args.len());
        let mut tags = Vec::with_capacity(item.args.len());
        let mut inline = Vec::with_capacity(item.args.len());
        let mut staged = Vec::new();
        let mut sent = 0u64;
        let mut cache = item.cache.clone();
        let (mut held, mut holds, mut sends) = (Vec::new(), Vec::new(), Vec::new());
        let mut held_bytes = 0;
        for (i, a) in item.args.iter().enumerate() {
            tensors.push(a.tensor);
            tags.push(a.tag);
            match &a.backing {
                Backing::Host(h) if staged_link => {
                    let len = strata_chip_runtime::staging::packed_len(&a.tensor);
                    staged.push((i as u32, a.tensor, Arc::clone(h), a.tag));
                    // A view whose bytes the chip holds at the version the
                    // task must see travels without them.
                    if let Some(c) = cache.iter_mut().find(|c| c.index as usize == i) {
                        let fp = Footprint::of(&a.tensor);
                        if fp.is_exact() {
                            if a.tag != ArgTag::Output && self.resident.get(&fp) == Some(&c.version)
                            {
                                c.held = true;
                                held.push(fp);
                                held_bytes += len;
                            }
                            if a.tag.writes() {
                                holds.push((fp, c.written));
                            } else if !c.held {
                                sends.push((fp, c.version));
                            }
                        }
                        if c.held {
                            inline.push(None);
                            continue;
                        }
                    }
                    if a.tag != ArgTag::Output && data_from.is_some_and(|from| len >= from) {
                        // On the data connection, ahead of the task: a
                        // contiguous view straight from the memfd, a
                        // strided one packed once.
                        let body = if a.tensor.is_contiguous() {
                            StageBody::File {
                                host: Arc::clone(h) as Arc<dyn HostFile>,
                                offset: a.tensor.byte_offset(),
                                len,
                            }
                        } else {
                            StageBody::Packed(
                                h.pack(&a.tensor, &self.recycler)
                                    .map_err(|source| MemberFailure::Staging { arg: i, source })?,
                            )
                        };
                        sent += len;
                        ahead.push((i as u32, body));
                        inline.push(None);
                        continue;
                    }
                    let data = if a.tag == ArgTag::Output {
                        Bytes::new()
                    } else {
                        // Becomes the message's field as is (no copy).
                        h.pack(&a.tensor, &self.recycler)
                            .map_err(|source| MemberFailure::Staging { arg: i, source })?
                    };
                    sent += data.len() as u64;
                    inline.push(Some(data));
                }
                Backing::Host(h) => {
                    if let Some(why) = refused.get(h.descriptor().identity()) {
                        return Err(MemberFailure::BufferRefused {
                            arg: i,
                            buffer: *h.descriptor().identity(),
                            why: why.clone(),
                        });
                    }
                    inline.push(None);
                }
                Backing::Device(_) => inline.push(None),
            }
        }
        let args = TaskArgs::new(tensors, item.scalars.to_vec())?;
        Ok((
            TaskRequest {
                id: item.task,
                callable: item.callable,
                args,
                tags,
                inline,
                staged: Vec::new(),
                cache,
                required_features: item.required_features,
                priority: item.priority,
            },
            InFlight {
                task: item.task,
                member: item.member,
                staged,
                sent,
                held_bytes,
                resent: 0,
                resend: (!held.is_empty()).then(|| item.clone()),
                held,
                holds,
                sends,
                callable: item.callable,
                timeout: item.timeout,
                deadline: None,
            },
            ahead,
        ))
    }

    pub(super) async fn complete(&mut self, batch: Vec<TaskCompletion>) {
        if self.dead {
            return;
        }
        // When the batch was had: one clock read for the batch, again
        // after a fetch (which waits on the worker).
        let mut received = None;
        for c in batch {
            let Some(f) = self.in_flight.remove(&c.id.0) else {
                warn!(worker = %self.id, task = c.id.0, "completion for an unknown task");
                continue;
            };
            let mut report = Report {
                sent: f.sent,
                returned: 0,
                staged: c.staged_in + c.staged_out,
                lane: c.lane,
                queued_ns: c.queued_ns,
                busy_ns: c.busy_ns,
                copy_in_ns: c.copy_in_ns,
                copy_out_ns: c.copy_out_ns,
                to_device: c.staged_in,
                from_device: c.staged_out,
                cache: c.cache,
                held: f.held_bytes,
                resent: f.resent,
                received: None,
            };
            let result = match c.outcome {
                TaskOutcome::Resend(cause) => match f.resend {
                    // The chip no longer holds what was left out: forget
                    // it, and send the member again (its bytes now go
                    // with it). Nothing ran; its clock starts again.
                    Some(item) => {
                        for fp in &f.held {
                            self.resident.remove(fp);
                        }
                        self.dispatch(vec![item]).await;
                        if self.dead {
                            return;
                        }
                        if let Some(again) = self.in_flight.get_mut(&c.id.0) {
                            again.resent = f.resent + 1;
                        }
                        continue;
                    }
                    None => Err(MemberFailure::Reported(FailureCause::new(
                        FailureKind::Other,
                        format!("the worker asked for bytes it was sent: {cause}"),
                    ))),
                },
                TaskOutcome::Failure(cause) => Err(MemberFailure::Reported(cause)),
                TaskOutcome::Success if c.held.is_empty() => {
                    land(&f, &c.outputs, &[], &mut report.returned)
                }
                TaskOutcome::Success => match self.fetch_held(&f, &c.held).await {
                    Ok((fetched, landed)) => {
                        let mut outputs = c.outputs;
                        outputs.extend(fetched);
                        land(&f, &outputs, &landed, &mut report.returned)
                    }
                    Err(Fetched::Failed(e)) => Err(e),
                    // The connection failed: nothing of this task landed,
                    // and the worker is lost with every member on it (the
                    // scheduler still counts this one running there).
                    Err(Fetched::Lost(cause)) => return self.lost(cause),
                },
            };
            if !c.held.is_empty() {
                received = None;
            }
            if result.is_ok() {
                self.hold(f.holds);
            }
            report.received = Some(*received.get_or_insert_with(std::time::Instant::now));
            let _ = self.up.send(Notice::Completed {
                event: Event::Finished {
                    task: f.task,
                    member: f.member,
                    result: result.map_err(MemberFailure::into_cause),
                },
                report,
            });
        }
    }
}

impl EndpointActor {
    /// Records copies the worker's chip holds (or will once a member sent
    /// now has run).
    fn hold(&mut self, holds: Vec<(Footprint, u64)>) {
        if holds.is_empty() {
            return;
        }
        if self.resident.len() + holds.len() > strata_orchestrator_core::residency::MAX_REMEMBERED {
            // Forgetting costs a resend of bytes the chip may still hold,
            // never a stale byte.
            self.resident.clear();
        }
        self.resident.extend(holds);
    }
}

/// Why the held bytes of a member did not come back.
enum Fetched {
    /// The worker refused (or held what the task does not write): the
    /// member fails.
    Failed(MemberFailure),
    /// The connection failed: the worker is lost.
    Lost(String),
}

/// Writes the bytes a staged worker sent back into the host buffers; every
/// argument the task writes must have come back, in `outputs` or already
/// `landed` in its buffer by a data connection (argument, bytes).
fn land(
    f: &InFlight,
    outputs: &[(u32, Bytes)],
    landed: &[(u32, u64)],
    returned: &mut u64,
) -> Result<(), MemberFailure> {
    for (index, view, host, tag) in &f.staged {
        if let Some((_, bytes)) = landed.iter().find(|(i, _)| i == index) {
            *returned += bytes;
            continue;
        }
        let out = outputs.iter().find(|(i, _)| i == index);
        match out {
            Some((_, bytes)) => {
                host.unpack(view, bytes)
                    .map_err(|source| MemberFailure::WriteBack {
                        arg: *index,
                        source,
                    })?;
                *returned += bytes.len() as u64;
            }
            None if tag.writes() => {
                return Err(MemberFailure::NothingBack { arg: *index });
            }
            None => {}
        }
    }
    Ok(())
}

/// About how many bytes a task takes in a message.
fn wire_size(req: &TaskRequest) -> usize {
    let inline: usize = req.inline.iter().flatten().map(|d| d.len() + 16).sum();
    req.args.encoded_len() + req.tags.len() + inline + 64
}
