//! Kernel sources to PTX or CUBIN with NVRTC, cached on disk.
//!
//! [`compile`] takes a kernel's CUDA source, puts
//! [`CUDA_PRELUDE`] in front of it and compiles it to PTX for one
//! architecture (or NVRTC's default); [`compile_cubin`] compiles it to
//! machine code for one GPU architecture (`sm_90`), which is what a chip
//! loads: a CUBIN from any NVRTC of the driver's major version loads
//! without the driver compiling anything, while PTX newer than the
//! driver does not load at all. Both go in these steps:
//!
//! 1. ask whether `libnvrtc.so.13` loads ([`require_library`]): the loader
//!    panics on a missing library, so absence must be a typed error first;
//! 2. compute the cache key: SHA-256 of the prelude, the source, the
//!    options and NVRTC's version, each length-prefixed;
//! 3. look for `<key>.ptx` in the cache directory; a file whose header
//!    does not carry the SHA-256 of the PTX that follows it (truncated,
//!    corrupt, written by something else) is not used;
//! 4. otherwise compile, and store the PTX under its key: written to a
//!    temporary file in the same directory, then renamed over the name,
//!    so a reader sees a whole file or none.
//!
//! The cache directory is `$STRATA_PTX_CACHE`, else
//! `$XDG_CACHE_HOME/strata/ptx`, else `~/.cache/strata/ptx`. A directory
//! that cannot be created, read or written only means compiling without
//! the cache: it is never an error.
//!
//! Every source compiles with `--std=c++17`, `--fmad=false` (no fused
//! multiply-add, so that a kernel rounds exactly as the CPU kernels do)
//! and no include path: a source sees the prelude and nothing else.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::cuda::probe::{Library, require_library};
use crate::error::CudaError;
use crate::kernel::Signature;
use crate::kernel::cuda::{CUDA_PRELUDE, CudaSource};

/// Options every source compiles with (the architecture comes after).
pub const OPTIONS: &[&str] = &["--std=c++17", "--fmad=false", "--no-source-include"];

/// The first line of a cached file, before the SHA-256 of the PTX.
const HEADER: &str = "// strata ptx cache 1 sha256:";

/// The first line of a cached CUBIN, before the SHA-256 of its bytes.
const CUBIN_HEADER: &str = "// strata cubin cache 1 sha256:";

/// Machine code for one GPU architecture, as NVRTC wrote it (an ELF
/// image): what `cuModuleLoadData` takes as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cubin(Vec<u8>);

impl Cubin {
    /// The image.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether it is an ELF image (NVRTC's CUBINs are).
    pub fn is_elf(&self) -> bool {
        self.0.starts_with(b"\x7fELF")
    }

    /// Whether its string table names `symbol` (a whole, NUL-delimited
    /// name, as an ELF symbol table holds each kernel's).
    pub fn names(&self, symbol: &str) -> bool {
        let mut want = Vec::with_capacity(symbol.len() + 2);
        want.push(0);
        want.extend_from_slice(symbol.as_bytes());
        want.push(0);
        self.0.windows(want.len()).any(|w| w == want.as_slice())
    }
}

/// PTX text, as NVRTC wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ptx(String);

impl Ptx {
    /// The PTX (what `cuModuleLoadData` takes, once NUL-terminated; or
    /// `cudarc::nvrtc::Ptx::from_src`).
    pub fn text(&self) -> &str {
        &self.0
    }

    /// The PTX, owned.
    pub fn into_text(self) -> String {
        self.0
    }

    /// The kernels it defines: the names of its `.entry` directives.
    pub fn entries(&self) -> Vec<&str> {
        let mut out = Vec::new();
        let mut rest = self.0.as_str();
        while let Some(at) = rest.find(".entry") {
            rest = &rest[at + ".entry".len()..];
            if !rest.starts_with(char::is_whitespace) {
                continue;
            }
            let name = rest.trim_start();
            let end = name
                .find(|c: char| c == '(' || c.is_whitespace())
                .unwrap_or(name.len());
            if end > 0 {
                out.push(&name[..end]);
            }
        }
        out
    }

    /// Whether it defines the kernel `symbol`.
    pub fn has_entry(&self, symbol: &str) -> bool {
        self.entries().contains(&symbol)
    }
}

