//! Conversions between prost messages and domain types, each checking every
//! field; and the one mapping from conversion errors to gRPC statuses.

use bytes::Bytes;

pub use strata_boundary::{
    BackendKinds, CallableOffer, Capabilities, DTypeSet, FailureCause, FailureKind, Features,
    InstanceId, SessionId, WorkerFacts,
};
use strata_wire::{ArgTag, BackendKind, CanonicalIdentity, DType, TaskArgs};
use strata_wire::{KernelHandle, Region, TaskId};

use crate::pb;

/// A message field that broke a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConvertError {
    /// Path of the field, such as `tasks[3].tags[1]`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ConvertError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConvertError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl From<ConvertError> for tonic::Status {
    fn from(e: ConvertError) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

/// A 32-byte identity field.
///
/// # Errors
/// When the bytes are not a valid identity.
pub fn identity(field: &str, bytes: &[u8]) -> Result<CanonicalIdentity, ConvertError> {
    CanonicalIdentity::decode(bytes).map_err(|e| ConvertError::new(field, e.to_string()))
}

/// A 16-byte callable handle field.
///
/// # Errors
/// When the field is not 16 bytes.
pub fn handle(field: &str, bytes: &[u8]) -> Result<KernelHandle, ConvertError> {
    let h: [u8; 16] = bytes.try_into().map_err(|_| {
        ConvertError::new(
            field,
            format!("a callable handle is 16 bytes, got {}", bytes.len()),
        )
    })?;
    Ok(KernelHandle(h))
}

/// A region field (persistent, run or shared).
///
/// # Errors
/// For an unspecified or unknown region.
pub fn region(field: &str, code: i32) -> Result<Region, ConvertError> {
    match pb::Region::try_from(code) {
        Ok(pb::Region::Persistent) => Ok(Region::Persistent),
        Ok(pb::Region::Run) => Ok(Region::Run),
        Ok(pb::Region::Shared) => Ok(Region::Shared),
        _ => Err(ConvertError::new(
            field,
            format!("region {code} is not PERSISTENT (1), RUN (2) or SHARED (3)"),
        )),
    }
}

/// The protobuf code of a region; scratch has none (it is never asked for).
pub fn region_code(r: Region) -> i32 {
    match r {
        Region::Persistent => pb::Region::Persistent as i32,
        Region::Run | Region::Scratch => pb::Region::Run as i32,
        Region::Shared => pb::Region::Shared as i32,
    }
}

/// What a worker did on `EndRun`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunEnd {
    /// Run-region buffers of the session it retired.
    pub retired: u32,
    /// The session's run number from now on (at least 1).
    pub run: u64,
    /// Whether the call reset the run region (no other holder was left).
    pub reset: bool,
}

impl TryFrom<pb::EndRunReply> for RunEnd {
    type Error = ConvertError;

    fn try_from(r: pb::EndRunReply) -> Result<Self, ConvertError> {
        if r.run == 0 {
            return Err(ConvertError::new(
                "run",
                "0 is the first run, which no EndRun can leave the session in",
            ));
        }
        Ok(RunEnd {
            retired: r.retired,
            run: r.run,
            reset: r.reset,
        })
    }
}

impl From<RunEnd> for pb::EndRunReply {
    fn from(r: RunEnd) -> Self {
        pb::EndRunReply {
            retired: r.retired,
            run: r.run,
            reset: r.reset,
        }
    }
}

/// A task, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRequest {
    /// Its id.
    pub id: TaskId,
    /// The callable.
    pub callable: KernelHandle,
    /// Tensor and scalar arguments, validated.
    pub args: TaskArgs,
    /// One tag per tensor.
    pub tags: Vec<ArgTag>,
    /// Per tensor: the packed view bytes that travel with the task, if any
    /// (remote workers). Empty for a remote argument the task only writes.
    /// Shared, not owned: the driver's packed bytes go into the message,
    /// and a worker's are slices of the message they came in, without a
    /// copy either way.
    pub inline: Vec<Option<Bytes>>,
    /// Arguments whose bytes were sent ahead of the task (a `Stage` call),
    /// by argument index and the id they were staged under: their `inline`
    /// entry is `None` until the worker resolves them
    /// ([`TaskRequest::resolve_staged`]).
    pub staged: Vec<(u32, u64)>,
    /// Arguments whose device copies the worker may keep between tasks,
    /// at the versions named (at most one per argument).
    pub cache: Vec<CacheArg>,
    /// Features the task needs of its worker, unknown bits kept: the
    /// worker refuses the task when it lacks one.
    pub required_features: Features,
    /// The task's upward rank when dispatched (ns; 0: not ranked): a chip
    /// that can favour some work favours the higher.
    pub priority: u64,
}

/// How one argument of a task uses the worker's device cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheArg {
    /// Which tensor argument.
    pub index: u32,
    /// The version of the bytes the task must see.
    pub version: u64,
    /// For an argument the task writes: the version of its bytes once the
    /// task has succeeded.
    pub written: u64,
    /// For an argument the task writes: keep the bytes on the chip
    /// (dirty) instead of copying them back when the task ends.
    pub deferred: bool,
    /// The argument's bytes did not come with the task: the chip holds
    /// them at `version`, or the task completes with
    /// [`TaskOutcome::Resend`] without running.
    pub held: bool,
}

impl TaskRequest {
    /// Replaces every staged reference by the bytes `take` returns for its
    /// id (the worker's session table), checked like bytes that came with
    /// the task.
    ///
    /// # Errors
    /// An id `take` does not know (never staged, or used already), or
    /// bytes of the wrong length for the view; the field names the
    /// argument.
    pub fn resolve_staged(
        &mut self,
        mut take: impl FnMut(u64) -> Option<Bytes>,
    ) -> Result<(), ConvertError> {
        for (i, id) in std::mem::take(&mut self.staged) {
            let field = format!("staged argument {i}");
            let data = take(id).ok_or_else(|| {
                ConvertError::new(
                    &field,
                    format!("no staged bytes {id} in this session (never staged, or used already)"),
                )
            })?;
            let (Some(view), Some(slot)) = (
                self.args.tensors().get(i as usize),
                self.inline.get_mut(i as usize),
            ) else {
                return Err(ConvertError::new(field, "past the task's tensors"));
            };
            let want = strata_wire::geometry::packed_len_bounded(view, data.len() as u64 * 2)
                .unwrap_or(u64::MAX);
            if data.len() as u64 != want {
                return Err(ConvertError::new(
                    field,
                    format!(
                        "{} staged bytes for a view of {} elements ({} bytes packed)",
                        data.len(),
                        view.element_count(),
                        packed_or_unknown(want)
                    ),
                ));
            }
            *slot = Some(data);
        }
        Ok(())
    }
}

