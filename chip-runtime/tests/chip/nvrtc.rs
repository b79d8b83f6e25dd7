//! Every built-in kernel's CUDA source compiles with NVRTC, for
//! compute_80, compute_90 and sm_90 (through the assembler), into PTX that
//! defines every entry its signature's dtypes launch, and into the CUBIN
//! a chip loads (machine code for sm_80 and sm_90, naming every entry); a
//! broken source is a compile error carrying NVRTC's log; the cache hands
//! back what was compiled.
//!
//! Needs `libnvrtc.so.13` on the loader path. Without it these tests
//! print one line saying so and pass, unless `STRATA_REQUIRE_NVRTC=1`
//! (CI sets it, with NVRTC installed from PyPI's `nvidia-cuda-nvrtc`).

use std::io::Write;
use std::sync::Once;

use strata_chip_runtime::CudaError;
use strata_chip_runtime::cuda::nvrtc::{self, PtxCache};
use strata_chip_runtime::cuda::{Library, require_library};
use strata_chip_runtime::kernel::builtin;
use strata_chip_runtime::kernel::cuda::{CudaBody, CudaSource, Entry, Grid};

/// Virtual architectures (PTX only), and one real one: for `sm_90` NVRTC
/// also assembles the PTX to machine code, so the assembler accepts it.
const ARCHS: [&str; 3] = ["compute_80", "compute_90", "sm_90"];

/// Whether NVRTC loads; if not, says so once (past the test harness's
/// capture) or fails when `STRATA_REQUIRE_NVRTC=1`.
fn have_nvrtc() -> bool {
    static SAID: Once = Once::new();
    match require_library(Library::Nvrtc) {
        Ok(()) => true,
        Err(e) => {
            assert!(
                std::env::var("STRATA_REQUIRE_NVRTC").as_deref() != Ok("1"),
                "STRATA_REQUIRE_NVRTC=1 but NVRTC does not load: {e}"
            );
            SAID.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "nvrtc: skipped, libnvrtc.so.13 not found (set LD_LIBRARY_PATH; STRATA_REQUIRE_NVRTC=1 makes this a failure)"
                );
            });
            false
        }
    }
}

