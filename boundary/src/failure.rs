//! Why a task did not succeed.

use std::fmt;

/// What kind of failure ended a task: the part of its cause a program
/// matches on. New kinds may be added; a peer that names a kind this side
/// does not know, or none, gives [`FailureKind::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FailureKind {
    /// The kernel ran and reported an error (a matrix that is not
    /// positive definite, a kernel that panicked).
    Kernel,
    /// The worker refused the task's arguments before running it: a
    /// buffer it could not import or find in the session (a descriptor,
    /// file descriptor or mapping that failed its checks, a device buffer
    /// not allocated), a view its grant or its kernel's signature does
    /// not allow.
    ImportRefused,
    /// The task itself was refused before it ran: a request that fails
    /// the worker's checks (a malformed record, staged bytes the worker
    /// does not have), a callable or version it does not have, a session
    /// that had ended, a task the driver could not send.
    Refused,
    /// The chip could not run it: device memory or staging failed.
    Device,
    /// It ran past its timeout (its worker is then treated as lost: a
    /// kernel cannot be trusted to stop).
    TimedOut,
    /// It writes bytes quarantined by a task that was lost without a
    /// fence and may still write them.
    Quarantined,
    /// Its worker died, hung or was cut off while it ran or waited there.
    WorkerLost,
    /// The driver cancelled it before it started.
    Cancelled,
    /// It did not run, because a task it depends on failed.
    Skipped,
    /// A failure that fits none of the kinds above, or one a peer did
    /// not classify.
    Other,
    /// The worker lacks what the task needs: a feature the task requires
    /// that the worker does not know or offer, a dtype its chip does not
    /// support, an argument backed by a kind of buffer it does not take
    /// ([`crate::Capabilities`]). A driver refuses such a task when it is
    /// submitted; a worker refuses it too, should one arrive.
    Unsupported,
}

impl FailureKind {
    /// Every kind, in declaration order.
    pub const ALL: [FailureKind; 11] = [
        FailureKind::Kernel,
        FailureKind::ImportRefused,
        FailureKind::Refused,
        FailureKind::Device,
        FailureKind::TimedOut,
        FailureKind::Quarantined,
        FailureKind::WorkerLost,
        FailureKind::Cancelled,
        FailureKind::Skipped,
        FailureKind::Other,
        FailureKind::Unsupported,
    ];

    /// Its name in text: `kernel`, `import_refused`, `refused`, `device`,
    /// `timed_out`, `quarantined`, `worker_lost`, `cancelled`, `skipped`,
    /// `other` or `unsupported` (Python's `FailureKind` members are these, upper-cased).
    pub const fn name(self) -> &'static str {
        match self {
            FailureKind::Kernel => "kernel",
            FailureKind::ImportRefused => "import_refused",
            FailureKind::Refused => "refused",
            FailureKind::Device => "device",
            FailureKind::TimedOut => "timed_out",
            FailureKind::Quarantined => "quarantined",
            FailureKind::WorkerLost => "worker_lost",
            FailureKind::Cancelled => "cancelled",
            FailureKind::Skipped => "skipped",
            FailureKind::Other => "other",
            FailureKind::Unsupported => "unsupported",
        }
    }

    /// The kind a name gives ([`FailureKind::name`]'s inverse).
    pub fn from_name(name: &str) -> Option<FailureKind> {
        FailureKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Its number on the wire (the worker protocol's `FailureKind`): 0 is
    /// "not said".
    pub const fn code(self) -> i32 {
        match self {
            FailureKind::Kernel => 1,
            FailureKind::ImportRefused => 2,
            FailureKind::Refused => 3,
            FailureKind::Device => 4,
            FailureKind::TimedOut => 5,
            FailureKind::Quarantined => 6,
            FailureKind::WorkerLost => 7,
            FailureKind::Cancelled => 8,
            FailureKind::Skipped => 9,
            FailureKind::Other => 10,
            FailureKind::Unsupported => 11,
        }
    }

    /// The kind a wire number gives: [`FailureKind::Other`] for 0 (an
    /// older peer says none) and for numbers this side does not know.
    pub fn from_code(code: i32) -> FailureKind {
        FailureKind::ALL
            .into_iter()
            .find(|k| k.code() == code)
            .unwrap_or(FailureKind::Other)
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a task failed: its kind, and what happened in words.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FailureCause {
    /// What a program matches on.
    pub kind: FailureKind,
    /// What a person reads: the kernel's error, the refusal's reason.
    pub message: String,
}

impl FailureCause {
    /// A cause of `kind` saying `message`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        FailureCause {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip_for_every_kind() {
        let mut codes = std::collections::HashSet::new();
        for k in FailureKind::ALL {
            assert_eq!(FailureKind::from_name(k.name()), Some(k));
            assert_eq!(FailureKind::from_code(k.code()), k);
            assert!(codes.insert(k.code()), "{k}: code used twice");
            assert_ne!(k.code(), 0, "{k}: 0 means not said");
        }
        assert_eq!(FailureKind::from_name("Kernel"), None);
    }

    #[test]
    fn an_unknown_or_missing_code_is_other() {
        assert_eq!(FailureKind::from_code(0), FailureKind::Other);
        assert_eq!(FailureKind::from_code(999), FailureKind::Other);
        assert_eq!(FailureKind::from_code(-1), FailureKind::Other);
    }
}