fn packed_or_unknown(want: u64) -> String {
    if want == u64::MAX {
        "more than twice that many".to_owned()
    } else {
        want.to_string()
    }
}

impl TryFrom<pb::Task> for TaskRequest {
    type Error = ConvertError;

    fn try_from(t: pb::Task) -> Result<Self, ConvertError> {
        let callable = handle("callable", &t.callable)?;
        let args =
            TaskArgs::decode(&t.args).map_err(|e| ConvertError::new("args", e.to_string()))?;
        let n = args.tensors().len();
        if t.tags.len() != n {
            return Err(ConvertError::new(
                "tags",
                format!("{} tags for {n} tensor arguments", t.tags.len()),
            ));
        }
        let tags = t
            .tags
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                ArgTag::from_code(c).ok_or_else(|| {
                    ConvertError::new(
                        format!("tags[{i}]"),
                        format!("{c} is not a tag code 0 to 4"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut inline: Vec<Option<Bytes>> = vec![None; n];
        let mut staged: Vec<(u32, u64)> = Vec::new();
        for (k, item) in t.inline_inputs.into_iter().enumerate() {
            let field = format!("inline_inputs[{k}]");
            let i = usize::try_from(item.arg_index).unwrap_or(usize::MAX);
            let slot = inline.get_mut(i).ok_or_else(|| {
                ConvertError::new(
                    &field,
                    format!("arg_index {} is past the {n} tensors", item.arg_index),
                )
            })?;
            if slot.is_some() || staged.iter().any(|&(j, _)| j == item.arg_index) {
                return Err(ConvertError::new(
                    field,
                    format!("argument {i} has inline bytes twice"),
                ));
            }
            let view = &args.tensors()[i];
            if view.extent_bytes() > crate::MAX_INLINE_EXTENT {
                return Err(ConvertError::new(
                    field,
                    format!(
                        "argument {i}'s view spans {} bytes; at most {} travel inline",
                        view.extent_bytes(),
                        crate::MAX_INLINE_EXTENT
                    ),
                ));
            }
            if item.staged != 0 {
                if !item.data.is_empty() {
                    return Err(ConvertError::new(
                        field,
                        format!("argument {i} names staged bytes and carries bytes too"),
                    ));
                }
                staged.push((item.arg_index, item.staged));
                continue;
            }
            // Every element is at least half a byte of the packed string:
            // a view with more elements than that cannot match the bytes
            // (and walking it could take forever).
            let cap = if item.data.is_empty() {
                crate::MAX_INLINE_EXTENT * 2
            } else {
                item.data.len() as u64 * 2
            };
            let Some(want) = strata_wire::geometry::packed_len_bounded(view, cap) else {
                return Err(ConvertError::new(
                    field,
                    format!(
                        "argument {i}'s view has {} elements, more than {} bytes can hold",
                        view.element_count(),
                        item.data.len()
                    ),
                ));
            };
            // An OUTPUT view is written whole: its old bytes need not travel.
            let write_only = tags[i] == ArgTag::Output && item.data.is_empty();
            if item.data.len() as u64 != want && !write_only {
                return Err(ConvertError::new(
                    field,
                    format!(
                        "{} bytes for argument {i}, whose view has {want}",
                        item.data.len()
                    ),
                ));
            }
            *slot = Some(item.data);
        }
        let mut cache: Vec<CacheArg> = Vec::with_capacity(t.cache.len());
        for (k, c) in t.cache.iter().enumerate() {
            let field = format!("cache[{k}]");
            if c.arg_index as usize >= n {
                return Err(ConvertError::new(
                    field,
                    format!("arg_index {} is past the {n} tensors", c.arg_index),
                ));
            }
            if cache.iter().any(|d| d.index == c.arg_index) {
                return Err(ConvertError::new(
                    field,
                    format!("argument {} has two cache entries", c.arg_index),
                ));
            }
            let i = c.arg_index as usize;
            if c.held
                && (inline.get(i).is_some_and(Option::is_some)
                    || staged.iter().any(|(a, _)| *a == c.arg_index))
            {
                return Err(ConvertError::new(
                    field,
                    format!("argument {i} is held on the chip and carries bytes too"),
                ));
            }
            if c.held && tags.get(i) == Some(&ArgTag::Output) {
                return Err(ConvertError::new(
                    field,
                    format!(
                        "argument {i} is held on the chip but is an OUTPUT, whose old bytes nobody reads"
                    ),
                ));
            }
            cache.push(CacheArg {
                index: c.arg_index,
                version: c.version,
                written: c.written,
                deferred: c.deferred,
                held: c.held,
            });
        }
        Ok(TaskRequest {
            id: TaskId(t.task_id),
            callable,
            args,
            tags,
            inline,
            staged,
            cache,
            required_features: Features::from_bits(t.required_features),
            priority: t.priority,
        })
    }
}

impl From<&TaskRequest> for pb::Task {
    fn from(r: &TaskRequest) -> Self {
        pb::Task {
            task_id: r.id.0,
            callable: r.callable.0.to_vec(),
            args: r.args.encode(),
            tags: r.tags.iter().map(|t| t.code()).collect(),
            inline_inputs: r
                .inline
                .iter()
                .enumerate()
                .filter_map(|(i, d)| {
                    d.as_ref().map(|data| pb::InlineBytes {
                        arg_index: i as u32,
                        // A reference count, not a copy of the bytes.
                        data: data.clone(),
                        staged: 0,
                    })
                })
                .chain(r.staged.iter().map(|&(arg_index, staged)| pb::InlineBytes {
                    arg_index,
                    data: Bytes::new(),
                    staged,
                }))
                .collect(),
            cache: r
                .cache
                .iter()
                .map(|c| pb::CacheArg {
                    arg_index: c.index,
                    version: c.version,
                    written: c.written,
                    deferred: c.deferred,
                    held: c.held,
                })
                .collect(),
            required_features: r.required_features.bits(),
            priority: r.priority,
        }
    }
}

/// A handshake's `callables[i]`, checked: a 16-byte handle that is the
/// digest of its signature, which parses and names the callable.
///
/// # Errors
/// The field at fault and why.
pub fn callable(i: usize, c: pb::Callable) -> Result<CallableOffer, ConvertError> {
    let field = format!("callables[{i}]");
    let h = handle(&format!("{field}.handle"), &c.handle)?;
    CallableOffer::checked(h, &c.name, c.version, &c.signature)
        .map_err(|e| ConvertError::new(field, e))
}

impl From<&CallableOffer> for pb::Callable {
    fn from(c: &CallableOffer) -> Self {
        pb::Callable {
            handle: c.handle.0.to_vec(),
            name: c.signature.name.clone(),
            version: c.signature.version,
            signature: c.signature.canonical(),
        }
    }
}

/// The worker's facts in a handshake reply, checked (its callables, its
/// capabilities, its instance); the fields only the transport has are left
/// in `reply`.
///
/// # Errors
/// The field at fault and why: a malformed callable, a code listed twice,
/// `features` and `data_port` that disagree on the data connection, and
/// `required_features` naming a bit this build does not know (the worker
/// needs a driver that understands it).
pub fn worker_facts(reply: &mut pb::HandshakeReply) -> Result<WorkerFacts, ConvertError> {
    let callables = std::mem::take(&mut reply.callables)
        .into_iter()
        .enumerate()
        .map(|(i, c)| callable(i, c))
        .collect::<Result<Vec<_>, _>>()?;
    let required_features = Features::from_bits(reply.required_features);
    let unknown = required_features.unknown();
    if !unknown.is_empty() {
        return Err(ConvertError::new(
            "required_features",
            format!(
                "the worker requires features this driver does not know: {unknown} (mask {:#x}); use a driver that understands them",
                unknown.bits()
            ),
        ));
    }
    let features = Features::from_bits(reply.features);
    if features.contains(Features::DATA_PORT) != (reply.data_port != 0) {
        return Err(ConvertError::new(
            "features",
            format!(
                "{features} disagrees with data_port {}: DATA_PORT is set exactly when a port is",
                reply.data_port
            ),
        ));
    }
    let no_body = no_body(&callables, std::mem::take(&mut reply.no_body))?;
    let capabilities = Capabilities {
        backends: backend_kinds("backend_kinds", &reply.backend_kinds)?,
        dtypes: dtypes("dtypes", &reply.dtypes)?,
        features,
    };
    Ok(WorkerFacts {
        chip_id: reply.chip_id,
        device_kind: std::mem::take(&mut reply.device_kind),
        device_spec: std::mem::take(&mut reply.device_spec),
        device_memory: reply.device_memory,
        lanes: reply.lanes,
        callables,
        no_body,
        capabilities,
        required_features,
        instance: instance("instance", reply.instance)?,
    })
}

/// A handshake's `no_body`, checked: each entry `name@version` with a
/// name and a numeric version, in increasing order (so each once), and
/// none of them offered in `callables`.
fn no_body(callables: &[CallableOffer], names: Vec<String>) -> Result<Vec<String>, ConvertError> {
    let mut last: Option<(&str, u32)> = None;
    for (i, entry) in names.iter().enumerate() {
        let field = || format!("no_body[{i}]");
        let (name, version) = entry
            .split_once('@')
            .and_then(|(n, v)| Some((n, v.parse::<u32>().ok()?)))
            .filter(|(n, _)| !n.is_empty())
            .ok_or_else(|| ConvertError::new(field(), format!("{entry:?} is not name@version")))?;
        if last.is_some_and(|l| l >= (name, version)) {
            return Err(ConvertError::new(
                field(),
                format!("{entry:?} is out of order or listed twice"),
            ));
        }
        if callables
            .iter()
            .any(|c| c.name() == name && c.version() == version)
        {
            return Err(ConvertError::new(
                field(),
                format!("{entry:?} is also offered in callables"),
            ));
        }
        last = Some((name, version));
    }
    Ok(names)
}

/// What a handshake reply says of the worker's facts, capabilities
/// included (the service's side of [`worker_facts`]; the transport's own
/// fields are the caller's to fill).
pub fn handshake_facts(facts: &WorkerFacts) -> pb::HandshakeReply {
    let caps = &facts.capabilities;
    pb::HandshakeReply {
        chip_id: facts.chip_id,
        device_kind: facts.device_kind.clone(),
        device_spec: facts.device_spec.clone(),
        device_memory: facts.device_memory,
        lanes: facts.lanes,
        callables: facts.callables.iter().map(pb::Callable::from).collect(),
        no_body: facts.no_body.clone(),
        instance: facts.instance.0,
        backend_kinds: caps.backends.iter().map(BackendKind::code).collect(),
        dtypes: caps.dtypes.iter().map(DType::code).collect(),
        features: caps.features.bits(),
        required_features: facts.required_features.bits(),
        ..pb::HandshakeReply::default()
    }
}

/// A set of one-byte codes (`field[i]` each), each listed once: the codes
/// `known` turns into values, the rest (a newer peer's) left out.
fn code_set<T>(
    field: &str,
    codes: &[u8],
    known: impl Fn(u8) -> Option<T>,
    mut add: impl FnMut(T),
) -> Result<(), ConvertError> {
    let mut seen = [false; 256];
    for (i, &c) in codes.iter().enumerate() {
        let slot = seen.get_mut(usize::from(c)).ok_or_else(|| {
            ConvertError::new(format!("{field}[{i}]"), format!("{c} is not a code"))
        })?;
        if std::mem::replace(slot, true) {
            return Err(ConvertError::new(
                format!("{field}[{i}]"),
                format!("code {c} is listed twice"),
            ));
        }
        if let Some(v) = known(c) {
            add(v);
        }
    }
    Ok(())
}

/// Backend-kind codes, one per byte, each once; codes this build does not
/// know are left out.
///
/// # Errors
/// A code listed twice, naming `field[i]`.
pub fn backend_kinds(field: &str, codes: &[u8]) -> Result<BackendKinds, ConvertError> {
    let mut set = BackendKinds::NONE;
    code_set(field, codes, BackendKind::from_code, |k| set = set.with(k))?;
    Ok(set)
}

/// Dtype codes, one per byte, each once; codes this build does not know
/// are left out.
///
/// # Errors
/// A code listed twice, naming `field[i]`.
pub fn dtypes(field: &str, codes: &[u8]) -> Result<DTypeSet, ConvertError> {
    let mut set = DTypeSet::NONE;
    code_set(field, codes, DType::from_code, |d| set = set.with(d))?;
    Ok(set)
}

/// How a task ended on the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskOutcome {
    /// It ran to success.
    Success,
    /// It failed; the cause.
    Failure(FailureCause),
    /// It did not run: bytes the driver left out as held
    /// ([`CacheArg::held`]) are not on the chip; which ones. Sent again
    /// with the bytes, it runs.
    Resend(String),
}

/// A task's completion, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskCompletion {
    /// The task.
    pub id: TaskId,
    /// How it ended.
    pub outcome: TaskOutcome,
    /// Lane it ran on.
    pub lane: u32,
    /// Nanoseconds waiting for a lane.
    pub queued_ns: u64,
    /// Nanoseconds staging and running.
    pub busy_ns: u64,
    /// Nanoseconds in the kernel.
    pub kernel_ns: u64,
    /// Bytes staged host → device.
    pub staged_in: u64,
    /// Bytes staged device → host.
    pub staged_out: u64,
    /// Of `busy_ns`: staging in before the kernel.
    pub copy_in_ns: u64,
    /// Of `busy_ns`: staging out after the kernel.
    pub copy_out_ns: u64,
    /// What it did in the device cache (counters; the gauges are 0).
    pub cache: CacheCounters,
    /// Packed bytes of written inline arguments, by argument index (on the
    /// driver, slices of the message they came in).
    pub outputs: Vec<(u32, Bytes)>,
    /// Written views too large for the completion's message: by argument
    /// index, the id under which the worker holds their packed bytes for
    /// one `Fetch`.
    pub held: Vec<(u32, u64)>,
}

impl TaskCompletion {
    /// Task `id` failed with `cause`, before or while it ran: a
    /// [`TaskCompletion::bare`] failure.
    pub fn failed(id: TaskId, cause: FailureCause) -> Self {
        TaskCompletion::bare(id, TaskOutcome::Failure(cause))
    }

    /// How task `id` ended, with no timing, staging or outputs: a task
    /// that failed before it ran, or a completion built by hand.
    pub fn bare(id: TaskId, outcome: TaskOutcome) -> Self {
        TaskCompletion {
            id,
            outcome,
            lane: 0,
            queued_ns: 0,
            busy_ns: 0,
            kernel_ns: 0,
            staged_in: 0,
            staged_out: 0,
            copy_in_ns: 0,
            copy_out_ns: 0,
            cache: CacheCounters::default(),
            outputs: Vec::new(),
            held: Vec::new(),
        }
    }
}

impl TryFrom<pb::Completion> for TaskCompletion {
    type Error = ConvertError;

    fn try_from(c: pb::Completion) -> Result<Self, ConvertError> {
        let outcome = match pb::Outcome::try_from(c.outcome) {
            Ok(pb::Outcome::Success) => {
                if !c.cause.is_empty() {
                    return Err(ConvertError::new("cause", "a successful task has no cause"));
                }
                TaskOutcome::Success
            }
            Ok(pb::Outcome::TaskFailure) => {
                if c.cause.is_empty() {
                    return Err(ConvertError::new(
                        "cause",
                        "a failed task must carry its cause",
                    ));
                }
                TaskOutcome::Failure(FailureCause::new(FailureKind::from_code(c.kind), c.cause))
            }
            Ok(pb::Outcome::Resend) => {
                if c.cause.is_empty() {
                    return Err(ConvertError::new(
                        "cause",
                        "a task to send again must say which bytes are missing",
                    ));
                }
                TaskOutcome::Resend(c.cause)
            }
            _ => {
                return Err(ConvertError::new(
                    "outcome",
                    format!("{} is not SUCCESS, TASK_FAILURE or RESEND", c.outcome),
                ));
            }
        };
        let timing = c.timing.unwrap_or_default();
        let mut outputs = Vec::with_capacity(c.outputs.len());
        let mut held = Vec::new();
        for (k, o) in c.outputs.into_iter().enumerate() {
            if o.staged == 0 {
                outputs.push((o.arg_index, o.data));
            } else if o.data.is_empty() {
                held.push((o.arg_index, o.staged));
            } else {
                return Err(ConvertError::new(
                    format!("outputs[{k}]"),
                    "names held bytes and carries bytes too",
                ));
            }
        }
        Ok(TaskCompletion {
            id: TaskId(c.task_id),
            outcome,
            lane: c.lane,
            queued_ns: timing.queued_ns,
            busy_ns: timing.busy_ns,
            kernel_ns: timing.kernel_ns,
            staged_in: c.staged_in,
            staged_out: c.staged_out,
            copy_in_ns: timing.copy_in_ns,
            copy_out_ns: timing.copy_out_ns,
            cache: c.cache.map(CacheCounters::from).unwrap_or_default(),
            outputs,
            held,
        })
    }
}

impl From<TaskCompletion> for pb::Completion {
    fn from(c: TaskCompletion) -> Self {
        let (outcome, cause, kind) = match c.outcome {
            TaskOutcome::Success => (pb::Outcome::Success, String::new(), 0),
            TaskOutcome::Failure(cause) => {
                (pb::Outcome::TaskFailure, cause.message, cause.kind.code())
            }
            TaskOutcome::Resend(cause) => (pb::Outcome::Resend, cause, 0),
        };
        pb::Completion {
            task_id: c.id.0,
            outcome: outcome as i32,
            cause,
            kind,
            timing: Some(pb::Timing {
                queued_ns: c.queued_ns,
                busy_ns: c.busy_ns,
                kernel_ns: c.kernel_ns,
                copy_in_ns: c.copy_in_ns,
                copy_out_ns: c.copy_out_ns,
            }),
            cache: (c.cache != CacheCounters::default()).then(|| c.cache.into()),
            staged_in: c.staged_in,
            staged_out: c.staged_out,
            outputs: c
                .outputs
                .into_iter()
                .map(|(arg_index, data)| pb::InlineBytes {
                    arg_index,
                    data,
                    staged: 0,
                })
                .chain(
                    c.held
                        .into_iter()
                        .map(|(arg_index, staged)| pb::InlineBytes {
                            arg_index,
                            data: Bytes::new(),
                            staged,
                        }),
                )
                .collect(),
            lane: c.lane,
        }
    }
}

/// A worker's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerStats {
    /// Persistent region of the device arena.
    pub persistent: strata_wire::RegionStats,
    /// Run region.
    pub run: strata_wire::RegionStats,
    /// Scratch region.
    pub scratch: strata_wire::RegionStats,
    /// Bytes staged host → device for kernel arguments.
    pub staged_to_device: u64,
    /// Bytes staged device → host.
    pub staged_to_host: u64,
    /// Bytes of explicit copies to the device.
    pub copied_to_device: u64,
    /// Bytes of explicit copies from the device.
    pub copied_to_host: u64,
    /// Tasks that succeeded.
    pub tasks_succeeded: u64,
    /// Tasks that failed.
    pub tasks_failed: u64,
    /// Kernels that panicked.
    pub kernels_panicked: u64,
    /// Live imports.
    pub imports: u64,
    /// Open sessions.
    pub sessions: u64,
    /// Tasks started and not yet completed.
    pub tasks_in_flight: u64,
    /// Device bytes zeroed before anyone could see them.
    pub zeroed: u64,
    /// Bytes staged through page-locked staging buffers because their
    /// host memory could not be page-locked in place (a CUDA chip).
    pub bounced: u64,
    /// Bytes of live shared blocks (allocations of their own, outside the
    /// regions).
    pub shared: u64,
    /// The device cache.
    pub cache: CacheCounters,
}

/// A worker's device cache counters (`strata_chip_runtime::CacheStats`, by value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheCounters {
    /// Arguments whose bytes were on the chip at the version asked.
    pub hits: u64,
    /// Their bytes (what copying them in would have moved).
    pub hit_bytes: u64,
    /// Arguments read from host memory because the chip lacked them.
    pub misses: u64,
    /// Bytes copied host → device into cached copies.
    pub loaded: u64,
    /// Bytes copied device → host from cached copies.
    pub written_back: u64,
    /// Dirty copies written back by a flush or an eviction.
    pub write_backs: u64,
    /// Copies evicted to make room.
    pub evictions: u64,
    /// Bytes copied on the chip into blocks writing kernels work on.
    pub device_to_device: u64,
    /// Arguments staged uncached for want of room.
    pub bypassed: u64,
    /// Copies held now.
    pub entries: u64,
    /// Their bytes.
    pub held: u64,
    /// Bytes of dirty copies held now.
    pub dirty: u64,
    /// Of `loaded`, bytes copied in ahead of their task (prefetch).
    pub prefetched: u64,
}

