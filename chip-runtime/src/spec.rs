//! Device spec strings: `sim`, `sim:mem=2GiB,mode=staged`,
//! `sim:mode=unified,lanes=2`.
//!
//! Grammar: `KIND[:KEY=VALUE(,KEY=VALUE)*]`. For `sim` the keys are
//!
//! | key | value | default |
//! |---|---|---|
//! | `mem` | total device memory, a size | 1GiB |
//! | `mode` | `staged` (copy host views into device memory) or `unified` (read host memory in place) | staged |
//! | `lanes` | kernels that may run at once, 1..=256 | 1 |
//! | `run` | bytes of the per-run bump region | mem/4 |
//! | `scratch` | bytes of the per-kernel scratch region (staged copies, temporaries) | mem/4 |
//! | `prefetch` | `on` (a launch waiting for a lane has its bytes copied into the device cache meanwhile, by a copy thread) or `off` | on |
//! | `timing` | `on`: kernels do not compute; each takes its modelled duration (its flops at `gflops`, or the bytes its arguments span at 10 GB/s for a kernel that counts no flops) and leaves its outputs as they were. Results are then not checked | off |
//! | `gflops` | the modelled compute rate of timing mode, a whole number of GFlop/s | 50 |
//! | `link` | a modelled link: every byte staged to or from the chip also takes this bandwidth, a size per second (`16GB` is 16·10⁹ bytes/s) | none |
//! | `latency` | and each transfer on it (a launch's bytes in, each view it writes back) this many µs | 0 |
//! | `dtypes` | the dtypes the chip computes on, names joined by `\|` (`F32\|F64`): a chip without the others, as many accelerators lack F64 or complex types. Its worker states them, drivers place tasks by them, and a launch on another dtype is refused | every dtype |
//!
//! Timing mode and the link make a simulated cluster of many chips cost
//! little CPU (a chip sleeps through its kernels and transfers), so
//! schedules can be studied at 16 or 64 chips on a small machine, as
//! StarPU does in its simulation mode.
//!
//! The persistent region gets the rest. Sizes are integers with an optional
//! suffix: `B`, `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024) or `KB`, `MB`,
//! `GB`, `TB` (powers of 1000). Region sizes are rounded down to 64 bytes.
//! Unknown keys, repeated keys and bad values are errors naming them.

use std::fmt;
use std::str::FromStr;

use strata_boundary::DTypeSet;
use strata_wire::DType;

use crate::Error;

/// Alignment of every device block and region boundary.
pub const BLOCK_ALIGN: u64 = 64;

/// Largest region the arena can manage (2^32 − 1 blocks of 64 bytes).
pub const MAX_REGION_BYTES: u64 = (u32::MAX as u64) * BLOCK_ALIGN;

/// Smallest device memory accepted.
pub const MIN_MEM: u64 = 64 * 1024;

/// How host-backed arguments reach a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// Like a discrete accelerator: the bytes of each host view are copied
    /// into device memory before the kernel (if it reads them) and back after
    /// it (if it writes them).
    Staged,
    /// Like unified memory: the kernel reads and writes host memory in place.
    Unified,
}

impl Mode {
    /// `staged` or `unified`.
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Staged => "staged",
            Mode::Unified => "unified",
        }
    }
}

/// A parsed, validated device spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeviceSpec {
    /// Total device memory.
    pub mem: u64,
    /// How host-backed arguments are handled.
    pub mode: Mode,
    /// How many kernels may run at once.
    pub lanes: usize,
    /// Bytes of the run region.
    pub run: u64,
    /// Bytes of the scratch region.
    pub scratch: u64,
    /// Copy the bytes of launches waiting for a lane into the device cache
    /// ahead of them (staged mode).
    pub prefetch: bool,
    /// Kernels take their modelled duration instead of computing.
    pub timing: bool,
    /// Timing mode's compute rate, GFlop/s.
    pub gflops: u32,
    /// The modelled link's bandwidth, bytes per second, if there is one.
    pub link: Option<u64>,
    /// Its latency per transfer, µs.
    pub latency_us: u32,
    /// The dtypes it computes on.
    pub dtypes: DTypeSet,
}