/// A compilation's result and whether it came from the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// The PTX.
    pub ptx: Ptx,
    /// Read from the cache rather than compiled.
    pub cached: bool,
}

/// Compiles `code` (a source without the prelude) for `arch` (such as
/// `compute_90`; `None`: NVRTC's default), through the cache directory
/// the environment names (module docs).
///
/// `kernel` names the kernel in errors (`name@version`).
///
/// # Errors
/// [`CudaError::LibraryMissing`] without NVRTC; [`CudaError::Compile`]
/// with NVRTC's log when the source does not compile (or holds a NUL
/// byte, or `arch` is not an architecture's name).
pub fn compile(kernel: &str, code: &str, arch: Option<&str>) -> Result<Ptx, CudaError> {
    compile_cached(kernel, code, arch, PtxCache::from_env().as_ref()).map(|c| c.ptx)
}

/// [`compile`] through `cache` (`None`: no cache).
///
/// # Errors
/// As [`compile`].
pub fn compile_cached(
    kernel: &str,
    code: &str,
    arch: Option<&str>,
    cache: Option<&PtxCache>,
) -> Result<Compiled, CudaError> {
    require_library(Library::Nvrtc)?;
    let refuse = |log: String| CudaError::Compile {
        kernel: kernel.to_owned(),
        log,
    };
    let options = options(arch).map_err(refuse)?;
    if let Some(at) = code.find('\0') {
        return Err(refuse(format!("the source holds a NUL byte at byte {at}")));
    }
    let key = cache_key(CUDA_PRELUDE, code, &options, &nvrtc_version());
    if let Some(ptx) = cache.and_then(|c| c.load(&key)) {
        return Ok(Compiled { ptx, cached: true });
    }
    let bytes = run_nvrtc(kernel, code, &options, Output::Ptx).map_err(refuse)?;
    let ptx = Ptx(String::from_utf8_lossy(&bytes).into_owned());
    if let Some(c) = cache {
        c.store(&key, &ptx);
    }
    Ok(Compiled { ptx, cached: false })
}

/// Compiles `code` (a source without the prelude) to machine code for
/// `arch`, a real architecture (`sm_90`), through the cache directory
/// the environment names (module docs; a CUBIN is kept beside the PTX
/// under the same key, as `<key>.cubin`).
///
/// # Errors
/// As [`compile`]; also when `arch` is a virtual architecture
/// (`compute_90`: PTX only).
pub fn compile_cubin(kernel: &str, code: &str, arch: &str) -> Result<Cubin, CudaError> {
    compile_cubin_cached(kernel, code, arch, PtxCache::from_env().as_ref()).map(|(c, _)| c)
}

/// [`compile_cubin`] through `cache` (`None`: no cache); also says
/// whether the CUBIN came from the cache.
///
/// # Errors
/// As [`compile_cubin`].
pub fn compile_cubin_cached(
    kernel: &str,
    code: &str,
    arch: &str,
    cache: Option<&PtxCache>,
) -> Result<(Cubin, bool), CudaError> {
    require_library(Library::Nvrtc)?;
    let refuse = |log: String| CudaError::Compile {
        kernel: kernel.to_owned(),
        log,
    };
    if !arch.starts_with("sm_") {
        return Err(refuse(format!(
            "a CUBIN is machine code for a real architecture (sm_90), not {arch:?}"
        )));
    }
    let options = options(Some(arch)).map_err(refuse)?;
    if let Some(at) = code.find('\0') {
        return Err(refuse(format!("the source holds a NUL byte at byte {at}")));
    }
    let key = cache_key(CUDA_PRELUDE, code, &options, &nvrtc_version());
    if let Some(cubin) = cache.and_then(|c| c.load_cubin(&key)) {
        return Ok((cubin, true));
    }
    let cubin = Cubin(run_nvrtc(kernel, code, &options, Output::Cubin).map_err(refuse)?);
    if let Some(c) = cache {
        c.store_cubin(&key, &cubin);
    }
    Ok((cubin, false))
}

/// Compiles a kernel's source body for `arch` ([`compile`]) and checks
/// that the PTX defines every entry a launch may call
/// ([`check_entries`]).
///
/// # Errors
/// As [`compile`] and [`check_entries`].
pub fn compile_source(
    desc: &Signature,
    source: &CudaSource,
    arch: Option<&str>,
) -> Result<Ptx, CudaError> {
    let ptx = compile(&desc.qualified_name(), &source.code, arch)?;
    check_entries(desc, source, &ptx)?;
    Ok(ptx)
}