impl From<pb::CacheCounters> for CacheCounters {
    fn from(c: pb::CacheCounters) -> Self {
        CacheCounters {
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
}

impl From<CacheCounters> for pb::CacheCounters {
    fn from(c: CacheCounters) -> Self {
        pb::CacheCounters {
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
}

fn region_stats(
    field: &str,
    r: Option<pb::RegionStats>,
) -> Result<strata_wire::RegionStats, ConvertError> {
    let r = r.ok_or_else(|| ConvertError::new(field, "missing"))?;
    if r.in_use > r.capacity || r.peak > r.capacity {
        return Err(ConvertError::new(
            field,
            format!(
                "in use {} / peak {} exceed capacity {}",
                r.in_use, r.peak, r.capacity
            ),
        ));
    }
    Ok(strata_wire::RegionStats {
        capacity: r.capacity,
        in_use: r.in_use,
        peak: r.peak,
        allocs: r.allocs,
        frees: r.frees,
        failed: r.failed,
    })
}

impl TryFrom<pb::StatsReply> for WorkerStats {
    type Error = ConvertError;

    fn try_from(s: pb::StatsReply) -> Result<Self, ConvertError> {
        Ok(WorkerStats {
            persistent: region_stats("persistent", s.persistent)?,
            run: region_stats("run", s.run)?,
            scratch: region_stats("scratch", s.scratch)?,
            staged_to_device: s.staged_to_device,
            staged_to_host: s.staged_to_host,
            copied_to_device: s.copied_to_device,
            copied_to_host: s.copied_to_host,
            tasks_succeeded: s.tasks_succeeded,
            tasks_failed: s.tasks_failed,
            kernels_panicked: s.kernels_panicked,
            imports: s.imports,
            sessions: s.sessions,
            tasks_in_flight: s.tasks_in_flight,
            zeroed: s.zeroed,
            bounced: s.bounced,
            shared: s.shared,
            cache: s.cache.map(CacheCounters::from).unwrap_or_default(),
        })
    }
}

impl From<WorkerStats> for pb::StatsReply {
    fn from(s: WorkerStats) -> Self {
        let region = |r: strata_wire::RegionStats| pb::RegionStats {
            capacity: r.capacity,
            in_use: r.in_use,
            peak: r.peak,
            allocs: r.allocs,
            frees: r.frees,
            failed: r.failed,
        };
        pb::StatsReply {
            persistent: Some(region(s.persistent)),
            run: Some(region(s.run)),
            scratch: Some(region(s.scratch)),
            staged_to_device: s.staged_to_device,
            staged_to_host: s.staged_to_host,
            copied_to_device: s.copied_to_device,
            copied_to_host: s.copied_to_host,
            tasks_succeeded: s.tasks_succeeded,
            tasks_failed: s.tasks_failed,
            kernels_panicked: s.kernels_panicked,
            imports: s.imports,
            sessions: s.sessions,
            tasks_in_flight: s.tasks_in_flight,
            zeroed: s.zeroed,
            bounced: s.bounced,
            shared: s.shared,
            cache: Some(s.cache.into()),
        }
    }
}

/// One health beat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthBeat {
    /// 1, 2, 3, ... per stream.
    pub seq: u64,
    /// Tasks the worker is running.
    pub tasks_in_flight: u64,
    /// Milliseconds since the worker started.
    pub uptime_ms: u64,
}

impl From<pb::HealthBeat> for HealthBeat {
    fn from(b: pb::HealthBeat) -> Self {
        HealthBeat {
            seq: b.seq,
            tasks_in_flight: b.tasks_in_flight,
            uptime_ms: b.uptime_ms,
        }
    }
}

/// The `instance` field of a handshake reply.
///
/// # Errors
/// Zero, which no worker draws.
pub fn instance(field: &str, id: u64) -> Result<InstanceId, ConvertError> {
    if id == 0 {
        return Err(ConvertError::new(
            field,
            "zero: a worker's instance is nonzero (is the worker older than this client?)",
        ));
    }
    Ok(InstanceId(id))
}

/// A worker's offer of a data connection (`HandshakeReply.data_port` and
/// `data_secret`): `None` when port is 0 (not offered).
///
/// # Errors
/// A port past 65535, or a secret that is not
/// [`SECRET_BYTES`](crate::bulk::SECRET_BYTES) long when a port is given.
pub fn data_offer(port: u32, secret: &[u8]) -> Result<Option<DataOffer>, ConvertError> {
    if port == 0 {
        return Ok(None);
    }
    let port = u16::try_from(port)
        .map_err(|_| ConvertError::new("data_port", format!("{port} is not a TCP port")))?;
    let secret: [u8; crate::bulk::SECRET_BYTES] = secret.try_into().map_err(|_| {
        ConvertError::new(
            "data_secret",
            format!(
                "{} bytes (a data port needs a {}-byte secret)",
                secret.len(),
                crate::bulk::SECRET_BYTES
            ),
        )
    })?;
    Ok(Some(DataOffer {
        port,
        secret: DataSecret(secret),
    }))
}

/// A worker's data connection: its port (on the gRPC connection's
/// address) and the session's secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataOffer {
    /// The TCP port.
    pub port: u16,
    /// What a data connection presents to prove the session.
    pub secret: DataSecret,
}

/// A session's data-connection secret; its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct DataSecret(pub [u8; crate::bulk::SECRET_BYTES]);

impl std::fmt::Debug for DataSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataSecret(..)")
    }
}