impl DeviceSpec {
    /// Bytes of the persistent region: what `run` and `scratch` leave.
    pub fn persistent(&self) -> u64 {
        self.mem - self.run - self.scratch
    }
}

impl Default for DeviceSpec {
    fn default() -> Self {
        // Infallible: the default string is valid (tested).
        "sim".parse().unwrap_or(DeviceSpec {
            mem: 1 << 30,
            mode: Mode::Staged,
            lanes: 1,
            run: 1 << 28,
            scratch: 1 << 28,
            prefetch: true,
            timing: false,
            gflops: 50,
            link: None,
            latency_us: 0,
            dtypes: DTypeSet::ALL,
        })
    }
}

impl FromStr for DeviceSpec {
    type Err = Error;

    fn from_str(spec: &str) -> Result<Self, Error> {
        let bad = |reason: String| Error::Spec {
            spec: spec.to_owned(),
            reason,
        };
        let (kind, rest) = match spec.split_once(':') {
            Some((kind, rest)) => (kind, Some(rest)),
            None => (spec, None),
        };
        if kind == "cuda" {
            return Err(bad(
                "a CUDA spec, where a simulated chip's (sim...) is needed".into(),
            ));
        }
        if kind != "sim" {
            return Err(bad(format!(
                "unknown device kind {kind:?} (known: sim, cuda)"
            )));
        }
        let (mut mem, mut mode, mut lanes, mut run, mut scratch) = (None, None, None, None, None);
        let mut prefetch = None;
        let (mut timing, mut gflops, mut link, mut latency) = (None, None, None, None);
        let mut dtypes = None;
        for item in rest.into_iter().flat_map(|r| r.split(',')) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("{item:?} is not KEY=VALUE")))?;
            let slot_taken = match key {
                "mem" => mem
                    .replace(parse_size(value).map_err(|r| bad(format!("mem: {r}")))?)
                    .is_some(),
                "run" => run
                    .replace(parse_size(value).map_err(|r| bad(format!("run: {r}")))?)
                    .is_some(),
                "scratch" => scratch
                    .replace(parse_size(value).map_err(|r| bad(format!("scratch: {r}")))?)
                    .is_some(),
                "mode" => {
                    let m = match value {
                        "staged" => Mode::Staged,
                        "unified" => Mode::Unified,
                        other => {
                            return Err(bad(format!("mode: {other:?} is not staged or unified")));
                        }
                    };
                    mode.replace(m).is_some()
                }
                "lanes" => {
                    let n: usize = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=256).contains(n))
                        .ok_or_else(|| {
                            bad(format!("lanes: {value:?} is not a number from 1 to 256"))
                        })?;
                    lanes.replace(n).is_some()
                }
                "prefetch" => {
                    let on = match value {
                        "on" => true,
                        "off" => false,
                        other => {
                            return Err(bad(format!("prefetch: {other:?} is not on or off")));
                        }
                    };
                    prefetch.replace(on).is_some()
                }
                "timing" => {
                    let on = match value {
                        "on" => true,
                        "off" => false,
                        other => {
                            return Err(bad(format!("timing: {other:?} is not on or off")));
                        }
                    };
                    timing.replace(on).is_some()
                }
                "gflops" => {
                    let g: u32 = value.parse().ok().filter(|g| *g > 0).ok_or_else(|| {
                        bad(format!("gflops: {value:?} is not a whole number above 0"))
                    })?;
                    gflops.replace(g).is_some()
                }
                "link" => {
                    let b = parse_size(value).ok().filter(|b| *b > 0).ok_or_else(|| {
                        bad(format!(
                            "link: {value:?} is not a bandwidth such as 16GB (bytes per second)"
                        ))
                    })?;
                    link.replace(b).is_some()
                }
                "latency" => {
                    let us: u32 = value.parse().map_err(|_| {
                        bad(format!("latency: {value:?} is not a whole number of µs"))
                    })?;
                    latency.replace(us).is_some()
                }
                "dtypes" => dtypes
                    .replace(parse_dtypes(value).map_err(|r| bad(format!("dtypes: {r}")))?)
                    .is_some(),
                other => {
                    return Err(bad(format!(
                        "unknown key {other:?} (known: mem, mode, lanes, run, scratch, prefetch, timing, gflops, link, latency, dtypes)"
                    )));
                }
            };
            if slot_taken {
                return Err(bad(format!("{key} is given twice")));
            }
        }
        let mem = mem.unwrap_or(1 << 30);
        if mem < MIN_MEM {
            return Err(bad(format!(
                "mem: {mem} bytes is below the minimum of {MIN_MEM}"
            )));
        }
        let align = |v: u64| v / BLOCK_ALIGN * BLOCK_ALIGN;
        let mem = align(mem);
        let run = align(run.unwrap_or(mem / 4));
        let scratch = align(scratch.unwrap_or(mem / 4));
        let persistent = mem
            .checked_sub(run)
            .and_then(|r| r.checked_sub(scratch))
            .ok_or_else(|| {
                bad(format!(
                    "run ({run}) + scratch ({scratch}) exceed mem ({mem})"
                ))
            })?;
        for (name, bytes) in [
            ("persistent", persistent),
            ("run", run),
            ("scratch", scratch),
        ] {
            if bytes > MAX_REGION_BYTES {
                return Err(bad(format!(
                    "the {name} region would be {bytes} bytes; at most {MAX_REGION_BYTES} are supported"
                )));
            }
        }
        let mode = mode.unwrap_or(Mode::Staged);
        if scratch == 0 && mode == Mode::Staged {
            return Err(bad(
                "staged mode needs a scratch region (scratch > 0)".into()
            ));
        }
        Ok(DeviceSpec {
            mem,
            mode,
            lanes: lanes.unwrap_or(1),
            run,
            scratch,
            prefetch: prefetch.unwrap_or(true),
            timing: timing.unwrap_or(false),
            gflops: gflops.unwrap_or(50),
            link,
            latency_us: latency.unwrap_or(0),
            dtypes: dtypes.unwrap_or(DTypeSet::ALL),
        })
    }
}

