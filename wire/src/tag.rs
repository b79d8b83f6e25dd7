//! How a task touches each tensor argument (docs/wire-format.md §6).

/// The tag of a task argument: what the task does with the bytes of the
/// view, and therefore which ordering it needs. The discriminant is the wire
/// code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ArgTag {
    /// Reads; orders after earlier writers of any shared byte (RAW).
    Input = 0,
    /// Writes every element without reading; orders after earlier writers
    /// and readers (WAW, WAR).
    Output = 1,
    /// Reads and writes (RAW, WAW, WAR).
    InOut = 2,
    /// Writes into an existing buffer without reading; ordered as OUTPUT.
    OutputExisting = 3,
    /// No dependency tracking: the caller orders the task.
    NoDep = 4,
}

impl ArgTag {
    /// Every tag, in code order.
    pub const ALL: [ArgTag; 5] = [
        ArgTag::Input,
        ArgTag::Output,
        ArgTag::InOut,
        ArgTag::OutputExisting,
        ArgTag::NoDep,
    ];

    /// The tag with wire code `code`.
    pub const fn from_code(code: u8) -> Option<ArgTag> {
        match code {
            0 => Some(ArgTag::Input),
            1 => Some(ArgTag::Output),
            2 => Some(ArgTag::InOut),
            3 => Some(ArgTag::OutputExisting),
            4 => Some(ArgTag::NoDep),
            _ => None,
        }
    }

    /// The wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The upper-case name docs/wire-format.md uses.
    pub const fn name(self) -> &'static str {
        match self {
            ArgTag::Input => "INPUT",
            ArgTag::Output => "OUTPUT",
            ArgTag::InOut => "INOUT",
            ArgTag::OutputExisting => "OUTPUT_EXISTING",
            ArgTag::NoDep => "NO_DEP",
        }
    }

    /// The tag named `name` (case-insensitive).
    pub fn from_name(name: &str) -> Option<ArgTag> {
        ArgTag::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Whether the task reads the view's bytes (dependency tracking sense).
    pub const fn reads(self) -> bool {
        matches!(self, ArgTag::Input | ArgTag::InOut)
    }

    /// Whether the task writes the view's bytes (dependency tracking sense).
    pub const fn writes(self) -> bool {
        matches!(
            self,
            ArgTag::Output | ArgTag::InOut | ArgTag::OutputExisting
        )
    }
}

impl std::fmt::Display for ArgTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::ArgTag;

    #[test]
    fn codes_and_names_round_trip() {
        for t in ArgTag::ALL {
            assert_eq!(ArgTag::from_code(t.code()), Some(t));
            assert_eq!(ArgTag::from_name(t.name()), Some(t));
        }
        assert_eq!(ArgTag::from_code(5), None);
        assert!(ArgTag::InOut.reads() && ArgTag::InOut.writes());
        assert!(!ArgTag::NoDep.reads() && !ArgTag::NoDep.writes());
        assert!(!ArgTag::OutputExisting.reads() && ArgTag::OutputExisting.writes());
    }
}