/// The built-ins with a source body.
fn sources() -> Vec<(strata_chip_runtime::Signature, CudaSource)> {
    builtin::all()
        .iter()
        .filter_map(|k| match k.cuda() {
            Some(CudaBody::Source(s)) => Some((k.descriptor().clone(), s.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn every_builtin_source_compiles_with_every_entry() {
    if !have_nvrtc() {
        return;
    }
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = PtxCache::at(cache_dir.path());
    let mut entries = 0;
    let mut kernels = 0;
    for (desc, source) in sources() {
        let kernel = desc.qualified_name();
        let symbols = source.symbols(&desc);
        assert!(!symbols.is_empty(), "{kernel}: no symbol expected");
        kernels += 1;
        for arch in ARCHS {
            let c = nvrtc::compile_cached(&kernel, &source.code, Some(arch), Some(&cache))
                .unwrap_or_else(|e| panic!("{kernel} for {arch}: {e}"));
            assert!(
                !c.cached,
                "{kernel} for {arch}: first compile came from the cache"
            );
            let ptx = c.ptx;
            assert!(
                ptx.text()
                    .contains(&format!(".target sm_{}", arch.rsplit('_').next().unwrap())),
                "{kernel}: PTX not for {arch}"
            );
            for s in &symbols {
                assert!(ptx.has_entry(s), "{kernel} for {arch}: no entry {s}");
            }
            assert_eq!(
                ptx.entries().len(),
                symbols.len(),
                "{kernel}: entries {:?}, expected {symbols:?}",
                ptx.entries()
            );
            // Fused multiply-add is off (it would round differently from
            // the CPU kernels); only exp's own code in softmax uses fma.
            if desc.name != "softmax" {
                assert!(!ptx.text().contains("fma."), "{kernel}: fma in the PTX");
            }
            nvrtc::check_entries(&desc, &source, &ptx).unwrap();
            // Tensor parameters are read in place: indexed by run-time
            // values they would be copied to local memory by each thread.
            assert!(
                !ptx.text().contains(".local"),
                "{kernel}: local memory in the PTX"
            );
            entries += symbols.len();
            let again =
                nvrtc::compile_cached(&kernel, &source.code, Some(arch), Some(&cache)).unwrap();
            assert!(again.cached, "{kernel} for {arch}: not found in the cache");
            assert_eq!(again.ptx, ptx, "{kernel} for {arch}: cached PTX differs");
        }
    }
    assert_eq!(kernels, 9, "the built-ins with a source body");
    println!(
        "nvrtc: {kernels} kernels, {} entries compiled for {ARCHS:?}",
        entries / ARCHS.len()
    );
}

/// What a chip loads: a CUBIN per real architecture, an ELF image that
/// names every entry, from the cache the second time; a virtual
/// architecture has no CUBIN.
#[test]
fn every_builtin_source_compiles_to_a_cubin_naming_every_entry() {
    if !have_nvrtc() {
        return;
    }
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = PtxCache::at(cache_dir.path());
    let mut kernels = 0;
    for (desc, source) in sources() {
        let kernel = desc.qualified_name();
        kernels += 1;
        for arch in ["sm_80", "sm_90"] {
            let (cubin, cached) =
                nvrtc::compile_cubin_cached(&kernel, &source.code, arch, Some(&cache))
                    .unwrap_or_else(|e| panic!("{kernel} for {arch}: {e}"));
            assert!(
                !cached,
                "{kernel} for {arch}: first compile came from the cache"
            );
            assert!(cubin.is_elf(), "{kernel} for {arch}: not an ELF image");
            for s in source.symbols(&desc) {
                assert!(cubin.names(&s), "{kernel} for {arch}: no symbol {s}");
            }
            assert!(!cubin.names("no_such_kernel"), "{kernel}: names anything");
            let (again, cached) =
                nvrtc::compile_cubin_cached(&kernel, &source.code, arch, Some(&cache)).unwrap();
            assert!(cached, "{kernel} for {arch}: not found in the cache");
            assert_eq!(again, cubin, "{kernel} for {arch}: cached CUBIN differs");
        }
    }
    assert_eq!(kernels, 9, "the built-ins with a source body");
    let (_, source) = sources().remove(0);
    match nvrtc::compile_cubin_cached("k@1", &source.code, "compute_90", None) {
        Err(CudaError::Compile { log, .. }) => assert!(log.contains("real architecture"), "{log}"),
        other => panic!("a CUBIN for a virtual architecture: {other:?}"),
    }
}

#[test]
fn a_broken_source_is_a_compile_error_with_the_log() {
    if !have_nvrtc() {
        return;
    }
    let code =
        "extern \"C\" __global__ void broken(strata_tensor t) {\n    undeclared_name(t);\n}\n";
    match nvrtc::compile_cached("broken@1", code, Some("compute_80"), None) {
        Err(CudaError::Compile { kernel, log }) => {
            assert_eq!(kernel, "broken@1");
            assert!(log.contains("undeclared_name"), "{log}");
            assert!(
                log.contains("broken@1.cu"),
                "the log names the source: {log}"
            );
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    match nvrtc::compile_cached("nul@1", "extern \"C\" __global__ void k() {}\0", None, None) {
        Err(CudaError::Compile { log, .. }) => assert!(log.contains("NUL byte at byte"), "{log}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
    match nvrtc::compile_cached("arch@1", "", Some("compute 90"), None) {
        Err(CudaError::Compile { log, .. }) => assert!(log.contains("compute 90"), "{log}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
    // A source that compiles but lacks entries its dtypes launch.
    let desc = builtin::all()
        .into_iter()
        .find(|k| k.descriptor().name == "add")
        .unwrap()
        .descriptor()
        .clone();
    let partial = CudaSource {
        code: "extern \"C\" __global__ void add_f32(strata_tensor a, strata_tensor b, strata_tensor o) {}"
            .into(),
        entry: Entry::PerDType("add".into()),
        grid: Grid::Elements(2),
    };
    let ptx = nvrtc::compile_cached("add@1", &partial.code, Some("compute_80"), None)
        .unwrap()
        .ptx;
    match nvrtc::check_entries(&desc, &partial, &ptx) {
        Err(CudaError::Compile { log, .. }) => {
            assert!(log.contains("add_f64") && log.contains("add_c128"), "{log}");
            assert!(!log.contains("add_f32,"), "add_f32 is defined: {log}");
        }
        other => panic!("expected missing entries, got {other:?}"),
    }
}

/// The sources of the CUDA chip's own tests and of the `SourceKernel`
/// example compile (the faulting one too: its fault is at run time); the
/// broken one does not.
#[test]
fn the_test_and_example_sources_compile() {
    if !have_nvrtc() {
        return;
    }
    for k in crate::cuda::sources() {
        let Some(CudaBody::Source(s)) = k.cuda() else {
            panic!("{} has no source", k.descriptor().qualified_name());
        };
        let name = k.descriptor().qualified_name();
        let r = nvrtc::compile(&name, &s.code, Some("compute_90"));
        if name.starts_with("broken") {
            assert!(matches!(r, Err(CudaError::Compile { .. })), "{name}");
        } else {
            let ptx = r.unwrap_or_else(|e| panic!("{name}: {e}"));
            let symbol = s.entry.symbol(None);
            assert!(
                ptx.text().contains(&format!(".entry {symbol}(")),
                "{name}: no entry {symbol}"
            );
        }
    }
}
