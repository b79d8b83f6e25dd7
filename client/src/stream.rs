//! The streams of a session: task batches down, completions and health
//! beats up.

use strata_proto::convert::{HealthBeat, TaskCompletion, TaskRequest};
use strata_proto::pb;
use tokio::sync::mpsc;
use tonic::Streaming;

use crate::ClientError;

/// A worker's health beats.
#[derive(Debug)]
pub struct HealthWatch {
    pub(crate) beats: Streaming<pb::HealthBeat>,
}

impl HealthWatch {
    /// The next beat; `None` when the worker ended the stream (shutdown).
    ///
    /// # Errors
    /// A broken stream.
    ///
    /// # Cancel safety
    /// Cancel safe: a beat is taken off the stream only when this returns
    /// it, so a dropped call loses none (a timeout around it is the
    /// intended use) and the watch stays usable.
    pub async fn next(&mut self) -> Result<Option<HealthBeat>, ClientError> {
        Ok(self.beats.message().await?.map(HealthBeat::from))
    }
}

/// The two halves of a session's task stream.
#[derive(Debug)]
pub struct TaskStream {
    pub(crate) tx: Option<mpsc::Sender<pb::TaskBatch>>,
    pub(crate) completions: Streaming<pb::CompletionBatch>,
}

impl TaskStream {
    /// Sends one batch of tasks.
    ///
    /// # Errors
    /// When the stream is closed.
    ///
    /// # Cancel safety
    /// A batch is queued whole or not at all, never half-sent: dropping
    /// the call before it completes (it waits while the stream's queue of
    /// 64 batches is full) sends none of `tasks`, which the caller still
    /// holds and may send again. The stream stays usable.
    pub async fn send(&self, tasks: &[TaskRequest]) -> Result<(), ClientError> {
        send_batch(self.tx.as_ref(), batch_of(tasks)).await
    }

    /// Sends a batch as given, unchecked (tests send malformed tasks).
    ///
    /// # Errors
    /// When the stream is closed.
    ///
    /// # Cancel safety
    /// As [`TaskStream::send`], except that the batch was moved in: a
    /// dropped call sends none of it and the batch is lost.
    pub async fn send_raw(&self, batch: pb::TaskBatch) -> Result<(), ClientError> {
        send_batch(self.tx.as_ref(), batch).await
    }

    /// Closes our sending half: the worker finishes what it has, streams the
    /// completions, and ends the stream (and the session).
    pub fn close(&mut self) {
        self.tx = None;
    }

    /// Splits the stream into its sending half and its completions, so that
    /// one task can send while another reads.
    pub fn split(self) -> (TaskSender, Completions) {
        (
            TaskSender { tx: self.tx },
            Completions {
                completions: self.completions,
            },
        )
    }

    /// The next batch of completions; `None` when the worker ended the stream.
    ///
    /// # Errors
    /// A broken stream or a malformed completion.
    ///
    /// # Cancel safety
    /// Cancel safe: a batch is taken off the stream only when this returns
    /// it, so a dropped call loses no completion; the next call gets it.
    pub async fn next(&mut self) -> Result<Option<Vec<TaskCompletion>>, ClientError> {
        next_batch(&mut self.completions).await
    }
}

/// The sending half of a split [`TaskStream`]; dropping it closes the
/// stream for sending (the worker then finishes and ends the session).
#[derive(Debug)]
pub struct TaskSender {
    tx: Option<mpsc::Sender<pb::TaskBatch>>,
}

impl TaskSender {
    /// Sends one batch of tasks.
    ///
    /// # Errors
    /// When the stream is closed.
    ///
    /// # Cancel safety
    /// As [`TaskStream::send`]: whole or not at all, and a dropped call
    /// sends none of `tasks`.
    pub async fn send(&self, tasks: &[TaskRequest]) -> Result<(), ClientError> {
        send_batch(self.tx.as_ref(), batch_of(tasks)).await
    }
}

/// The completions half of a split [`TaskStream`].
#[derive(Debug)]
pub struct Completions {
    completions: Streaming<pb::CompletionBatch>,
}

impl Completions {
    /// The next batch of completions; `None` when the worker ended the
    /// stream.
    ///
    /// # Errors
    /// A broken stream or a malformed completion.
    ///
    /// # Cancel safety
    /// As [`TaskStream::next`]: cancel safe, no completion is lost.
    pub async fn next(&mut self) -> Result<Option<Vec<TaskCompletion>>, ClientError> {
        next_batch(&mut self.completions).await
    }
}

fn batch_of(tasks: &[TaskRequest]) -> pb::TaskBatch {
    pb::TaskBatch {
        tasks: tasks.iter().map(pb::Task::from).collect(),
    }
}

// `mpsc::Sender::send` is what makes the senders cancel safe: it either
// queues the whole batch or, when dropped, queues nothing.
async fn send_batch(
    tx: Option<&mpsc::Sender<pb::TaskBatch>>,
    batch: pb::TaskBatch,
) -> Result<(), ClientError> {
    let closed = || ClientError::Protocol("the task stream is closed".into());
    tx.ok_or_else(closed)?
        .send(batch)
        .await
        .map_err(|_| closed())
}

// `Streaming::message` only yields a message it has fully decoded, and the
// conversion after it does not wait: nothing is lost to a dropped call.
async fn next_batch(
    completions: &mut Streaming<pb::CompletionBatch>,
) -> Result<Option<Vec<TaskCompletion>>, ClientError> {
    match completions.message().await? {
        None => Ok(None),
        Some(batch) => Ok(Some(
            batch
                .completions
                .into_iter()
                .map(TaskCompletion::try_from)
                .collect::<Result<_, _>>()?,
        )),
    }
}
