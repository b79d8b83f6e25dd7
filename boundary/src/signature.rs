//! A callable's signature: its name and version, how it uses each tensor
//! argument, and how it reads each scalar; and the canonical string every
//! process writes it as, whose digest is the callable's handle.
//!
//! The string, for example
//! `add@1(a:R:F32|F64:*,b:R:=0:=0,out:W:=0:=0;alpha:f64)`, is
//! `name@version(args;scalars)`: each argument `name:access:dtypes:rank`
//! (access `R`, `W` or `RW`; dtypes `*`, `=i` for argument i's, or names
//! joined by `|`; rank `*`, `n`, `>=n` or `=i`), each scalar `name:kind`
//! (`u64`, `i64`, `f64`, or `likeI` for argument i's dtype).
//! [`Signature::canonical`] writes it and [`Signature::parse`] reads it
//! back: the one parser of it, which the graph format, the Python
//! package and the workers' handshakes all use. Strings come from other
//! processes, so the parser checks everything and never panics.
//!
//! Python kernels declare their arguments in a shorter form,
//! `[name:]r|w|rw[:dtype|dtype…]` and `[name:]kind`, read by
//! [`ArgSpec::parse_short`] and [`ScalarSpec::parse_short`].

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};
use strata_wire::{Access, DType, KernelHandle};

/// Which dtypes an argument accepts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DTypes {
    /// Any dtype.
    Any,
    /// One of these.
    OneOf(Vec<DType>),
    /// The same dtype as argument `i`.
    SameAs(usize),
    /// Names this build does not know (a newer peer's dtypes), kept as
    /// written so that the string round-trips; nothing is checked against
    /// them here, and the worker that wrote them checks at launch.
    Unknown(String),
}

/// Which ranks an argument accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rank {
    /// Any rank from 1 to 5.
    Any,
    /// Exactly this rank.
    Exactly(usize),
    /// At least this rank.
    AtLeast(usize),
    /// The same rank as argument `i`.
    SameAs(usize),
}

/// How a kernel uses one tensor argument.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArgSpec {
    /// Name, for error messages and the descriptor.
    pub name: String,
    /// Whether the kernel reads the view, writes every element of it, or
    /// both. It decides staging: READ is copied in, WRITE copied out,
    /// READWRITE both.
    pub access: Access,
    /// Accepted dtypes.
    pub dtypes: DTypes,
    /// Accepted ranks.
    pub rank: Rank,
}

impl ArgSpec {
    /// A spec.
    pub fn new(name: &str, access: Access, dtypes: DTypes, rank: Rank) -> Self {
        ArgSpec {
            name: name.to_owned(),
            access,
            dtypes,
            rank,
        }
    }

    /// Argument `index` of a Python kernel's declaration:
    /// `[name:]r|w|rw[:dtype|dtype…]`, the name `a{index}` when left out,
    /// any rank; `dtype` reads each dtype name (Python's accepts numpy's
    /// names too).
    ///
    /// # Errors
    /// What is wrong with `text`, in words.
    pub fn parse_short(
        text: &str,
        index: usize,
        dtype: impl Fn(&str) -> Result<DType, String>,
    ) -> Result<ArgSpec, String> {
        let short_access = |s: &str| match s.to_ascii_lowercase().as_str() {
            "r" => Some(Access::Read),
            "w" => Some(Access::Write),
            "rw" => Some(Access::ReadWrite),
            _ => None,
        };
        let parts: Vec<&str> = text.split(':').collect();
        let (name, access, types) = match parts.as_slice() {
            [acc] => (format!("a{index}"), *acc, None),
            [x, y] if short_access(x).is_some() => (format!("a{index}"), *x, Some(*y)),
            [n, acc] => ((*n).to_owned(), *acc, None),
            [n, acc, t] => ((*n).to_owned(), *acc, Some(*t)),
            _ => return Err("expected [name:]r|w|rw[:dtype|dtype...]".into()),
        };
        check_name(&name)?;
        let access = short_access(access).ok_or("access is r, w or rw")?;
        let dtypes = match types {
            None => DTypes::Any,
            Some(t) => DTypes::OneOf(t.split('|').map(&dtype).collect::<Result<_, _>>()?),
        };
        Ok(ArgSpec::new(&name, access, dtypes, Rank::Any))
    }
}