/// What a worker knows of one session (the `SessionState` call, and a
/// handshake's report on the session it superseded).
///
/// Only `known && ended && running == 0` ([`SessionState::is_fenced`])
/// proves anything: that no task of the session can touch memory again.
/// An unknown session (never issued, its tombstone forgotten, or asked of
/// another process) proves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionState {
    /// The worker has a record of it: live, or ended recently.
    pub known: bool,
    /// It has ended; none of its tasks will start any more.
    pub ended: bool,
    /// Its tasks received and not yet completed, queued or running.
    pub running: u32,
}

impl SessionState {
    /// A session the worker has no record of.
    pub const UNKNOWN: SessionState = SessionState {
        known: false,
        ended: false,
        running: 0,
    };

    /// Whether the session has ended and none of its tasks is left: none
    /// can write any more.
    pub fn is_fenced(&self) -> bool {
        self.known && self.ended && self.running == 0
    }

    fn checked(prefix: &str, known: bool, ended: bool, running: u32) -> Result<Self, ConvertError> {
        if !known && ended {
            return Err(ConvertError::new(
                format!("{prefix}ended"),
                "true for a session the worker does not know",
            ));
        }
        if !known && running != 0 {
            return Err(ConvertError::new(
                format!("{prefix}running"),
                format!("{running} tasks of a session the worker does not know"),
            ));
        }
        Ok(SessionState {
            known,
            ended,
            running,
        })
    }
}

