//! `strata devices`: the chips this machine offers — the simulated one
//! always, and what CUDA is here (the driver, each GPU, each library with
//! its version and the file loaded), so that a missing or mismatched
//! piece shows before a worker refuses to start.

use std::process::ExitCode;

use strata_chip_runtime::cuda::{Found, Inventory, Library};

/// Prints the inventory; exit status 0 when a `cuda:N` chip opens here,
/// 1 when something CUDA needs is missing (the simulated chip is always
/// there).
pub fn run() -> ExitCode {
    let inv = strata_chip_runtime::cuda::inventory();
    say!("{}", report(&inv));
    if inv.usable() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The inventory as lines of text.
pub fn report(inv: &Inventory) -> String {
    let mut out = vec!["sim: the simulated chip (always here)".to_owned()];
    let found = |f: &Found| match &f.path {
        Some(p) => format!("{} ({p})", f.version),
        None => f.version.clone(),
    };
    match &inv.driver {
        Ok(d) => out.push(format!("CUDA driver: CUDA {}", found(d))),
        Err(e) => out.push(format!("CUDA driver: {e}")),
    }
    for g in &inv.gpus {
        out.push(format!(
            "cuda:{}: {}, {:.1} GiB, compute capability {}.{}, compute mode {}",
            g.ordinal,
            g.name,
            g.memory as f64 / f64::from(1u32 << 30),
            g.capability.0,
            g.capability.1,
            g.compute_mode
        ));
        if g.compute_mode != "default" {
            out.push(format!(
                "  (compute mode {}: a second process cannot use this GPU — a second worker, or the driver mapping a shared buffer)",
                g.compute_mode
            ));
        }
    }
    if inv.driver.is_ok() && inv.gpus.is_empty() {
        out.push("no GPU: the driver sees none".to_owned());
    }
    for (lib, l) in &inv.libraries {
        let name = match lib {
            Library::Nvrtc => "NVRTC",
            Library::Cublas => "cuBLAS",
            Library::Cusolver => "cuSOLVER",
            Library::Driver => "driver",
        };
        match l {
            Ok(f) => out.push(format!("{name}: {}", found(f))),
            Err(e) => out.push(format!("{name}: {e}")),
        }
    }
    if let Some(m) = inv.mismatch() {
        out.push(format!("warning: {m}"));
    }
    out.push(if inv.usable() {
        let chips: Vec<String> = inv
            .gpus
            .iter()
            .map(|g| format!("cuda:{}", g.ordinal))
            .collect();
        format!("chips that open here: sim, {}", chips.join(", "))
    } else {
        "no cuda chip opens here".to_owned()
    });
    out.join("\n")
}
