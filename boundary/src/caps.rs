//! What a worker can take, and what a task needs of it.
//!
//! A worker says in its handshake which kinds of buffer its task
//! arguments may be backed by ([`BackendKinds`]), which dtypes its chip
//! computes on ([`DTypeSet`]) and which protocol features it offers
//! ([`Features`]): together its [`Capabilities`]. A task needs some of each
//! (the kinds and dtypes of its arguments, the features it requires), in
//! the same type; the driver places it only where what it needs is
//! covered ([`Capabilities::covers`]) and refuses it when it is submitted
//! when no worker it may go to covers it.
//!
//! Kinds and dtypes travel as one-byte wire codes. A code this build does
//! not know (a newer peer's) cannot be held: this side never makes
//! arguments of it, so a set of what it knows loses nothing it can use.
//! Feature bits travel as they are: an unknown one is kept, named `bit N`,
//! so that a worker may require of its drivers a feature they do not know
//! and be refused by name.

use std::fmt;

use strata_wire::{BackendKind, DType};

/// Named feature bits of the worker protocol: what a worker offers
/// (`HandshakeReply.features`), what a driver must understand to use it
/// (`HandshakeReply.required_features`), and what a task needs
/// (`Task.required_features`). Unknown bits are kept.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Features(u64);

impl Features {
    /// No feature.
    pub const NONE: Features = Features(0);
    /// The worker takes a shared-memory ring for a session's tasks and
    /// completions, sent over its fd channel (a worker on a Unix socket
    /// that was not started with `--no-ring`).
    pub const RING: Features = Features(1);
    /// The worker offers a data connection beside gRPC for large view
    /// bytes (`HandshakeReply.data_port`: a TCP worker without TLS that was
    /// not started with `--no-data-port`).
    pub const DATA_PORT: Features = Features(1 << 1);
    /// The worker's chip keeps device copies of host bytes between tasks
    /// (a staged chip): it honours a task's cache entries (versions, held
    /// bytes, deferred write-back) and `Flush`. A chip without one reads
    /// host memory in place.
    pub const DEVICE_CACHE: Features = Features(1 << 2);
    /// A HOST argument's bytes may travel with its task (inline, or staged
    /// ahead and fetched back after it), whatever its descriptor's kind:
    /// how a worker without the driver's memory (over TCP) takes host
    /// buffers.
    pub const HOST_BYTES: Features = Features(1 << 3);

    /// Every feature this build knows, with its name.
    pub const NAMED: [(Features, &'static str); 4] = [
        (Features::RING, "RING"),
        (Features::DATA_PORT, "DATA_PORT"),
        (Features::DEVICE_CACHE, "DEVICE_CACHE"),
        (Features::HOST_BYTES, "HOST_BYTES"),
    ];

    /// The bits this build knows.
    pub const KNOWN: Features = Features(
        Features::RING.0
            | Features::DATA_PORT.0
            | Features::DEVICE_CACHE.0
            | Features::HOST_BYTES.0,
    );

    /// The features of mask `bits`, unknown bits included.
    pub const fn from_bits(bits: u64) -> Features {
        Features(bits)
    }

    /// The mask, unknown bits included.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Whether every feature of `other` is here.
    pub const fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }

    /// These and `other`.
    #[must_use]
    pub const fn union(self, other: Features) -> Features {
        Features(self.0 | other.0)
    }

    /// These without `other`'s.
    #[must_use]
    pub const fn difference(self, other: Features) -> Features {
        Features(self.0 & !other.0)
    }

    /// The bits this build does not know.
    #[must_use]
    pub const fn unknown(self) -> Features {
        self.difference(Features::KNOWN)
    }

    /// Whether there is none.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The feature named `name` (case-insensitive).
    pub fn from_name(name: &str) -> Option<Features> {
        Features::NAMED
            .iter()
            .find(|(_, n)| n.eq_ignore_ascii_case(name))
            .map(|(f, _)| *f)
    }
}

impl std::ops::BitOr for Features {
    type Output = Features;
    fn bitor(self, rhs: Features) -> Features {
        self.union(rhs)
    }
}

impl fmt::Display for Features {
    /// `RING|DEVICE_CACHE`, an unknown bit as `bit N`, no bit as `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let mut sep = "";
        for bit in 0..64 {
            let one = Features(1 << bit);
            if !self.contains(one) {
                continue;
            }
            match Features::NAMED.iter().find(|(g, _)| *g == one) {
                Some((_, name)) => write!(f, "{sep}{name}")?,
                None => write!(f, "{sep}bit {bit}")?,
            }
            sep = "|";
        }
        Ok(())
    }
}

impl fmt::Debug for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Features({self})")
    }
}

/// Writes `names` joined by `|`, or `none`.
fn join<'a>(f: &mut fmt::Formatter<'_>, names: impl Iterator<Item = &'a str>) -> fmt::Result {
    let mut any = false;
    for n in names {
        if any {
            f.write_str("|")?;
        }
        f.write_str(n)?;
        any = true;
    }
    if !any {
        f.write_str("none")?;
    }
    Ok(())
}

