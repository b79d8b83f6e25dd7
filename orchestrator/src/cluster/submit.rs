//! The one place a task becomes what the engine takes: callables
//! resolved, arguments and placement derived, the DAG's view built and
//! checked once, numbered and handed to the DAG actor.

use strata_chip_runtime::kernel::Signature;
use strata_orchestrator_core::{Placement, TaskId, WorkerId};
use strata_proto::convert::{BackendKinds, Capabilities, DTypeSet, Features};
use strata_wire::ArgTag;

use std::sync::Arc;

use super::{Cluster, Offered, not_async};
use crate::actors::{ArgRef, Cmd, MemberSpec, TaskSpec};
use crate::buffer::Backing;
use crate::error::{Error, Lack, Need, SubmitError};
use crate::task::{Task, TaskHandle};

impl Cluster {
    /// The signature of `name` or `name@version` as the workers reported
    /// it; [`Signature::canonical`] writes it as
    /// `name@version(arg:ACCESS:dtypes:rank,…;scalar:kind,…)`.
    ///
    /// # Errors
    /// [`Error::Submit`] for an unknown callable or version.
    pub fn callable_signature(&self, callable: &str) -> Result<Signature, Error> {
        self.resolve(callable).map(|o| o.signature.clone())
    }

    /// The offer `name` or `name@version` names.
    fn resolve(&self, callable: &str) -> Result<&Offered, Error> {
        let (name, version) = match callable.split_once('@') {
            Some((n, v)) => (
                n,
                Some(v.parse::<u32>().map_err(|_| SubmitError::BadVersion {
                    callable: callable.to_owned(),
                })?),
            ),
            None => (callable, None),
        };
        let Some(versions) = self.callables.get(name) else {
            let all = (0..self.workers.len()).map(worker_id);
            return Err(self
                .no_body(callable, name, version, all)
                .unwrap_or_else(|| SubmitError::UnknownCallable {
                    name: name.to_owned(),
                    offered: {
                        let mut names: Vec<String> = self.callables.keys().cloned().collect();
                        names.sort_unstable();
                        names
                    },
                })
                .into());
        };
        let found = match version {
            Some(v) => versions.iter().find(|o| o.version == v),
            None => versions.last(),
        };
        found.ok_or_else(|| {
            let all = (0..self.workers.len()).map(worker_id);
            self.no_body(callable, name, version, all)
                .unwrap_or_else(|| SubmitError::UnknownVersion {
                    name: name.to_owned(),
                    version: version.unwrap_or(0),
                    offered: versions.iter().map(|o| o.version).collect(),
                })
                .into()
        })
    }

    /// [`SubmitError::NoBody`] when one of `workers` has `name` (at
    /// `version`, or any) registered without a body for its chip.
    fn no_body(
        &self,
        callable: &str,
        name: &str,
        version: Option<u32>,
        workers: impl Iterator<Item = WorkerId>,
    ) -> Option<SubmitError> {
        let lacks = |entry: &String| {
            entry
                .split_once('@')
                .is_some_and(|(n, v)| n == name && version.is_none_or(|want| v.parse() == Ok(want)))
        };
        let (ids, named): (Vec<WorkerId>, Vec<String>) = workers
            .filter_map(|w| {
                let info = self.workers.get(w.0 as usize)?;
                info.no_body
                    .iter()
                    .any(lacks)
                    .then(|| (w, format!("{w} ({})", info.device)))
            })
            .unzip();
        (!ids.is_empty()).then(|| SubmitError::NoBody {
            callable: callable.to_owned(),
            workers: named,
            ids,
        })
    }

