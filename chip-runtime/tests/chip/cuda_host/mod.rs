//! The built-in CUDA sources built for the host: each source, with the
//! prelude in front and `cuda_shim.h` before both, is compiled by the
//! system C++ compiler into one shared library, next to a wrapper per
//! entry that runs a launch (`strata_run_<symbol>`), and a few functions
//! that expose the prelude's conversions. [`oracle`] runs them against
//! the CPU kernels.
//!
//! The compiler is `$CXX`, else the first of `c++`, `g++`, `clang++`
//! that runs; without one, the tests that need it say so in one line and
//! pass, unless `STRATA_REQUIRE_CXX=1` (CI sets it).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, Once, OnceLock};

use strata_chip_runtime::Signature;
use strata_chip_runtime::kernel::builtin;
use strata_chip_runtime::kernel::cuda::{CUDA_PRELUDE, CudaBody, CudaSource};
use strata_wire::ChipTensor;

mod compare;
mod data;
mod oracle;

const SHIM: &str = include_str!("shim.h");

/// Flags for the host build: the sources' float arithmetic rounds as
/// written (no contraction into fused multiply-add, as NVRTC is told too).
const FLAGS: &[&str] = &[
    "-std=c++17",
    "-O1",
    "-fPIC",
    "-pthread",
    "-ffp-contract=off",
    "-Wall",
    "-Wno-psabi",
];

/// The prelude's conversions the library exposes, by C name.
const CONVERSIONS: &str = r#"
extern "C" unsigned short strata_test_f16_from_float(float v) { return strata_f16_from_float(v).bits; }
extern "C" unsigned short strata_test_f16_from_double(double v) { return strata_f16_from_double(v).bits; }
extern "C" float strata_test_f16_to_float(unsigned short b) { strata_f16 h; h.bits = b; return strata_f16_to_float(h); }
extern "C" unsigned short strata_test_bf16_from_float(float v) { return strata_bf16_from_float(v).bits; }
extern "C" unsigned short strata_test_bf16_from_double(double v) { return strata_bf16_from_double(v).bits; }
extern "C" float strata_test_bf16_to_float(unsigned short b) { strata_bf16 h; h.bits = b; return strata_bf16_to_float(h); }
"#;

/// The built-in kernels with a source body.
pub(crate) fn sources() -> Vec<(Signature, CudaSource)> {
    builtin::all()
        .iter()
        .filter_map(|k| match k.cuda() {
            Some(CudaBody::Source(s)) => Some((k.descriptor().clone(), s.clone())),
            _ => None,
        })
        .collect()
}

/// The host build of the sources, loaded.
pub(crate) struct HostKernels {
    lib: libloading::Library,
    _dir: tempfile::TempDir,
}

/// One launch at a time: `__shared__` arrays are statics of the library.
static LAUNCH: Mutex<()> = Mutex::new(());

type RunFn = unsafe extern "C" fn(*const ChipTensor, *const u64, u32, u32, u32);

/// The launch shape of an emulated launch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Blocks along x and y.
    pub(crate) blocks: (u32, u32),
    /// Threads a block (1: the blocks run on the caller's thread, no
    /// `__syncthreads` needed).
    pub(crate) threads: u32,
}

impl HostKernels {
    /// Runs entry `symbol` on `tensors` (their `addr` host pointers) and
    /// the scalar words, with launch shape `shape`.
    ///
    /// # Safety
    /// Every tensor's elements must lie in live memory the caller owns
    /// exclusively for the call, and `tensors` and `scalars` must be
    /// what the entry's kernel takes (count and dtypes).
    pub(crate) unsafe fn launch(
        &self,
        symbol: &str,
        tensors: &[ChipTensor],
        scalars: &[u64],
        shape: Shape,
    ) {
        let name = format!("strata_run_{symbol}");
        // SAFETY: every strata_run_ wrapper is generated below with
        // exactly this signature.
        let run: libloading::Symbol<'_, RunFn> = unsafe { self.lib.get(name.as_bytes()) }
            .unwrap_or_else(|e| panic!("{name} is not in the host build: {e}"));
        let _one = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the caller vouches for the tensors and scalars; the
        // wrapper reads as many of each as its kernel takes.
        unsafe {
            run(
                tensors.as_ptr(),
                scalars.as_ptr(),
                shape.blocks.0,
                shape.blocks.1,
                shape.threads,
            )
        };
    }