/// A set of backend kinds ([`BackendKind`]), by wire code.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BackendKinds(u32);

// Every kind's code is a bit of the mask.
const _: () = {
    let mut i = 0;
    while i < BackendKind::ALL.len() {
        assert!(BackendKind::ALL[i].code() < 32);
        i += 1;
    }
};

impl BackendKinds {
    /// No kind.
    pub const NONE: BackendKinds = BackendKinds(0);

    /// `kinds`.
    pub fn of(kinds: impl IntoIterator<Item = BackendKind>) -> BackendKinds {
        kinds
            .into_iter()
            .fold(BackendKinds::NONE, BackendKinds::with)
    }

    /// These and `kind`.
    #[must_use]
    pub const fn with(self, kind: BackendKind) -> BackendKinds {
        BackendKinds(self.0 | 1 << kind.code())
    }

    /// Whether `kind` is here.
    pub const fn contains(self, kind: BackendKind) -> bool {
        self.0 & (1 << kind.code()) != 0
    }

    /// Whether every kind of `other` is here.
    pub const fn covers(self, other: BackendKinds) -> bool {
        self.0 & other.0 == other.0
    }

    /// These and `other`'s.
    #[must_use]
    pub const fn union(self, other: BackendKinds) -> BackendKinds {
        BackendKinds(self.0 | other.0)
    }

    /// These without `other`'s.
    #[must_use]
    pub const fn difference(self, other: BackendKinds) -> BackendKinds {
        BackendKinds(self.0 & !other.0)
    }

    /// Whether there is none.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The kinds, in code order.
    pub fn iter(self) -> impl Iterator<Item = BackendKind> {
        BackendKind::ALL
            .into_iter()
            .filter(move |k| self.contains(*k))
    }
}

impl fmt::Display for BackendKinds {
    /// `MEMFD|DEVICE_MALLOC` (code order), or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        join(f, self.iter().map(BackendKind::name))
    }
}

impl fmt::Debug for BackendKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BackendKinds({self})")
    }
}

/// A set of dtypes ([`DType`]), by wire code.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DTypeSet(u128);

// Every dtype's code is a bit of the mask.
const _: () = {
    let mut i = 0;
    while i < DType::ALL.len() {
        assert!(DType::ALL[i].code() < 128);
        i += 1;
    }
};

impl DTypeSet {
    /// No dtype.
    pub const NONE: DTypeSet = DTypeSet(0);

    /// Every dtype this build knows.
    pub const ALL: DTypeSet = {
        let mut bits = 0u128;
        let mut i = 0;
        while i < DType::ALL.len() {
            bits |= 1 << DType::ALL[i].code();
            i += 1;
        }
        DTypeSet(bits)
    };

    /// `dtypes`.
    pub fn of(dtypes: impl IntoIterator<Item = DType>) -> DTypeSet {
        dtypes.into_iter().fold(DTypeSet::NONE, DTypeSet::with)
    }

    /// These and `dtype`.
    #[must_use]
    pub const fn with(self, dtype: DType) -> DTypeSet {
        DTypeSet(self.0 | 1 << dtype.code())
    }

    /// Whether `dtype` is here.
    pub const fn contains(self, dtype: DType) -> bool {
        self.0 & (1 << dtype.code()) != 0
    }

    /// Whether every dtype of `other` is here.
    pub const fn covers(self, other: DTypeSet) -> bool {
        self.0 & other.0 == other.0
    }

    /// These without `other`'s.
    #[must_use]
    pub const fn difference(self, other: DTypeSet) -> DTypeSet {
        DTypeSet(self.0 & !other.0)
    }

    /// Whether there is none.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The dtypes, in code order.
    pub fn iter(self) -> impl Iterator<Item = DType> {
        DType::ALL.into_iter().filter(move |d| self.contains(*d))
    }
}

impl fmt::Display for DTypeSet {
    /// `F32|F64` (code order), or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        join(f, self.iter().map(DType::name))
    }
}

impl fmt::Debug for DTypeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DTypeSet({self})")
    }
}

/// What a worker can take (as its handshake says it), or what a task
/// needs of the worker that runs it: the same three sets either way, so
/// that [`Capabilities::covers`] is the one test of whether a worker can
/// take a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities {
    /// Kinds of buffer a task argument may be backed by. A worker states
    /// the kinds it resolves by itself: MEMFD when it imports memfds over
    /// its fd channel, DEVICE_MALLOC for its own device buffers. Bytes that
    /// travel with a task are [`Features::HOST_BYTES`], not a kind.
    pub backends: BackendKinds,
    /// Dtypes a task argument may have.
    pub dtypes: DTypeSet,
    /// Features.
    pub features: Features,
}

impl Capabilities {
    /// Nothing: what a task with no arguments that requires no feature
    /// needs.
    pub const NONE: Capabilities = Capabilities {
        backends: BackendKinds::NONE,
        dtypes: DTypeSet::NONE,
        features: Features::NONE,
    };