    fn member(&self, task: Task) -> Result<(MemberSpec, Vec<TaskId>), Error> {
        let offered = self.resolve(&task.callable)?;
        let (callable, name) = (offered.handle, Arc::clone(&offered.qualified));
        if task.timeout.is_some_and(|t| t.is_zero()) {
            return Err(SubmitError::ZeroTimeout {
                callable: name.to_string(),
            }
            .into());
        }
        // The last device argument so far: its index, worker and that
        // worker's path.
        let mut device_on: Option<(usize, WorkerId, crate::paths::WorkerPath)> = None;
        let mut device_buffers = Vec::new();
        // Shared device buffers: each maps wherever the task runs.
        let mut shared = Vec::new();
        let mut args = Vec::with_capacity(task.args.len());
        let mut needs = Capabilities {
            features: task.required_features,
            ..Capabilities::NONE
        };
        for (i, (view, tag)) in task.args.into_iter().enumerate() {
            needs.backends = needs.backends.with(view.tensor.buffer().backing().kind());
            needs.dtypes = needs.dtypes.with(view.tensor.dtype());
            let backing = view
                .buffer
                .backing()
                .map_err(|source| SubmitError::DeadArgument {
                    callable: name.to_string(),
                    arg: i,
                    source: Box::new(source),
                })?;
            if let Backing::Device(d) = &backing {
                self.check_alive(d)
                    .map_err(|source| SubmitError::DeadArgument {
                        callable: name.to_string(),
                        arg: i,
                        source: Box::new(source),
                    })?;
                device_buffers.push(*d.desc.identity());
                if d.shared {
                    shared.push((i, std::sync::Arc::clone(d)));
                    args.push(ArgRef {
                        tensor: view.tensor,
                        tag,
                        backing,
                    });
                    continue;
                }
                match &device_on {
                    Some((j, worker, path)) if *worker != d.worker => {
                        return Err(SubmitError::DevicesDiffer {
                            callable: name.to_string(),
                            first: *j,
                            first_worker: *worker,
                            first_path: path.clone(),
                            second: i,
                            second_worker: d.worker,
                            second_path: d.path.clone(),
                        }
                        .into());
                    }
                    _ => device_on = Some((i, d.worker, d.path.clone())),
                }
            }
            args.push(ArgRef {
                tensor: view.tensor,
                tag,
                backing,
            });
        }
        let placement = match (task.on, device_on) {
            (Some(w), Some((i, worker, path))) if w != worker => {
                return Err(SubmitError::PlacedAway {
                    callable: name.to_string(),
                    placed: w,
                    arg: i,
                    device: worker,
                    device_path: path,
                }
                .into());
            }
            (Some(w), _) | (None, Some((_, w, _))) => Placement::On(w),
            // Where its first shared buffer lives, unless placed.
            (None, None) => shared
                .first()
                .map_or(Placement::Any, |(_, d)| Placement::On(d.worker)),
        };
        if let Placement::On(w) = placement {
            for (i, d) in shared.iter().filter(|(_, d)| d.worker != w) {
                self.import_on(d, w)
                    .map_err(|source| SubmitError::SharedImport {
                        callable: name.to_string(),
                        arg: *i,
                        buffer: *d.desc.identity(),
                        owner: d.worker,
                        worker: w,
                        source: Box::new(source),
                    })?;
            }
        }
        let work = work_of(&args, task.flops);
        Ok((
            MemberSpec {
                callable,
                name,
                work,
                args: args.into(),
                scalars: task.scalars.into(),
                placement,
                device_buffers,
                timeout: task.timeout,
                required_features: task.required_features,
                needs,
            },
            task.after,
        ))
    }

    /// Checks a task where it is submitted — the DAG's submit-time rules
    /// and its placement against the workers' callables — numbers it and
    /// hands it to the DAG actor without waiting for an answer.
    fn submit_spec(
        &self,
        spec: TaskSpec,
        after: Vec<TaskId>,
        retries: u32,
    ) -> Result<TaskHandle, Error> {
        not_async()?;
        self.check_placement(&spec)?;
        self.gate.enter().map_err(|_| Error::Closed)?;
        let r = self.submit_entered(spec, after, retries);
        if r.is_err() {
            self.gate.leave(1);
        }
        r
    }