impl TryFrom<pb::SessionStateReply> for SessionState {
    type Error = ConvertError;

    fn try_from(r: pb::SessionStateReply) -> Result<Self, ConvertError> {
        SessionState::checked("", r.known, r.ended, r.running)
    }
}

impl From<SessionState> for pb::SessionStateReply {
    fn from(s: SessionState) -> Self {
        pb::SessionStateReply {
            known: s.known,
            ended: s.ended,
            running: s.running,
        }
    }
}

/// The `previous` field of a handshake reply: present exactly when the
/// request named a previous session (`asked`).
///
/// # Errors
/// Missing when asked (a worker that does not fence), present when not,
/// or inconsistent.
pub fn previous_session(
    asked: bool,
    p: Option<pb::PreviousSession>,
) -> Result<Option<SessionState>, ConvertError> {
    match (asked, p) {
        (false, None) => Ok(None),
        (false, Some(_)) => Err(ConvertError::new(
            "previous",
            "present, but the handshake named no previous session",
        )),
        (true, None) => Err(ConvertError::new(
            "previous",
            "missing: the worker did not report the previous session",
        )),
        (true, Some(p)) => {
            SessionState::checked("previous.", p.known, p.ended, p.running).map(Some)
        }
    }
}

impl From<SessionState> for pb::PreviousSession {
    fn from(s: SessionState) -> Self {
        pb::PreviousSession {
            known: s.known,
            ended: s.ended,
            running: s.running,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_wire::check::test_buffer;
    use strata_wire::{DType, Tensor};

    fn task() -> pb::Task {
        let t = Tensor::new(test_buffer(256), 0, &[4, 4], &[16, 2], DType::U8).unwrap();
        let req = TaskRequest {
            id: TaskId(1),
            callable: KernelHandle([2; 16]),
            args: TaskArgs::new(vec![t, t], vec![3]).unwrap(),
            tags: vec![ArgTag::Input, ArgTag::Output],
            inline: vec![Some(Bytes::from(vec![0; 16])), None],
            staged: Vec::new(),
            cache: Vec::new(),
            required_features: Features::NONE,
            priority: 0,
        };
        (&req).into()
    }

    /// Cache entries travel both ways; one past the tensors, or a second
    /// for the same argument, is refused naming the entry.
    #[test]
    fn cache_entries_round_trip_and_are_checked() {
        let mut t = task();
        let c = |arg_index, version| pb::CacheArg {
            arg_index,
            version,
            written: 9,
            deferred: true,
            held: false,
        };
        t.cache = vec![c(1, 4), c(0, 3)];
        let req = TaskRequest::try_from(t.clone()).unwrap();
        assert_eq!(
            req.cache[0],
            CacheArg {
                index: 1,
                version: 4,
                written: 9,
                deferred: true,
                held: false,
            }
        );
        assert_eq!(pb::Task::from(&req).cache, t.cache);
        let err = |cache| {
            let e = TaskRequest::try_from(pb::Task { cache, ..t.clone() }).unwrap_err();
            (e.field, e.reason)
        };
        let (field, reason) = err(vec![c(0, 1), c(2, 1)]);
        assert_eq!(field, "cache[1]");
        assert!(reason.contains("past the 2 tensors"), "{reason}");
        let (field, reason) = err(vec![c(1, 1), c(1, 2)]);
        assert_eq!(field, "cache[1]");
        assert!(reason.contains("two cache entries"), "{reason}");
        // Held: only for an argument without bytes that the task reads.
        let held = |arg_index| pb::CacheArg {
            held: true,
            ..c(arg_index, 1)
        };
        let (field, reason) = err(vec![held(0)]);
        assert_eq!(field, "cache[0]");
        assert!(reason.contains("carries bytes too"), "{reason}");
        let (field, reason) = err(vec![held(1)]);
        assert_eq!(field, "cache[0]");
        assert!(reason.contains("OUTPUT"), "{reason}");
        let mut input = t.clone();
        input.tags = vec![ArgTag::Input.code(), ArgTag::Input.code()];
        input.cache = vec![held(1)];
        let req = TaskRequest::try_from(input.clone()).unwrap();
        assert!(req.cache[0].held);
        assert_eq!(pb::Task::from(&req).cache, input.cache);
    }

    #[test]
    fn every_task_field_is_checked() {
        let ok = task();
        assert!(TaskRequest::try_from(ok.clone()).is_ok());
        let field = |t: pb::Task| TaskRequest::try_from(t).unwrap_err().field;
        assert_eq!(
            field(pb::Task {
                callable: vec![1; 15],
                ..ok.clone()
            }),
            "callable"
        );
        assert_eq!(
            field(pb::Task {
                args: vec![1, 2, 3],
                ..ok.clone()
            }),
            "args"
        );
        assert_eq!(
            field(pb::Task {
                tags: vec![0],
                ..ok.clone()
            }),
            "tags"
        );
        assert_eq!(
            field(pb::Task {
                tags: vec![0, 7],
                ..ok.clone()
            }),
            "tags[1]"
        );
        let inline = |i: u32, n: usize| {
            vec![pb::InlineBytes {
                arg_index: i,
                data: Bytes::from(vec![0; n]),
                staged: 0,
            }]
        };
        assert_eq!(
            field(pb::Task {
                inline_inputs: inline(2, 16),
                ..ok.clone()
            }),
            "inline_inputs[0]"
        );
        assert_eq!(
            field(pb::Task {
                inline_inputs: inline(0, 15),
                ..ok.clone()
            }),
            "inline_inputs[0]"
        );
        let twice = [inline(1, 16), inline(1, 16)].concat();
        assert_eq!(
            field(pb::Task {
                inline_inputs: twice,
                ..ok
            }),
            "inline_inputs[1]"
        );
    }

    #[test]
    fn staged_references_round_trip_and_resolve_checked() {
        let t = Tensor::new(test_buffer(256), 0, &[4, 4], &[16, 2], DType::U8).unwrap();
        let req = TaskRequest {
            id: TaskId(1),
            callable: KernelHandle([2; 16]),
            args: TaskArgs::new(vec![t, t], vec![3]).unwrap(),
            tags: vec![ArgTag::Input, ArgTag::Output],
            inline: vec![None, None],
            staged: vec![(0, 77)],
            cache: Vec::new(),
            required_features: Features::NONE,
            priority: 0,
        };
        let wire: pb::Task = (&req).into();
        assert_eq!(wire.inline_inputs.len(), 1);
        assert_eq!(wire.inline_inputs[0].staged, 77);
        let back = TaskRequest::try_from(wire.clone()).unwrap();
        assert_eq!(back, req);

        // Resolved from the session's table: the bytes, checked.
        let mut ok = back.clone();
        ok.resolve_staged(|id| (id == 77).then(|| Bytes::from(vec![5; 16])))
            .unwrap();
        assert_eq!(ok.inline[0].as_deref(), Some(&[5u8; 16][..]));
        assert!(ok.staged.is_empty());
        let mut unknown = back.clone();
        let e = unknown.resolve_staged(|_| None).unwrap_err();
        assert_eq!(e.field, "staged argument 0");
        assert!(e.reason.contains("no staged bytes 77"), "{e}");
        let mut short = back;
        let e = short
            .resolve_staged(|_| Some(Bytes::from(vec![5; 15])))
            .unwrap_err();
        assert!(e.reason.contains("15 staged bytes"), "{e}");

        // A reference that also carries bytes, or names an argument twice.
        let mut both = wire.clone();
        both.inline_inputs[0].data = Bytes::from(vec![0; 16]);
        assert_eq!(
            TaskRequest::try_from(both).unwrap_err().field,
            "inline_inputs[0]"
        );
        let mut twice = wire;
        twice.inline_inputs.push(pb::InlineBytes {
            arg_index: 0,
            data: Bytes::from(vec![0; 16]),
            staged: 0,
        });
        assert_eq!(
            TaskRequest::try_from(twice).unwrap_err().field,
            "inline_inputs[1]"
        );
    }

    #[test]
    fn a_held_output_carries_no_bytes() {
        let c = TaskCompletion::bare(TaskId(3), TaskOutcome::Success);
        let mut p: pb::Completion = c.into();
        p.outputs.push(pb::InlineBytes {
            arg_index: 0,
            data: Bytes::from_static(&[1]),
            staged: 4,
        });
        assert_eq!(TaskCompletion::try_from(p).unwrap_err().field, "outputs[0]");
    }

    #[test]
    fn a_handshake_callable_is_checked_against_its_signature() {
        let sig: strata_boundary::Signature = "scale@1(x:R:F32:*,y:W:=0:=0;a:f64)".parse().unwrap();
        let offer = CallableOffer::of(sig);
        let p = pb::Callable::from(&offer);
        assert_eq!(callable(0, p.clone()).unwrap(), offer);
        let field = |p: pb::Callable| callable(3, p).unwrap_err().field;
        assert_eq!(
            field(pb::Callable {
                handle: vec![1; 15],
                ..p.clone()
            }),
            "callables[3].handle"
        );
        assert_eq!(
            field(pb::Callable {
                handle: vec![1; 16],
                ..p.clone()
            }),
            "callables[3]"
        );
        assert_eq!(
            field(pb::Callable {
                version: 2,
                ..p.clone()
            }),
            "callables[3]"
        );
        assert_eq!(
            field(pb::Callable {
                signature: "scale@1(x:R".into(),
                ..p
            }),
            "callables[3]"
        );
    }

    #[test]
    fn completions_round_trip_and_are_checked() {
        let c = TaskCompletion {
            id: TaskId(9),
            outcome: TaskOutcome::Failure(FailureCause::new(FailureKind::Kernel, "boom")),
            lane: 1,
            queued_ns: 2,
            busy_ns: 3,
            kernel_ns: 4,
            staged_in: 5,
            staged_out: 6,
            copy_in_ns: 7,
            copy_out_ns: 8,
            cache: CacheCounters {
                hits: 2,
                loaded: 64,
                evictions: 1,
                ..CacheCounters::default()
            },
            outputs: vec![(0, Bytes::from_static(&[1, 2]))],
            held: vec![(1, 5)],
        };
        let p: pb::Completion = c.clone().into();
        assert_eq!(TaskCompletion::try_from(p.clone()).unwrap(), c);
        // A kind this side does not know, or none (an older worker), is
        // OTHER; the words stay.
        for kind in [0, 99] {
            let Ok(TaskCompletion {
                outcome: TaskOutcome::Failure(cause),
                ..
            }) = TaskCompletion::try_from(pb::Completion { kind, ..p.clone() })
            else {
                panic!("kind {kind}: not a failure")
            };
            assert_eq!(cause, FailureCause::new(FailureKind::Other, "boom"));
        }
        let field = |p: pb::Completion| TaskCompletion::try_from(p).unwrap_err().field;
        assert_eq!(
            field(pb::Completion {
                cause: String::new(),
                ..p.clone()
            }),
            "cause"
        );
        assert_eq!(
            field(pb::Completion {
                outcome: 0,
                ..p.clone()
            }),
            "outcome"
        );
        assert_eq!(
            field(pb::Completion {
                outcome: pb::Outcome::Success as i32,
                ..p
            }),
            "cause"
        );
        assert_eq!(region("region", 4).unwrap_err().field, "region");
        assert_eq!(region("region", 3), Ok(Region::Shared));
        assert_eq!(region("region", 1), Ok(Region::Persistent));
        let end = RunEnd {
            retired: 2,
            run: 3,
            reset: true,
        };
        assert_eq!(RunEnd::try_from(pb::EndRunReply::from(end)), Ok(end));
        let zero = pb::EndRunReply {
            run: 0,
            ..pb::EndRunReply::from(end)
        };
        assert_eq!(RunEnd::try_from(zero).unwrap_err().field, "run");
        assert_eq!(handle("h", &[0; 3]).unwrap_err().field, "h");
        assert_eq!(
            identity("identity", &[0; 32]).unwrap_err().field,
            "identity"
        );
    }

    #[test]
    fn session_states_are_checked_field_by_field() {
        let ok = |known, ended, running| pb::SessionStateReply {
            known,
            ended,
            running,
        };
        for s in [
            SessionState::UNKNOWN,
            SessionState {
                known: true,
                ended: false,
                running: 3,
            },
            SessionState {
                known: true,
                ended: true,
                running: 0,
            },
        ] {
            assert_eq!(
                SessionState::try_from(pb::SessionStateReply::from(s)),
                Ok(s)
            );
            assert_eq!(
                previous_session(true, Some(pb::PreviousSession::from(s))),
                Ok(Some(s))
            );
        }
        let field = |r: pb::SessionStateReply| SessionState::try_from(r).unwrap_err().field;
        assert_eq!(field(ok(false, true, 0)), "ended");
        assert_eq!(field(ok(false, false, 2)), "running");
        let prev = |known, ended, running| {
            previous_session(
                true,
                Some(pb::PreviousSession {
                    known,
                    ended,
                    running,
                }),
            )
            .unwrap_err()
            .field
        };
        assert_eq!(prev(false, true, 0), "previous.ended");
        assert_eq!(prev(false, false, 1), "previous.running");
        assert_eq!(previous_session(false, None), Ok(None));
        let missing = previous_session(true, None).unwrap_err();
        assert_eq!(missing.field, "previous");
        assert!(missing.reason.starts_with("missing"), "{missing}");
        let unasked = previous_session(false, Some(pb::PreviousSession::default()));
        assert_eq!(unasked.unwrap_err().field, "previous");
    }

    #[test]
    fn fenced_means_known_ended_and_nothing_running() {
        let s = |known, ended, running| SessionState {
            known,
            ended,
            running,
        };
        assert!(s(true, true, 0).is_fenced());
        assert!(!s(true, true, 1).is_fenced());
        assert!(!s(true, false, 0).is_fenced());
        assert!(!SessionState::UNKNOWN.is_fenced());
    }

    #[test]
    fn a_zero_instance_is_refused() {
        assert_eq!(instance("instance", 0).unwrap_err().field, "instance");
        assert_eq!(instance("instance", 9), Ok(InstanceId(9)));
        assert_eq!(InstanceId(0xab).to_string(), "instance 00000000000000ab");
    }

    fn facts() -> WorkerFacts {
        let sig: strata_boundary::Signature = "scale@1(x:R:F32:*,y:W:=0:=0;a:f64)".parse().unwrap();
        WorkerFacts {
            chip_id: 3,
            device_kind: "sim".into(),
            device_spec: "sim:mem=1MiB".into(),
            device_memory: 1 << 20,
            lanes: 2,
            callables: vec![CallableOffer::of(sig)],
            no_body: vec!["potrf@1".into(), "potrf@2".into(), "stencil@1".into()],
            capabilities: Capabilities {
                backends: BackendKinds::of([BackendKind::Memfd, BackendKind::DeviceMalloc]),
                dtypes: DTypeSet::of([DType::F32, DType::C128]),
                features: Features::RING | Features::HOST_BYTES,
            },
            required_features: Features::NONE,
            instance: InstanceId(7),
        }
    }

    /// What a worker states in its handshake reads back the same: codes in
    /// code order, one byte each, the feature masks as they are.
    #[test]
    fn a_handshake_states_capabilities_that_read_back_the_same() {
        let f = facts();
        let mut reply = handshake_facts(&f);
        assert_eq!(reply.backend_kinds, vec![4, 6]);
        assert_eq!(reply.dtypes, vec![0, 66]);
        assert_eq!(reply.features, 0b1001);
        assert_eq!(worker_facts(&mut reply).unwrap(), f);
        // A newer worker's codes and feature bits: unknown codes are left
        // out, unknown offered features kept.
        let mut newer = handshake_facts(&f);
        newer.dtypes.push(200);
        newer.backend_kinds.push(31);
        newer.features |= 1 << 50;
        let read = worker_facts(&mut newer).unwrap();
        assert_eq!(read.capabilities.dtypes, f.capabilities.dtypes);
        assert_eq!(read.capabilities.backends, f.capabilities.backends);
        assert_eq!(
            read.capabilities.features.to_string(),
            "RING|HOST_BYTES|bit 50"
        );
    }

    /// A worker that requires a feature this build does not know is
    /// refused, naming the bits; a code listed twice and a DATA_PORT bit
    /// that disagrees with the port are refused naming their field.
    #[test]
    fn a_handshake_requiring_an_unknown_feature_or_malformed_is_refused() {
        let f = facts();
        let refused = |edit: &dyn Fn(&mut pb::HandshakeReply)| {
            let mut r = handshake_facts(&f);
            edit(&mut r);
            worker_facts(&mut r).unwrap_err()
        };
        let e = refused(&|r| r.required_features = 1 << 40 | 1 << 63 | 1);
        assert_eq!(e.field, "required_features");
        assert_eq!(
            e.to_string(),
            "required_features: the worker requires features this driver does not know: bit 40|bit 63 (mask 0x8000010000000000); use a driver that understands them"
        );
        // Known required bits are fine: this build understands them.
        let mut known = handshake_facts(&f);
        known.required_features = Features::RING.bits();
        assert_eq!(
            worker_facts(&mut known).unwrap().required_features,
            Features::RING
        );
        let e = refused(&|r| r.dtypes = vec![0, 66, 0]);
        assert_eq!(
            (e.field.as_str(), e.to_string().as_str()),
            ("dtypes[2]", "dtypes[2]: code 0 is listed twice")
        );
        let e = refused(&|r| r.backend_kinds = vec![6, 6]);
        assert_eq!(e.field, "backend_kinds[1]");
        let e = refused(&|r| r.data_port = 9000);
        assert_eq!(e.field, "features");
        assert!(
            e.to_string().contains("disagrees with data_port 9000"),
            "{e}"
        );
        // `no_body`: name@version, in order, each once, none offered.
        let e = refused(&|r| r.no_body = vec!["potrf".into()]);
        assert_eq!(e.to_string(), "no_body[0]: \"potrf\" is not name@version");
        let e = refused(&|r| r.no_body = vec!["@1".into()]);
        assert_eq!(e.field, "no_body[0]");
        let e = refused(&|r| r.no_body = vec!["potrf@2".into(), "potrf@1".into()]);
        assert_eq!(
            e.to_string(),
            "no_body[1]: \"potrf@1\" is out of order or listed twice"
        );
        let e = refused(&|r| r.no_body = vec!["a@1".into(), "a@1".into()]);
        assert_eq!(e.field, "no_body[1]");
        let e = refused(&|r| r.no_body = vec!["scale@1".into()]);
        assert_eq!(
            e.to_string(),
            "no_body[0]: \"scale@1\" is also offered in callables"
        );
        let e = refused(&|r| r.features |= Features::DATA_PORT.bits());
        assert!(e.to_string().contains("disagrees with data_port 0"), "{e}");
    }

    #[test]
    fn a_task_carries_its_required_features_unknown_bits_included() {
        let mut t = task();
        t.required_features = Features::DEVICE_CACHE.bits() | 1 << 33;
        let req = TaskRequest::try_from(t.clone()).unwrap();
        assert_eq!(req.required_features.bits(), t.required_features);
        assert_eq!(pb::Task::from(&req).required_features, t.required_features);
    }
}