    /// Whether everything `needs` names is here.
    pub const fn covers(&self, needs: &Capabilities) -> bool {
        self.backends.covers(needs.backends)
            && self.dtypes.covers(needs.dtypes)
            && self.features.contains(needs.features)
    }

    /// What of `needs` is not here (nothing when [`Capabilities::covers`]).
    pub const fn missing(&self, needs: &Capabilities) -> Capabilities {
        Capabilities {
            backends: needs.backends.difference(self.backends),
            dtypes: needs.dtypes.difference(self.dtypes),
            features: needs.features.difference(self.features),
        }
    }

    /// Whether it names nothing.
    pub const fn is_empty(&self) -> bool {
        self.backends.is_empty() && self.dtypes.is_empty() && self.features.is_empty()
    }
}

impl fmt::Display for Capabilities {
    /// `backends MEMFD|DEVICE_MALLOC; dtypes F32|F64; features RING`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "backends {}; dtypes {}; features {}",
            self.backends, self.dtypes, self.features
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_name_known_bits_and_keep_unknown_ones() {
        assert_eq!(Features::NONE.to_string(), "none");
        assert_eq!(
            (Features::RING | Features::HOST_BYTES).to_string(),
            "RING|HOST_BYTES"
        );
        let odd = Features::from_bits(Features::DEVICE_CACHE.bits() | 1 << 40 | 1 << 63);
        assert_eq!(odd.to_string(), "DEVICE_CACHE|bit 40|bit 63");
        assert_eq!(odd.unknown(), Features::from_bits(1 << 40 | 1 << 63));
        assert_eq!(odd.unknown().to_string(), "bit 40|bit 63");
        assert!(Features::KNOWN.unknown().is_empty());
        let mut names = std::collections::HashSet::new();
        for (f, name) in Features::NAMED {
            assert_eq!(f.bits().count_ones(), 1, "{name} is one bit");
            assert!(Features::KNOWN.contains(f));
            assert_eq!(Features::from_name(name), Some(f));
            assert_eq!(Features::from_name(&name.to_lowercase()), Some(f));
            assert_eq!(f.to_string(), name);
            assert!(names.insert(f.bits()), "{name}: bit used twice");
        }
        assert_eq!(Features::from_name("ring data"), None);
    }

    #[test]
    fn sets_hold_every_known_code_and_print_in_code_order() {
        let all = DTypeSet::of(DType::ALL);
        assert_eq!(all, DTypeSet::ALL);
        assert_eq!(all.iter().collect::<Vec<_>>(), DType::ALL);
        let some = DTypeSet::of([DType::C128, DType::F32]);
        assert_eq!(some.to_string(), "F32|C128");
        assert!(all.covers(some) && !some.covers(all));
        assert_eq!(
            all.difference(some).iter().count(),
            DType::ALL.len() - 2,
            "{}",
            all.difference(some)
        );
        let kinds = BackendKinds::of(BackendKind::ALL);
        assert_eq!(kinds.iter().collect::<Vec<_>>(), BackendKind::ALL);
        let local = BackendKinds::of([BackendKind::DeviceMalloc, BackendKind::Memfd]);
        assert_eq!(local.to_string(), "DEVICE_MALLOC|MEMFD");
        assert_eq!(BackendKinds::NONE.to_string(), "none");
        assert_eq!(DTypeSet::NONE.to_string(), "none");
    }

    #[test]
    fn covers_and_missing_agree_on_each_set() {
        let worker = Capabilities {
            backends: BackendKinds::of([BackendKind::Memfd, BackendKind::DeviceMalloc]),
            dtypes: DTypeSet::of([DType::F32, DType::F64]),
            features: Features::RING | Features::HOST_BYTES,
        };
        assert!(worker.covers(&Capabilities::NONE));
        assert!(worker.covers(&worker));
        let fits = Capabilities {
            backends: BackendKinds::of([BackendKind::Memfd]),
            dtypes: DTypeSet::of([DType::F64]),
            features: Features::HOST_BYTES,
        };
        assert!(worker.covers(&fits));
        assert!(worker.missing(&fits).is_empty());
        let wants = Capabilities {
            backends: BackendKinds::of([BackendKind::Memfd, BackendKind::PosixShm]),
            dtypes: DTypeSet::of([DType::F32, DType::C64]),
            features: Features::DEVICE_CACHE | Features::from_bits(1 << 50),
        };
        assert!(!worker.covers(&wants));
        let missing = worker.missing(&wants);
        assert_eq!(
            missing.to_string(),
            "backends POSIX_SHM; dtypes C64; features DEVICE_CACHE|bit 50"
        );
        // Each set alone decides.
        for only in [
            Capabilities {
                backends: wants.backends,
                ..fits
            },
            Capabilities {
                dtypes: wants.dtypes,
                ..fits
            },
            Capabilities {
                features: wants.features,
                ..fits
            },
        ] {
            assert!(!worker.covers(&only), "{only}");
            assert!(!worker.missing(&only).is_empty());
        }
    }
}