    /// [`Cluster::submit_spec`] once the task holds its place in the gate:
    /// the one place a task becomes what the engine takes. Its DAG view is
    /// built and checked here, once ([`strata_orchestrator_core::Dag::check`]); the DAG
    /// actor inserts the checked task as it is.
    fn submit_entered(
        &self,
        spec: TaskSpec,
        after: Vec<TaskId>,
        retries: u32,
    ) -> Result<TaskHandle, Error> {
        let mut next = self.next_id.lock().unwrap_or_else(|e| e.into_inner());
        let id = TaskId(*next);
        let task = strata_orchestrator_core::dag::NewTask {
            id,
            members: spec
                .members
                .iter()
                .map(|m| {
                    m.args
                        .iter()
                        .map(|a| strata_orchestrator_core::dag::Arg {
                            tensor: a.tensor,
                            tag: a.tag,
                        })
                        .collect()
                })
                .collect(),
            scalars: spec.members.iter().map(|m| m.scalars.len()).collect(),
            after,
        };
        let task = strata_orchestrator_core::Dag::check(task).map_err(SubmitError::Rejected)?;
        let submission = strata_orchestrator_core::Submission {
            task,
            members: spec
                .members
                .iter()
                .map(|m| strata_orchestrator_core::sched::MemberInfo {
                    callable: m.callable,
                    placement: m.placement,
                    device_buffers: m.device_buffers.clone(),
                    needs: m.needs,
                    work: m.work.clone(),
                })
                .collect(),
            retries,
        };
        // A free slot takes the command at once; only a full channel
        // (the actor behind) parks the thread, and then until a batch of
        // slots is free: waiting for one slot woke this thread (a futex
        // call on the actor's thread) for every command the actor took.
        match self.cmds.try_send(Cmd::Submit { spec, submission }) {
            Ok(()) => {}
            Err(tokio::sync::mpsc::error::TrySendError::Full(cmd)) => {
                let runtime = self.runtime.as_ref().ok_or(Error::Closed)?;
                let batch = (self.cmds.max_capacity() / 4).max(1);
                let mut room = runtime
                    .block_on(self.cmds.reserve_many(batch))
                    .map_err(|_| Error::Closed)?;
                // The other slots go back as `room` drops, for the next
                // submits to take without waiting.
                room.next().ok_or(Error::Closed)?.send(cmd);
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => return Err(Error::Closed),
        }
        *next += 1;
        Ok(TaskHandle(id))
    }

    /// The scheduler's placement rules, checked against the callables and
    /// the capabilities each worker reported at the start: a member goes
    /// only to a worker that offers its callable and has what it needs.
    fn check_placement(&self, spec: &TaskSpec) -> Result<(), Error> {
        for (m, member) in spec.members.iter().enumerate() {
            match member.placement {
                Placement::On(w) => {
                    let offers = self.offers.get(w.0 as usize).ok_or_else(|| {
                        SubmitError::UnknownPlacement {
                            callable: member.name.to_string(),
                            member: m,
                            worker: w,
                            workers: self.offers.len(),
                        }
                    })?;
                    if !offers.contains(&member.callable) {
                        let (name, version) = member
                            .name
                            .split_once('@')
                            .map_or((&*member.name, None), |(n, v)| (n, v.parse().ok()));
                        let why = self.no_body(&member.name, name, version, std::iter::once(w));
                        return Err(why
                            .unwrap_or_else(|| SubmitError::NotRegistered {
                                member: m,
                                callable: member.name.to_string(),
                                worker: w,
                            })
                            .into());
                    }
                    if !self.takes(w, member) {
                        return Err(SubmitError::Incapable {
                            member: m,
                            callable: member.name.to_string(),
                            placed: Some(self.named(w)),
                            lacks: self.lacks(member, &[w]),
                        }
                        .into());
                    }
                    // Members are few (at most one per worker, checked
                    // below): a scan of the earlier ones allocates nothing.
                    if spec.members[..m]
                        .iter()
                        .any(|e| e.placement == Placement::On(w))
                    {
                        return Err(SubmitError::WorkerTaken {
                            member: m,
                            worker: w,
                        }
                        .into());
                    }
                }
                Placement::Any => {
                    if !self.offers.iter().any(|o| o.contains(&member.callable)) {
                        return Err(SubmitError::NotOffered {
                            member: m,
                            callable: member.name.to_string(),
                        }
                        .into());
                    }
                    if !(0..self.offers.len()).any(|w| self.takes(worker_id(w), member)) {
                        let offering: Vec<WorkerId> = (0..self.offers.len())
                            .map(worker_id)
                            .filter(|w| self.offers(*w, member))
                            .collect();
                        return Err(SubmitError::Incapable {
                            member: m,
                            callable: member.name.to_string(),
                            placed: None,
                            lacks: self.lacks(member, &offering),
                        }
                        .into());
                    }
                }
            }
        }
        if spec.members.len() > self.offers.len() {
            return Err(SubmitError::GroupTooLarge {
                members: spec.members.len(),
                workers: self.offers.len(),
            }
            .into());
        }
        Ok(())
    }

    /// Whether `w` offers `member`'s callable.
    fn offers(&self, w: WorkerId, member: &MemberSpec) -> bool {
        self.offers
            .get(w.0 as usize)
            .is_some_and(|o| o.contains(&member.callable))
    }

    /// Whether `w` can take `member`: it offers the callable and has what
    /// the member needs (the scheduler's own test, on the same facts).
    fn takes(&self, w: WorkerId, member: &MemberSpec) -> bool {
        self.offers(w, member)
            && self
                .capabilities
                .get(w.0 as usize)
                .is_some_and(|c| c.covers(&member.needs))
    }

    /// `worker N (address)`.
    fn named(&self, w: WorkerId) -> String {
        match self.workers.get(w.0 as usize) {
            Some(info) => format!("{w} ({})", info.endpoint),
            None => w.to_string(),
        }
    }

    /// What `member` needs that some of `workers` lack, argument by
    /// argument (each argument's kind of buffer, then its dtype), then the
    /// features it requires, with the workers that lack each.
    fn lacks(&self, member: &MemberSpec, workers: &[WorkerId]) -> Vec<Lack> {
        let caps = |w: &WorkerId| {
            self.capabilities
                .get(w.0 as usize)
                .copied()
                .unwrap_or(Capabilities::NONE)
        };
        let without = |need: Capabilities| -> Vec<(WorkerId, String)> {
            workers
                .iter()
                .filter(|w| !caps(w).covers(&need))
                .map(|w| {
                    let at = self
                        .workers
                        .get(w.0 as usize)
                        .map(|i| i.endpoint.clone())
                        .unwrap_or_default();
                    (*w, at)
                })
                .collect()
        };
        let mut out = Vec::new();
        let mut push = |arg: Option<usize>, need: Need, caps: Capabilities| {
            let workers = without(caps);
            if !workers.is_empty() {
                out.push(Lack { arg, need, workers });
            }
        };
        for (i, a) in member.args.iter().enumerate() {
            let kind = a.tensor.buffer().backing().kind();
            push(
                Some(i),
                Need::Backend(kind),
                Capabilities {
                    backends: BackendKinds::NONE.with(kind),
                    ..Capabilities::NONE
                },
            );
            let dtype = a.tensor.dtype();
            push(
                Some(i),
                Need::DType(dtype),
                Capabilities {
                    dtypes: DTypeSet::NONE.with(dtype),
                    ..Capabilities::NONE
                },
            );
        }
        for bit in 0..64 {
            let one = Features::from_bits(1 << bit);
            if member.required_features.contains(one) {
                push(
                    None,
                    Need::Feature(one),
                    Capabilities {
                        features: one,
                        ..Capabilities::NONE
                    },
                );
            }
        }
        out
    }

    /// Submits a task. Its dependencies on earlier tasks are inferred from
    /// the bytes its arguments read and write (plus its `after` edges).
    ///
    /// # Errors
    /// [`Error::Submit`] when it is refused (unknown callable, grant
    /// mismatch, arguments of the task overlapping where one is written,
    /// placement that cannot work); nothing is queued then.
    pub fn submit(&self, task: Task) -> Result<TaskHandle, Error> {
        let (member, after) = self.member(task)?;
        let rerunnable = member.placement == Placement::Any
            && member.device_buffers.is_empty()
            && member.args.iter().all(|a| {
                matches!(
                    a.tag,
                    ArgTag::Input | ArgTag::Output | ArgTag::OutputExisting
                )
            });
        let retries = if rerunnable { self.retries } else { 0 };
        self.submit_spec(
            TaskSpec {
                members: vec![member],
            },
            after,
            retries,
        )
    }

    /// Submits a group: one member per worker, launched all-or-nothing
    /// (for members that wait for each other). `after` edges of every
    /// member apply to the group.
    ///
    /// # Errors
    /// As [`Cluster::submit`].
    pub fn submit_group(&self, members: Vec<Task>) -> Result<TaskHandle, Error> {
        let mut specs = Vec::with_capacity(members.len());
        let mut after = Vec::new();
        for t in members {
            let (m, a) = self.member(t)?;
            specs.push(m);
            after.extend(a);
        }
        after.sort_unstable();
        after.dedup();
        self.submit_spec(TaskSpec { members: specs }, after, 0)
    }
}

/// Worker `w` of the cluster (an index below its worker count, which fits
/// a `u32`: the cluster was built so).
fn worker_id(w: usize) -> WorkerId {
    WorkerId(u32::try_from(w).unwrap_or(u32::MAX))
}

/// What the performance models know of a member before it runs: its
/// arguments' shapes, dtypes and tags (the size class), the bytes they
/// span, its declared flops, and the exact views it touches.
fn work_of(args: &[ArgRef], flops: Option<u64>) -> strata_orchestrator_core::sched::Work {
    use std::hash::{Hash, Hasher};
    let mut class = rustc_hash::FxHasher::default();
    let mut size = 0u64;
    let mut data = smallvec::SmallVec::new();
    for a in args {
        let t = &a.tensor;
        (t.shape(), t.dtype().code(), a.tag as u8).hash(&mut class);
        let bytes = t.dtype().bytes_for(t.element_count()).unwrap_or(0);
        size = size.saturating_add(bytes);
        let mut key = rustc_hash::FxHasher::default();
        (
            t.identity(),
            t.byte_offset(),
            t.shape(),
            t.strides(),
            t.dtype().code(),
        )
            .hash(&mut key);
        data.push((key.finish(), bytes, a.tag.writes()));
    }
    strata_orchestrator_core::sched::Work {
        class: class.finish(),
        size,
        flops,
        data,
    }
}