impl fmt::Display for DeviceSpec {
    /// The canonical form, with every key (the timing and link keys only
    /// when timing is on or a link is set): parsing it gives the same spec.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sim:mem={},mode={},lanes={},run={},scratch={},prefetch={}",
            format_size(self.mem),
            self.mode.name(),
            self.lanes,
            format_size(self.run),
            format_size(self.scratch),
            if self.prefetch { "on" } else { "off" }
        )?;
        if self.timing {
            write!(f, ",timing=on,gflops={}", self.gflops)?;
        }
        if let Some(b) = self.link {
            write!(f, ",link={b},latency={}", self.latency_us)?;
        }
        if self.dtypes != DTypeSet::ALL {
            write!(f, ",dtypes={}", self.dtypes)?;
        }
        Ok(())
    }
}

/// Parses `F32|F64` (names case-insensitive, each once) into a set.
fn parse_dtypes(text: &str) -> Result<DTypeSet, String> {
    let mut set = DTypeSet::NONE;
    for name in text.split('|') {
        let d = DType::from_name(name).ok_or_else(|| {
            format!(
                "{name:?} is not a dtype (known: {})",
                DTypeSet::ALL.to_string().replace('|', ", ")
            )
        })?;
        if set.contains(d) {
            return Err(format!("{} is named twice", d.name()));
        }
        set = set.with(d);
    }
    Ok(set)
}

/// Parses `2GiB`, `512MiB`, `1GB`, `4096` into bytes.
///
/// # Errors
/// A message saying what is wrong with the text.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &text[digits.len()..];
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as 512MiB"))?;
    let unit: u64 = match suffix {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => return Err(format!("unknown size suffix {other:?} in {text:?}")),
    };
    n.checked_mul(unit)
        .ok_or_else(|| format!("{text:?} overflows 64 bits"))
}