/// Checks that `ptx`, compiled from `source`, defines every function a
/// launch of a kernel with signature `desc` may call
/// ([`CudaSource::symbols`]).
///
/// # Errors
/// [`CudaError::Compile`] naming the missing entries.
pub fn check_entries(desc: &Signature, source: &CudaSource, ptx: &Ptx) -> Result<(), CudaError> {
    let missing: Vec<String> = source
        .symbols(desc)
        .into_iter()
        .filter(|s| !ptx.has_entry(s))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(CudaError::Compile {
        kernel: desc.qualified_name(),
        log: format!(
            "the source compiles but does not define entries {} (each an extern \"C\" __global__ function)",
            missing.join(", ")
        ),
    })
}

/// The options for `arch`.
fn options(arch: Option<&str>) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = OPTIONS.iter().map(|o| (*o).to_owned()).collect();
    if let Some(a) = arch {
        let well_formed = a.split_once('_').is_some_and(|(family, number)| {
            !family.is_empty()
                && family.chars().all(|c| c.is_ascii_lowercase())
                && number.starts_with(|c: char| c.is_ascii_digit())
                && number.chars().all(|c| c.is_ascii_alphanumeric())
        });
        if !well_formed {
            return Err(format!(
                "architecture {a:?} is not an architecture's name (compute_90, sm_80)"
            ));
        }
        out.push(format!("--gpu-architecture={a}"));
    }
    Ok(out)
}

/// NVRTC's version, `major.minor` (part of the cache key: another NVRTC
/// may write other PTX).
fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC was found loadable (require_library, before every
    // call here), and nvrtcVersion only writes two ints through the
    // pointers, which point at live locals.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        format!("{major}.{minor}")
    } else {
        format!("unknown ({status:?})")
    }
}

/// What a compilation hands back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    /// The PTX text (without its closing NUL).
    Ptx,
    /// The CUBIN image.
    Cubin,
}

/// Compiles the prelude and `code` with NVRTC; on failure, its log.
fn run_nvrtc(
    kernel: &str,
    code: &str,
    options: &[String],
    output: Output,
) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    let source = std::ffi::CString::new(format!("{CUDA_PRELUDE}\n{code}"))
        .map_err(|_| "the source holds a NUL byte".to_owned())?;
    // The program's name appears in NVRTC's log, before each line number
    // (graphic characters only: no NUL).
    let name: String = kernel
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .chain(".cu".chars())
        .collect();
    let name = std::ffi::CString::new(name).map_err(|_| "a NUL in the kernel's name".to_owned())?;
    let prog = result::create_program(&source, Some(&name))
        .map_err(|e| format!("nvrtcCreateProgram: {:?}", e.0))?;
    // SAFETY: `prog` is live from its creation to the destroy below, and
    // `source` and `name`, which it may point into, outlive it; every
    // buffer passed is as long as NVRTC said.
    unsafe {
        let out = match result::compile_program(prog, options) {
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| c_text(&l).trim_end().to_owned())
                    .unwrap_or_default();
                Err(if log.is_empty() {
                    format!("{:?}", e.0)
                } else {
                    log
                })
            }
            Ok(()) => match output {
                Output::Ptx => result::get_ptx(prog)
                    .map(|p| c_text(&p).into_bytes())
                    .map_err(|e| format!("nvrtcGetPTX: {:?}", e.0)),
                Output::Cubin => {
                    let mut size = 0usize;
                    let r = sys::nvrtcGetCUBINSize(prog, &mut size);
                    if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                        Err(format!(
                            "NVRTC gave no CUBIN ({r:?}, {size} bytes): a CUBIN needs a real architecture"
                        ))
                    } else {
                        let mut image = vec![0u8; size];
                        let r = sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast());
                        if r == sys::nvrtcResult::NVRTC_SUCCESS {
                            Ok(image)
                        } else {
                            Err(format!("nvrtcGetCUBIN: {r:?}"))
                        }
                    }
                }
            },
        };
        let _ = result::destroy_program(prog);
        out
    }
}

