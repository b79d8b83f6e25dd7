//! A worker binary built the way users build theirs: the built-in kernels
//! plus their own, here `test.panic` (panics on purpose) and `test.sleep`
//! (sleeps for its scalar's milliseconds), served by
//! `strata_worker::cli::run`.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use strata_chip::kernel::{KernelDescriptor, ScalarKind, ScalarSpec};
use strata_chip::{Kernel, KernelContext, Registry};

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    worker: strata_worker::cli::WorkerArgs,
}

struct Panic(KernelDescriptor);

impl Kernel for Panic {
    fn descriptor(&self) -> &KernelDescriptor {
        &self.0
    }
    fn run(&self, _: &mut KernelContext<'_>) -> Result<(), String> {
        panic!("test.panic was asked to panic");
    }
}

struct Sleep(KernelDescriptor);

impl Kernel for Sleep {
    fn descriptor(&self) -> &KernelDescriptor {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        std::thread::sleep(std::time::Duration::from_millis(ctx.scalar(0)?));
        Ok(())
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut kernels = Registry::with_builtins();
    let desc = |name: &str, scalars| KernelDescriptor {
        name: name.into(),
        version: 1,
        args: vec![],
        scalars,
    };
    let added = kernels
        .register(Arc::new(Panic(desc("test.panic", vec![]))))
        .and_then(|_| {
            kernels.register(Arc::new(Sleep(desc(
                "test.sleep",
                vec![ScalarSpec {
                    name: "ms".into(),
                    kind: ScalarKind::U64,
                }],
            ))))
        });
    if let Err(e) = added {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    strata_worker::cli::run(args.worker, kernels)
}