    /// Whether the library defines `name`.
    pub(crate) fn defines(&self, name: &str) -> bool {
        // SAFETY: the symbol is looked up, never called, so the function
        // type given for it does not matter.
        unsafe { self.lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok()
    }

    /// The exposed conversion `name` (see `CONVERSIONS`), typed `F`.
    ///
    /// # Safety
    /// `F` must be the function's C signature.
    pub(crate) unsafe fn conversion<F: Copy>(&self, name: &str) -> F {
        // SAFETY: the caller vouches for the type.
        let f: libloading::Symbol<'_, F> = unsafe { self.lib.get(name.as_bytes()) }
            .unwrap_or_else(|e| panic!("{name} is not in the host build: {e}"));
        *f
    }
}

/// The host build, made once per test run; `None` (said once) without
/// a C++ compiler.
pub(crate) fn host_kernels() -> Option<&'static HostKernels> {
    static BUILT: OnceLock<Option<HostKernels>> = OnceLock::new();
    static SAID: Once = Once::new();
    let built = BUILT.get_or_init(|| {
        let cxx = find_cxx()?;
        Some(build(&cxx))
    });
    if built.is_none() {
        assert!(
            std::env::var("STRATA_REQUIRE_CXX").as_deref() != Ok("1"),
            "STRATA_REQUIRE_CXX=1 but no C++ compiler ($CXX, c++, g++ or clang++) runs"
        );
        SAID.call_once(|| {
            let _ = writeln!(
                std::io::stderr(),
                "cuda sources on the CPU: skipped, no C++ compiler ($CXX, c++, g++ or clang++) runs (STRATA_REQUIRE_CXX=1 makes this a failure)"
            );
        });
    }
    built.as_ref()
}

fn find_cxx() -> Option<String> {
    let env = std::env::var("CXX").ok().filter(|c| !c.is_empty());
    env.into_iter()
        .chain(["c++", "g++", "clang++"].map(String::from))
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// The wrapper that launches `symbol` of a kernel with signature `desc`.
fn wrapper(desc: &Signature, symbol: &str) -> String {
    let params: Vec<String> = (0..desc.args.len())
        .map(|i| format!("t[{i}]"))
        .chain((0..desc.scalars.len()).map(|i| format!("s[{i}]")))
        .collect();
    format!(
        "extern \"C\" void strata_run_{symbol}(const strata_tensor* t, const unsigned long long* s, \
         unsigned int bx, unsigned int by, unsigned int threads) {{\n\
         \x20   (void)t; (void)s;\n\
         \x20   strata_launch(bx, by, threads, [&] {{ {symbol}({}); }});\n\
         }}\n",
        params.join(", ")
    )
}

/// A translation unit: the shim, the prelude, then `body`.
fn unit(name: &str, body: &str) -> String {
    format!(
        "#include \"shim.h\"\n#line 1 \"prelude.cuh\"\n{CUDA_PRELUDE}\n#line 1 \"{name}\"\n{body}\n"
    )
}

fn build(cxx: &str) -> HostKernels {
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n);
    std::fs::write(path("shim.h"), SHIM).unwrap();
    let mut units = vec![("conversions".to_owned(), unit("conversions", CONVERSIONS))];
    for (desc, source) in sources() {
        let mut body = format!("{}\n#line 1 \"{}-wrappers\"\n", source.code, desc.name);
        for symbol in source.symbols(&desc) {
            body.push_str(&wrapper(&desc, &symbol));
        }
        units.push((desc.name.clone(), unit(&format!("{}.cu", desc.name), &body)));
    }
    // The units compile side by side; each is a few seconds.
    let children: Vec<(String, PathBuf, std::process::Child)> = units
        .iter()
        .map(|(name, text)| {
            let src = path(&format!("{name}.cpp"));
            let obj = path(&format!("{name}.o"));
            std::fs::write(&src, text).unwrap();
            let child = Command::new(cxx)
                .args(FLAGS)
                .arg("-c")
                .arg(&src)
                .arg("-o")
                .arg(&obj)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{cxx}: {e}"));
            (name.clone(), obj, child)
        })
        .collect();
    let mut objects = Vec::new();
    for (name, obj, child) in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{cxx} does not compile {name} for the host:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        objects.push(obj);
    }
    let lib = path("libstrata_cuda_host.so");
    link(cxx, &objects, &lib);
    // SAFETY: the library is the one just built from the sources; its
    // initializers are those of the C++ standard library's headers.
    let lib = unsafe { libloading::Library::new(&lib) }
        .unwrap_or_else(|e| panic!("loading the host build: {e}"));
    HostKernels { lib, _dir: dir }
}

fn link(cxx: &str, objects: &[PathBuf], lib: &Path) {
    let out = Command::new(cxx)
        .args(["-shared", "-pthread", "-o"])
        .arg(lib)
        .args(objects)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cxx} does not link the host build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