/// The text of a NUL-terminated C string NVRTC wrote.
fn c_text(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The cache key of a compilation: the hex SHA-256 of its inputs, each
/// length-prefixed so that no two different inputs run together.
pub fn cache_key(prelude: &str, code: &str, options: &[String], nvrtc: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"strata-ptx 1");
    let opts = options.join("\n");
    for part in [prelude, code, opts.as_str(), nvrtc] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A directory of compiled PTX, one file per cache key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxCache {
    dir: PathBuf,
}

impl PtxCache {
    /// The cache in `dir` (created when first written).
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        PtxCache { dir: dir.into() }
    }

    /// The cache the environment names (module docs), if it names one.
    pub fn from_env() -> Option<Self> {
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        cache_dir(var("STRATA_PTX_CACHE"), var("XDG_CACHE_HOME"), var("HOME")).map(Self::at)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the PTX of `key` is kept.
    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.ptx"))
    }

    /// Where the CUBIN of `key` is kept.
    pub fn cubin_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.cubin"))
    }

    /// The PTX stored under `key`, if a whole, intact file is there.
    pub fn load(&self, key: &str) -> Option<Ptx> {
        let body = load_checked(&self.path(key), HEADER)?;
        String::from_utf8(body).ok().map(Ptx)
    }

    /// The CUBIN stored under `key`, if a whole, intact file is there.
    pub fn load_cubin(&self, key: &str) -> Option<Cubin> {
        load_checked(&self.cubin_path(key), CUBIN_HEADER).map(Cubin)
    }

    /// Stores `ptx` under `key`; a failure leaves no file behind and is
    /// otherwise ignored (the next compilation compiles again).
    pub fn store(&self, key: &str, ptx: &Ptx) {
        self.store_checked(key, &self.path(key), HEADER, ptx.0.as_bytes());
    }

    /// Stores `cubin` under `key`, as [`PtxCache::store`].
    pub fn store_cubin(&self, key: &str, cubin: &Cubin) {
        self.store_checked(key, &self.cubin_path(key), CUBIN_HEADER, &cubin.0);
    }

    /// Writes `header`, the SHA-256 of `body`, a newline and `body` to a
    /// temporary file, then renames it to `path`.
    fn store_checked(&self, key: &str, path: &Path, header: &str, body: &[u8]) {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        if fs::create_dir_all(&self.dir).is_err() {
            return;
        }
        let tmp = self.dir.join(format!(
            ".{key}.{}.{}.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let sum = hex(&Sha256::digest(body));
        let written = fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(format!("{header}{sum}\n").as_bytes())?;
            f.write_all(body)?;
            f.sync_all()
        });
        if written.and_then(|()| fs::rename(&tmp, path)).is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }
}

/// The body of the file at `path` if its first line is `header` and the
/// SHA-256 of what follows that line.
fn load_checked(path: &Path, header: &str) -> Option<Vec<u8>> {
    let bytes = fs::read(path).ok()?;
    let at = bytes.iter().position(|&b| b == b'\n')?;
    let (first, body) = (&bytes[..at], &bytes[at + 1..]);
    let sum = std::str::from_utf8(first).ok()?.strip_prefix(header)?;
    (sum == hex(&Sha256::digest(body))).then(|| body.to_vec())
}