/// Formats a size with the largest binary suffix that divides it exactly.
pub fn format_size(bytes: u64) -> String {
    for (unit, name) in [
        (1u64 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ] {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{name}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_examples() {
        let d: DeviceSpec = "sim".parse().unwrap();
        assert_eq!(d, DeviceSpec::default());
        assert_eq!(
            (d.mem, d.mode, d.lanes, d.run, d.scratch),
            (1 << 30, Mode::Staged, 1, 1 << 28, 1 << 28)
        );
        assert_eq!(d.persistent(), 1 << 29);
        let s: DeviceSpec = "sim:mem=2GiB,mode=staged".parse().unwrap();
        assert_eq!(s.mem, 2 << 30);
        let u: DeviceSpec = "sim:mode=unified,lanes=2".parse().unwrap();
        assert_eq!((u.mode, u.lanes), (Mode::Unified, 2));
        let t: DeviceSpec = "sim:timing=on,gflops=200,link=16GB,latency=5"
            .parse()
            .unwrap();
        assert_eq!(
            (t.timing, t.gflops, t.link, t.latency_us),
            (true, 200, Some(16_000_000_000), 5)
        );
        let f: DeviceSpec = "sim:dtypes=f64|F32".parse().unwrap();
        assert_eq!(f.dtypes, DTypeSet::of([DType::F32, DType::F64]));
        assert!(f.to_string().ends_with(",dtypes=F32|F64"), "{f}");
        assert!(
            !d.to_string().contains("dtypes"),
            "every dtype is the default"
        );
        for spec in [d, s, u, t, f] {
            assert_eq!(
                spec.to_string().parse::<DeviceSpec>().unwrap(),
                spec,
                "{spec}"
            );
        }
        assert_eq!(
            "sim:mem=1MB,run=0,scratch=1000,mode=unified"
                .parse::<DeviceSpec>()
                .unwrap()
                .to_string(),
            "sim:mem=1000000,mode=unified,lanes=1,run=0,scratch=960,prefetch=on"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let err = |s: &str| s.parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(err("gpu").contains("unknown device kind \"gpu\""));
        assert!(err("sim:mem=lots").contains("mem: \"lots\" is not a size"));
        assert!(err("sim:mem=4XB").contains("unknown size suffix \"XB\""));
        assert!(err("sim:mode=fast").contains("mode: \"fast\""));
        assert!(err("sim:lanes=0").contains("lanes: \"0\""));
        assert!(err("sim:lanes=1,lanes=2").contains("lanes is given twice"));
        assert!(err("sim:colour=blue").contains("unknown key \"colour\""));
        assert!(err("sim:prefetch=maybe").contains("prefetch: \"maybe\" is not on or off"));
        assert!(
            !"sim:prefetch=off"
                .parse::<DeviceSpec>()
                .is_ok_and(|d| d.prefetch)
        );
        assert!(err("sim:mem").contains("not KEY=VALUE"));
        assert!(err("sim:timing=yes").contains("timing: \"yes\" is not on or off"));
        assert!(err("sim:gflops=0").contains("gflops: \"0\""));
        assert!(err("sim:link=fast").contains("link: \"fast\""));
        assert!(err("sim:latency=-1").contains("latency: \"-1\""));
        assert!(err("sim:mem=1KiB").contains("below the minimum"));
        assert!(err("sim:mem=1GiB,run=1GiB").contains("exceed mem"));
        assert!(err("sim:mem=1TiB,run=0,scratch=0").contains("at most"));
        assert!(err("sim:scratch=0").contains("scratch > 0"));
        assert!(err("sim:mem=99999999999999999999").contains("not a size"));
        assert!(err("sim:mem=99999999999TiB").contains("overflows"));
        assert!(
            err("sim:dtypes=F32|F99").contains("dtypes: \"F99\" is not a dtype (known: F32, F16,")
        );
        assert!(err("sim:dtypes=").contains("dtypes: \"\" is not a dtype"));
        assert!(err("sim:dtypes=F32|f32").contains("dtypes: F32 is named twice"));
    }
}

/// Which CUDA device a spec names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaOrdinal {
    /// The device with this ordinal (`cuda:0`).
    Index(u32),
    /// Every device (`cuda:all`): where local workers are started, one
    /// worker process per GPU, each given `cuda:N` with the same keys. A
    /// single chip cannot be built from it.
    All,
}

/// A parsed CUDA chip spec: `cuda:0`, `cuda:1,mem=8GiB,streams=8`,
/// `cuda:all`.
///
/// Grammar: `cuda[:ORDINAL][,KEY=VALUE]*` where `ORDINAL` is a device
/// number or `all` (default 0). Keys:
///
/// | key | value | default |
/// |---|---|---|
/// | `mem` | device memory the chip manages, a size | 90 % of the memory free when it starts |
/// | `run` | bytes of the per-run region | mem/4 |
/// | `scratch` | bytes of the per-kernel scratch region (staged copies, temporaries) | mem/4 |
/// | `streams` | CUDA streams, each a lane that runs one launch at a time, 1..=64: copies on one overlap kernels on another | 4 |
/// | `prefetch` | `on`: a launch waiting for a stream has its bytes copied into the device cache meanwhile, on a stream of its own | on |
///
/// A CUDA chip is always staged: host bytes are copied into device memory
/// (by DMA from the page-locked buffer) before a kernel and back after it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CudaSpec {
    /// The device.
    pub ordinal: CudaOrdinal,
    /// Device memory to manage; `None`: 90 % of what is free at start.
    pub mem: Option<u64>,
    /// Bytes of the run region; `None`: a quarter of `mem`.
    pub run: Option<u64>,
    /// Bytes of the scratch region; `None`: a quarter of `mem`.
    pub scratch: Option<u64>,
    /// Streams (lanes).
    pub streams: usize,
    /// Copy the bytes of launches waiting for a stream ahead of them.
    pub prefetch: bool,
}

impl CudaSpec {
    /// The same spec for device `ordinal` (how `cuda:all` becomes one
    /// spec per GPU).
    pub fn for_device(&self, ordinal: u32) -> CudaSpec {
        CudaSpec {
            ordinal: CudaOrdinal::Index(ordinal),
            ..self.clone()
        }
    }

    /// The region sizes for a chip managing `mem` bytes: (mem, run,
    /// scratch), 64-byte aligned and checked as a sim spec's are.
    ///
    /// # Errors
    /// [`Error::Spec`] naming what does not fit.
    pub fn regions(&self, mem: u64) -> Result<(u64, u64, u64), Error> {
        let bad = |reason: String| Error::Spec {
            spec: self.to_string(),
            reason,
        };
        let align = |v: u64| v / BLOCK_ALIGN * BLOCK_ALIGN;
        let mem = align(mem);
        if mem < MIN_MEM {
            return Err(bad(format!(
                "mem: {mem} bytes is below the minimum of {MIN_MEM}"
            )));
        }
        let run = align(self.run.unwrap_or(mem / 4));
        let scratch = align(self.scratch.unwrap_or(mem / 4));
        let persistent = mem
            .checked_sub(run)
            .and_then(|r| r.checked_sub(scratch))
            .ok_or_else(|| {
                bad(format!(
                    "run ({run}) + scratch ({scratch}) exceed mem ({mem})"
                ))
            })?;
        for (name, bytes) in [
            ("persistent", persistent),
            ("run", run),
            ("scratch", scratch),
        ] {
            if bytes > MAX_REGION_BYTES {
                return Err(bad(format!(
                    "the {name} region would be {bytes} bytes; at most {MAX_REGION_BYTES} are supported"
                )));
            }
        }
        if scratch == 0 {
            return Err(bad(
                "a CUDA chip stages host bytes and needs a scratch region (scratch > 0)".into(),
            ));
        }
        Ok((mem, run, scratch))
    }
}

impl FromStr for CudaSpec {
    type Err = Error;

    fn from_str(spec: &str) -> Result<Self, Error> {
        let bad = |reason: String| Error::Spec {
            spec: spec.to_owned(),
            reason,
        };
        let rest = match spec.split_once(':') {
            Some(("cuda", rest)) => rest,
            None if spec == "cuda" => "",
            _ => return Err(bad("a CUDA spec starts with cuda".into())),
        };
        let mut items = rest.split(',').filter(|s| !s.is_empty()).peekable();
        let mut ordinal = CudaOrdinal::Index(0);
        if let Some(first) = items.peek()
            && !first.contains('=')
        {
            ordinal = match *first {
                "all" => CudaOrdinal::All,
                n => CudaOrdinal::Index(n.parse().map_err(|_| {
                    bad(format!(
                        "{n:?} is not a device number or all (cuda:0, cuda:all)"
                    ))
                })?),
            };
            items.next();
        }
        let (mut mem, mut run, mut scratch, mut streams, mut prefetch) =
            (None, None, None, None, None);
        for item in items {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("{item:?} is not KEY=VALUE")))?;
            let taken = match key {
                "mem" => mem
                    .replace(parse_size(value).map_err(|r| bad(format!("mem: {r}")))?)
                    .is_some(),
                "run" => run
                    .replace(parse_size(value).map_err(|r| bad(format!("run: {r}")))?)
                    .is_some(),
                "scratch" => scratch
                    .replace(parse_size(value).map_err(|r| bad(format!("scratch: {r}")))?)
                    .is_some(),
                "streams" => {
                    let n: usize = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=64).contains(n))
                        .ok_or_else(|| {
                            bad(format!("streams: {value:?} is not a number from 1 to 64"))
                        })?;
                    streams.replace(n).is_some()
                }
                "prefetch" => {
                    let on = match value {
                        "on" => true,
                        "off" => false,
                        other => {
                            return Err(bad(format!("prefetch: {other:?} is not on or off")));
                        }
                    };
                    prefetch.replace(on).is_some()
                }
                other => {
                    return Err(bad(format!(
                        "unknown key {other:?} (known for cuda: mem, run, scratch, streams, prefetch)"
                    )));
                }
            };
            if taken {
                return Err(bad(format!("{key} is given twice")));
            }
        }
        let parsed = CudaSpec {
            ordinal,
            mem,
            run,
            scratch,
            streams: streams.unwrap_or(4),
            prefetch: prefetch.unwrap_or(true),
        };
        if let Some(m) = mem {
            parsed.regions(m).map_err(|e| match e {
                Error::Spec { reason, .. } => bad(reason),
                other => other,
            })?;
        }
        Ok(parsed)
    }
}