/// How a kernel reads one scalar argument (each scalar is 64 bits on the
/// wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarKind {
    /// An unsigned integer.
    U64,
    /// A signed integer, two's complement.
    I64,
    /// An IEEE double, by its bits.
    F64,
    /// Interpreted in the dtype of an argument: f64 bits for float dtypes,
    /// the integer itself for integer dtypes.
    LikeArg(usize),
}

impl ScalarKind {
    fn parse(text: &str) -> Option<ScalarKind> {
        Some(match text {
            "u64" => ScalarKind::U64,
            "i64" => ScalarKind::I64,
            "f64" => ScalarKind::F64,
            k => ScalarKind::LikeArg(index(k.strip_prefix("like")?)?),
        })
    }
}

impl fmt::Display for ScalarKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScalarKind::U64 => f.write_str("u64"),
            ScalarKind::I64 => f.write_str("i64"),
            ScalarKind::F64 => f.write_str("f64"),
            ScalarKind::LikeArg(i) => write!(f, "like{i}"),
        }
    }
}

/// One scalar argument.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScalarSpec {
    /// Name.
    pub name: String,
    /// Interpretation.
    pub kind: ScalarKind,
}

impl ScalarSpec {
    /// Scalar `index` of a Python kernel's declaration, `[name:]kind`
    /// (the name `s{index}` when left out), for a kernel of `args` tensor
    /// arguments.
    ///
    /// # Errors
    /// What is wrong with `text`, in words.
    pub fn parse_short(text: &str, index: usize, args: usize) -> Result<ScalarSpec, String> {
        let (name, kind) = match text.rsplit_once(':') {
            Some((n, k)) => (n.to_owned(), k),
            None => (format!("s{index}"), text),
        };
        check_name(&name)?;
        match ScalarKind::parse(kind) {
            Some(ScalarKind::LikeArg(i)) if i >= args => Err(format!(
                "like{i} names argument {i}, and the kernel has {args} (likeN: N an argument)"
            )),
            Some(kind) => Ok(ScalarSpec { name, kind }),
            None => Err("kind is f64, i64, u64 or likeN (N an argument)".into()),
        }
    }
}

/// Everything that identifies a callable: its name, version and how it
/// uses its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Signature {
    /// Dotted name, such as `strata.matmul`.
    pub name: String,
    /// Version; a change of behaviour is a new version.
    pub version: u32,
    /// Tensor arguments, in order.
    pub args: Vec<ArgSpec>,
    /// Scalar arguments, in order.
    pub scalars: Vec<ScalarSpec>,
}

/// A signature string that is not one (from [`Signature::parse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureError {
    /// The string.
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "malformed callable signature {:?}: {}",
            self.text, self.reason
        )
    }
}

impl std::error::Error for SignatureError {}

impl Signature {
    /// `name@version`.
    pub fn qualified_name(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    /// The canonical string the handle is a digest of (module docs).
    pub fn canonical(&self) -> String {
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| {
                let access = match a.access {
                    Access::Read => "R",
                    Access::Write => "W",
                    Access::ReadWrite => "RW",
                };
                let dtypes = match &a.dtypes {
                    DTypes::Any => "*".to_owned(),
                    DTypes::OneOf(list) => {
                        list.iter().map(|d| d.name()).collect::<Vec<_>>().join("|")
                    }
                    DTypes::SameAs(i) => format!("={i}"),
                    DTypes::Unknown(text) => text.clone(),
                };
                let rank = match a.rank {
                    Rank::Any => "*".to_owned(),
                    Rank::Exactly(n) => n.to_string(),
                    Rank::AtLeast(n) => format!(">={n}"),
                    Rank::SameAs(i) => format!("={i}"),
                };
                format!("{}:{access}:{dtypes}:{rank}", a.name)
            })
            .collect();
        let scalars: Vec<String> = self
            .scalars
            .iter()
            .map(|s| format!("{}:{}", s.name, s.kind))
            .collect();
        format!(
            "{}({};{})",
            self.qualified_name(),
            args.join(","),
            scalars.join(",")
        )
    }