/// The cache directory from `$STRATA_PTX_CACHE`, `$XDG_CACHE_HOME` and
/// `$HOME` (each `None` when unset or empty); an `XDG_CACHE_HOME` that is
/// not absolute is ignored, as the XDG rules say.
fn cache_dir(
    strata: Option<std::ffi::OsString>,
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    if let Some(dir) = strata {
        return Some(dir.into());
    }
    if let Some(x) = xdg.map(PathBuf::from).filter(|p| p.is_absolute()) {
        return Some(x.join("strata").join("ptx"));
    }
    home.map(|h| PathBuf::from(h).join(".cache").join("strata").join("ptx"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptx(text: &str) -> Ptx {
        Ptx(text.to_owned())
    }

    #[test]
    fn entries_are_the_names_after_entry_directives() {
        let p = ptx(
            "//\n.version 8.0\n.visible .entry add_f32(\n .param .align 64 .b8 add_f32_param_0[128]\n)\n{\n}\n\
             .visible .entry noop()\n{\n}\n.func not_an_entry()\n// .entryx fake(\n",
        );
        assert_eq!(p.entries(), ["add_f32", "noop"]);
        assert!(p.has_entry("noop"));
        assert!(!p.has_entry("add"), "a prefix is not an entry");
        assert!(!p.has_entry("not_an_entry"));
    }

    #[test]
    fn the_key_changes_with_every_input_and_only_with_them() {
        let o = vec!["--std=c++17".to_owned()];
        let k = cache_key("p", "c", &o, "13.0");
        assert_eq!(k.len(), 64);
        assert_eq!(k, cache_key("p", "c", &o, "13.0"));
        assert_ne!(k, cache_key("q", "c", &o, "13.0"));
        assert_ne!(k, cache_key("p", "d", &o, "13.0"));
        assert_ne!(k, cache_key("p", "c", &[], "13.0"));
        assert_ne!(k, cache_key("p", "c", &o, "13.1"));
        // Length prefixes: moving a byte from one part to the next is a
        // different input.
        assert_ne!(
            cache_key("pc", "", &o, "13.0"),
            cache_key("p", "c", &o, "13.0")
        );
    }

    #[test]
    fn a_stored_file_loads_and_a_damaged_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let cache = PtxCache::at(dir.path().join("a/b"));
        let key = cache_key("p", "c", &[], "1.0");
        assert_eq!(cache.load(&key), None);
        let p = ptx(".version 8.0\n.visible .entry k()\n{\n}\n");
        cache.store(&key, &p);
        assert_eq!(cache.load(&key), Some(p.clone()));
        let names: Vec<_> = fs::read_dir(cache.dir()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left: {names:?}");

        let path = cache.path(&key);
        let whole = fs::read(&path).unwrap();
        fs::write(&path, &whole[..whole.len() - 3]).unwrap();
        assert_eq!(cache.load(&key), None, "a truncated file is not used");
        let mut flipped = whole.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 1;
        fs::write(&path, &flipped).unwrap();
        assert_eq!(cache.load(&key), None, "a changed byte is not used");
        fs::write(&path, p.text()).unwrap();
        assert_eq!(
            cache.load(&key),
            None,
            "a file without the header is not used"
        );
        cache.store(&key, &p);
        assert_eq!(cache.load(&key), Some(p), "storing again repairs it");

        // A CUBIN is binary, kept beside the PTX under the same key.
        let c = Cubin(b"\x7fELF\0k\0\n\xff\n".to_vec());
        assert_eq!(cache.load_cubin(&key), None);
        cache.store_cubin(&key, &c);
        assert_eq!(cache.load_cubin(&key), Some(c.clone()));
        assert!(cache.load(&key).is_some(), "the PTX is still there");
        let path = cache.cubin_path(&key);
        let mut whole = fs::read(&path).unwrap();
        let last = whole.len() - 1;
        whole[last] ^= 1;
        fs::write(&path, &whole).unwrap();
        assert_eq!(cache.load_cubin(&key), None, "a changed byte is not used");
        assert!(c.is_elf() && c.names("k") && !c.names("K"));
    }

    #[test]
    fn an_unusable_directory_only_means_no_cache() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"x").unwrap();
        // A directory below a regular file can be neither made nor read.
        let cache = PtxCache::at(file.join("ptx"));
        cache.store("k", &ptx("x"));
        assert_eq!(cache.load("k"), None);
    }

    #[test]
    fn the_directory_comes_from_strata_then_xdg_then_home() {
        let s = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(
            cache_dir(s("/c"), s("/x"), s("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            cache_dir(None, s("/x"), s("/h")),
            Some(PathBuf::from("/x/strata/ptx"))
        );
        assert_eq!(
            cache_dir(None, s("relative"), s("/h")),
            Some(PathBuf::from("/h/.cache/strata/ptx"))
        );
        assert_eq!(cache_dir(None, None, None), None);
    }

    #[test]
    fn options_name_the_architecture_or_refuse_it() {
        let o = options(Some("compute_90")).unwrap();
        assert_eq!(o.last().unwrap(), "--gpu-architecture=compute_90");
        assert!(options(Some("sm_90a")).is_ok());
        assert_eq!(options(None).unwrap().len(), OPTIONS.len());
        for bad in ["", "90", "compute_", "compute_90 --x", "Compute_90", "_90"] {
            let e = options(Some(bad)).unwrap_err();
            assert!(e.contains("not an architecture's name"), "{bad}: {e}");
        }
    }
}