impl fmt::Display for CudaSpec {
    /// The canonical form: parsing it gives the same spec.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ordinal {
            CudaOrdinal::Index(n) => write!(f, "cuda:{n}")?,
            CudaOrdinal::All => write!(f, "cuda:all")?,
        }
        for (key, v) in [
            ("mem", self.mem),
            ("run", self.run),
            ("scratch", self.scratch),
        ] {
            if let Some(v) = v {
                write!(f, ",{key}={}", format_size(v))?;
            }
        }
        write!(
            f,
            ",streams={},prefetch={}",
            self.streams,
            if self.prefetch { "on" } else { "off" }
        )
    }
}

/// A spec of any kind of chip: what `--device` takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ChipSpec {
    /// The simulated chip (`sim...`).
    Sim(DeviceSpec),
    /// A CUDA GPU (`cuda...`).
    Cuda(CudaSpec),
}

impl ChipSpec {
    /// `sim` or `cuda`.
    pub fn kind(&self) -> &'static str {
        match self {
            ChipSpec::Sim(_) => "sim",
            ChipSpec::Cuda(_) => "cuda",
        }
    }
}

impl FromStr for ChipSpec {
    type Err = Error;

    fn from_str(spec: &str) -> Result<Self, Error> {
        let kind = spec.split_once(':').map_or(spec, |(k, _)| k);
        match kind {
            "sim" => spec.parse().map(ChipSpec::Sim),
            "cuda" => spec.parse().map(ChipSpec::Cuda),
            other => Err(Error::Spec {
                spec: spec.to_owned(),
                reason: format!("unknown device kind {other:?} (known: sim, cuda)"),
            }),
        }
    }
}

impl fmt::Display for ChipSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChipSpec::Sim(s) => s.fmt(f),
            ChipSpec::Cuda(s) => s.fmt(f),
        }
    }
}