    /// The digest of [`Signature::canonical`]: its SHA-256's first 16
    /// bytes, so that two processes that agree on the signature agree on
    /// the handle, and a change of signature is a change of handle.
    pub fn handle(&self) -> KernelHandle {
        let digest = Sha256::digest(self.canonical().as_bytes());
        let mut h = [0u8; 16];
        h.copy_from_slice(&digest[..16]);
        KernelHandle(h)
    }

    /// Reads a canonical string (module docs). Every index it names
    /// (`=i`, `likeI`) must be an argument of the signature, and every
    /// name non-empty and free of the grammar's characters; a dtype name
    /// this build does not know keeps that argument's dtypes as
    /// [`DTypes::Unknown`].
    ///
    /// # Errors
    /// A string not of that form, saying where.
    pub fn parse(text: &str) -> Result<Signature, SignatureError> {
        let bad = |reason: String| SignatureError {
            text: text.to_owned(),
            reason,
        };
        let (qualified, rest) = text
            .split_once('(')
            .ok_or_else(|| bad("no '(' after name@version".into()))?;
        let inner = rest
            .strip_suffix(')')
            .ok_or_else(|| bad("it does not end with ')'".into()))?;
        let (name, version) = qualified
            .rsplit_once('@')
            .ok_or_else(|| bad(format!("{qualified:?} is not name@version")))?;
        check_name(name).map_err(|e| bad(format!("name: {e}")))?;
        let version = version
            .parse()
            .map_err(|_| bad(format!("version {version:?} is not a whole number")))?;
        let (args, scalars) = inner
            .split_once(';')
            .ok_or_else(|| bad("no ';' between the arguments and the scalars".into()))?;
        let args = split_list(args)
            .enumerate()
            .map(|(i, a)| parse_arg(a).map_err(|e| bad(format!("argument {i} {a:?}: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let scalars = split_list(scalars)
            .enumerate()
            .map(|(i, s)| {
                let (name, kind) = s
                    .rsplit_once(':')
                    .ok_or_else(|| bad(format!("scalar {i} {s:?} is not name:kind")))?;
                check_name(name).map_err(|e| bad(format!("scalar {i} {s:?}: {e}")))?;
                let kind = ScalarKind::parse(kind).ok_or_else(|| {
                    bad(format!("scalar {i} {s:?}: kind is u64, i64, f64 or likeI"))
                })?;
                Ok(ScalarSpec {
                    name: name.to_owned(),
                    kind,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let sig = Signature {
            name: name.to_owned(),
            version,
            args,
            scalars,
        };
        sig.check_indices().map_err(bad)?;
        Ok(sig)
    }

    /// Every argument index the signature names is one of its arguments.
    fn check_indices(&self) -> Result<(), String> {
        let n = self.args.len();
        for (i, a) in self.args.iter().enumerate() {
            let named = [
                match a.dtypes {
                    DTypes::SameAs(j) => Some(j),
                    _ => None,
                },
                match a.rank {
                    Rank::SameAs(j) => Some(j),
                    _ => None,
                },
            ];
            if let Some(j) = named.into_iter().flatten().find(|&j| j >= n) {
                return Err(format!(
                    "argument {i} refers to argument {j}, and there are {n}"
                ));
            }
        }
        for (i, s) in self.scalars.iter().enumerate() {
            if let ScalarKind::LikeArg(j) = s.kind
                && j >= n
            {
                return Err(format!(
                    "scalar {i} refers to argument {j}, and there are {n}"
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl FromStr for Signature {
    type Err = SignatureError;

    fn from_str(s: &str) -> Result<Self, SignatureError> {
        Signature::parse(s)
    }
}

/// One callable a worker offers: its handle and its signature. The one
/// record of it every layer passes around, from a worker's handshake to
/// the driver's lookups.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallableOffer {
    /// The digest of its signature ([`Signature::handle`]).
    pub handle: KernelHandle,
    /// Its signature.
    pub signature: Signature,
}

impl CallableOffer {
    /// The offer of a callable of this signature.
    pub fn of(signature: Signature) -> Self {
        CallableOffer {
            handle: signature.handle(),
            signature,
        }
    }

    /// What a peer said it offers, checked: `signature` parses, names
    /// `name@version`, and `handle` is its digest.
    ///
    /// # Errors
    /// What does not hold, in words.
    pub fn checked(
        handle: KernelHandle,
        name: &str,
        version: u32,
        signature: &str,
    ) -> Result<Self, String> {
        let signature = Signature::parse(signature).map_err(|e| e.to_string())?;
        if signature.name != name || signature.version != version {
            return Err(format!(
                "offered as {name}@{version}, but its signature is {}'s",
                signature.qualified_name()
            ));
        }
        if signature.handle() != handle {
            return Err(format!(
                "handle {handle} is not the digest of its signature ({})",
                signature.handle()
            ));
        }
        Ok(CallableOffer { handle, signature })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.signature.name
    }

    /// Its version.
    pub fn version(&self) -> u32 {
        self.signature.version
    }
}

/// The items of a comma-separated list (none for an empty one).
fn split_list(s: &str) -> impl Iterator<Item = &str> {
    (!s.is_empty()).then(|| s.split(',')).into_iter().flatten()
}

/// A decimal index of at most four digits (an argument or a rank: a
/// signature has far fewer, and this bounds what a hostile string asks).
fn index(s: &str) -> Option<usize> {
    if s.is_empty() || s.len() > 4 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Whether `name` may name a callable, an argument or a scalar: it is
/// non-empty and free of the grammar's characters.
///
/// # Errors
/// Saying so.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(['@', '(', ')', ',', ':', ';', '|', '=']) {
        Err(format!(
            "{name:?}: a name is non-empty, without @ ( ) , : ; | ="
        ))
    } else {
        Ok(())
    }
}

/// `name:access:dtypes:rank`.
fn parse_arg(text: &str) -> Result<ArgSpec, String> {
    let parts: Vec<&str> = text.split(':').collect();
    let [name, access, dtypes, rank] = parts.as_slice() else {
        return Err("not name:access:dtypes:rank".into());
    };
    check_name(name)?;
    let access = match *access {
        "R" => Access::Read,
        "W" => Access::Write,
        "RW" => Access::ReadWrite,
        other => return Err(format!("access {other:?} is not R, W or RW")),
    };
    let dtypes = match *dtypes {
        "*" => DTypes::Any,
        t if t.starts_with('=') => {
            DTypes::SameAs(index(&t[1..]).ok_or_else(|| format!("dtypes {t:?}: bad index"))?)
        }
        t => {
            let names: Vec<&str> = t.split('|').collect();
            if names.iter().any(|n| n.is_empty()) {
                return Err(format!("dtypes {t:?}: an empty name"));
            }
            match names.iter().map(|n| DType::from_name(n)).collect() {
                Some(list) => DTypes::OneOf(list),
                None => DTypes::Unknown(t.to_owned()),
            }
        }
    };
    let rank = match *rank {
        "*" => Rank::Any,
        t if t.starts_with(">=") => Rank::AtLeast(index(&t[2..]).ok_or("bad rank")?),
        t if t.starts_with('=') => Rank::SameAs(index(&t[1..]).ok_or("bad rank")?),
        t => Rank::Exactly(index(t).ok_or_else(|| format!("rank {t:?} is not *, n, >=n or =i"))?),
    };
    Ok(ArgSpec {
        name: (*name).to_owned(),
        access,
        dtypes,
        rank,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn arb_signature() -> impl Strategy<Value = Signature> {
        (1usize..5).prop_flat_map(|n| {
            let arg = (
                "[a-z][a-z0-9_]{0,5}",
                0u8..3,
                prop_oneof![
                    Just(DTypes::Any),
                    proptest::sample::subsequence(DType::ALL.to_vec(), 1..4)
                        .prop_map(DTypes::OneOf),
                    (0..n).prop_map(DTypes::SameAs),
                    Just(DTypes::Unknown("F128|F32".into())),
                ],
                prop_oneof![
                    Just(Rank::Any),
                    (1usize..6).prop_map(Rank::Exactly),
                    (1usize..6).prop_map(Rank::AtLeast),
                    (0..n).prop_map(Rank::SameAs),
                ],
            )
                .prop_map(|(name, access, dtypes, rank)| ArgSpec {
                    name,
                    access: [Access::Read, Access::Write, Access::ReadWrite][access as usize],
                    dtypes,
                    rank,
                });
            let scalar = (
                "[a-z][a-z0-9]{0,4}",
                prop_oneof![
                    Just(ScalarKind::U64),
                    Just(ScalarKind::I64),
                    Just(ScalarKind::F64),
                    (0..n).prop_map(ScalarKind::LikeArg),
                ],
            )
                .prop_map(|(name, kind)| ScalarSpec { name, kind });
            (
                "[a-z][a-z0-9_.]{0,8}",
                any::<u32>(),
                proptest::collection::vec(arg, n),
                proptest::collection::vec(scalar, 0..3),
            )
                .prop_map(|(name, version, args, scalars)| Signature {
                    name,
                    version,
                    args,
                    scalars,
                })
        })
    }

    proptest! {
        /// Structure → string → structure, and string → structure →
        /// the same string.
        #[test]
        fn signatures_round_trip_with_their_canonical_string(sig in arb_signature()) {
            let text = sig.canonical();
            let back = Signature::parse(&text).unwrap();
            prop_assert_eq!(&back, &sig);
            prop_assert_eq!(back.canonical(), text);
            prop_assert_eq!(back.handle(), sig.handle());
        }

        /// A string from another process never panics the parser: cut or
        /// spliced canonical strings, and arbitrary text.
        #[test]
        fn any_string_parses_or_is_refused(sig in arb_signature(), cut in any::<usize>(),
                                           junk in "[ -~]{0,40}") {
            let text = sig.canonical();
            let at = cut % (text.len() + 1);
            let _ = Signature::parse(&text[..at]);
            let _ = Signature::parse(&format!("{}{junk}{}", &text[..at], &text[at..]));
            let _ = Signature::parse(&junk);
        }
    }

    #[test]
    fn a_known_string_reads_as_its_parts() {
        let sig: Signature = "add@1(a:R:F32|f64:*,b:R:=0:=0,out:W:=0:>=2;alpha:like0)"
            .parse()
            .unwrap();
        assert_eq!(sig.qualified_name(), "add@1");
        assert_eq!(
            sig.args[0].dtypes,
            DTypes::OneOf(vec![DType::F32, DType::F64])
        );
        assert_eq!(sig.args[2].access, Access::Write);
        assert_eq!(sig.args[2].rank, Rank::AtLeast(2));
        assert_eq!(sig.scalars[0].kind, ScalarKind::LikeArg(0));
        // Names as the canonical form spells them.
        assert_eq!(
            sig.canonical(),
            "add@1(a:R:F32|F64:*,b:R:=0:=0,out:W:=0:>=2;alpha:like0)"
        );
        let empty: Signature = "noop@3(;)".parse().unwrap();
        assert!(empty.args.is_empty() && empty.scalars.is_empty());
    }

    #[test]
    fn malformed_strings_are_refused_saying_what_is_wrong() {
        for (text, says) in [
            ("add@1", "no '('"),
            ("add@1(a:R:*:*;", "does not end with ')'"),
            ("add(a:R:*:*;)", "not name@version"),
            ("add@x(;)", "version \"x\""),
            ("@1(;)", "name"),
            ("add@1(a:R:*:*)", "no ';'"),
            ("add@1(a:X:*:*;)", "access \"X\""),
            ("add@1(a:R:*;)", "not name:access:dtypes:rank"),
            ("add@1(a:R:=3:*;)", "refers to argument 3"),
            ("add@1(a:R:*:=1;)", "refers to argument 1"),
            ("add@1(a:R:*:*;s:like2)", "refers to argument 2"),
            ("add@1(a:R:*:*;s:u32)", "kind is u64"),
            ("add@1(a:R:F32||F64:*;)", "empty name"),
            ("add@1(a:R:*:99999;)", "rank"),
        ] {
            let e = Signature::parse(text).unwrap_err();
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn an_offer_is_checked_against_its_signature() {
        let sig: Signature = "scale@2(x:R:*:*,y:W:=0:=0;alpha:f64)".parse().unwrap();
        let text = sig.canonical();
        let ok = CallableOffer::checked(sig.handle(), "scale", 2, &text).unwrap();
        assert_eq!(ok, CallableOffer::of(sig.clone()));
        assert_eq!((ok.name(), ok.version()), ("scale", 2));
        let e = CallableOffer::checked(sig.handle(), "scale", 3, &text).unwrap_err();
        assert!(e.contains("offered as scale@3"), "{e}");
        let e = CallableOffer::checked(KernelHandle([7; 16]), "scale", 2, &text).unwrap_err();
        assert!(e.contains("not the digest"), "{e}");
        let e = CallableOffer::checked(sig.handle(), "scale", 2, "scale@2(").unwrap_err();
        assert!(e.contains("malformed"), "{e}");
    }

    #[test]
    fn an_unknown_dtype_name_is_kept_as_written() {
        let text = "f@1(a:R:F128|F32:*;)";
        let sig = Signature::parse(text).unwrap();
        assert_eq!(sig.args[0].dtypes, DTypes::Unknown("F128|F32".into()));
        assert_eq!(sig.canonical(), text);
    }

    #[test]
    fn the_short_forms_of_python_kernels() {
        let dtype = |s: &str| DType::from_name(s).ok_or_else(|| format!("no dtype {s}"));
        let a = ArgSpec::parse_short("r", 0, dtype).unwrap();
        assert_eq!((a.name.as_str(), a.access), ("a0", Access::Read));
        let a = ArgSpec::parse_short("rw:f32|f64", 1, dtype).unwrap();
        assert_eq!(a.name, "a1");
        assert_eq!(a.dtypes, DTypes::OneOf(vec![DType::F32, DType::F64]));
        let a = ArgSpec::parse_short("out:w:u8", 2, dtype).unwrap();
        assert_eq!((a.name.as_str(), a.access), ("out", Access::Write));
        assert!(
            ArgSpec::parse_short("x:q", 0, dtype)
                .unwrap_err()
                .contains("r, w or rw")
        );
        assert!(
            ArgSpec::parse_short("x:r:q8", 0, dtype)
                .unwrap_err()
                .contains("no dtype q8")
        );
        assert!(ArgSpec::parse_short("a:b:c:d", 0, dtype).is_err());
        let s = ScalarSpec::parse_short("alpha:f64", 0, 2).unwrap();
        assert_eq!((s.name.as_str(), s.kind), ("alpha", ScalarKind::F64));
        assert_eq!(ScalarSpec::parse_short("like1", 0, 2).unwrap().name, "s0");
        assert!(
            ScalarSpec::parse_short("like2", 0, 2)
                .unwrap_err()
                .contains("has 2")
        );
        assert!(ScalarSpec::parse_short("u32", 0, 2).is_err());
    }
}
