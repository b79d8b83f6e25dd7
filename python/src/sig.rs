//! A callable's signature as the Python layer keeps it: looked up once
//! per callable, and checked against each task at submit.

use pyo3::prelude::*;
use strata_chip_runtime::kernel::{DTypes, Rank, Signature};
use strata_wire::{Access, DType};

use crate::errors::raise;

/// A callable's signature, parsed from the canonical string the workers
/// report, with its `name@version` kept for messages.
#[derive(Debug)]
pub(crate) struct Sig {
    pub(crate) qualified: String,
    pub(crate) sig: Signature,
}

impl Sig {
    pub(crate) fn of(sig: Signature) -> Sig {
        Sig {
            qualified: sig.qualified_name(),
            sig,
        }
    }

    /// Checks the arguments' dtypes and ranks against the signature, as
    /// the worker would at launch: a task that would fail there is refused
    /// at submit, with nothing queued. Dtype names this build does not
    /// know (a newer worker's) leave that argument to the worker.
    pub(crate) fn check_args(&self, dtypes: &[DType], ranks: &[usize]) -> PyResult<()> {
        let args = &self.sig.args;
        let name = |i: usize| args.get(i).map_or("?", |a| a.name.as_str());
        let refuse = |i: usize, why: String| {
            raise(
                "SubmitError",
                format!("{}: argument {i} ({}): {why}", self.qualified, name(i)),
                &[],
            )
        };
        for (i, ((d, r), spec)) in dtypes.iter().zip(ranks).zip(args).enumerate() {
            match &spec.dtypes {
                DTypes::OneOf(list) if !list.contains(d) => {
                    let names: Vec<&str> = list.iter().map(|x| x.name()).collect();
                    return Err(refuse(
                        i,
                        format!(
                            "dtype {} is not accepted (accepted: {})",
                            d.name(),
                            names.join(", ")
                        ),
                    ));
                }
                DTypes::SameAs(j) if dtypes.get(*j).is_some_and(|dj| dj != d) => {
                    return Err(refuse(
                        i,
                        format!(
                            "dtype {} differs from argument {j} ({})'s {}: the kernel needs the same",
                            d.name(),
                            name(*j),
                            dtypes[*j].name()
                        ),
                    ));
                }
                _ => {}
            }
            let want = match spec.rank {
                Rank::Exactly(n) if *r != n => Some(format!("{n} axes")),
                Rank::AtLeast(n) if *r < n => Some(format!("at least {n} axes")),
                Rank::SameAs(j) if ranks.get(j).is_some_and(|rj| rj != r) => {
                    Some(format!("as many axes as argument {j} ({})", name(j)))
                }
                _ => None,
            };
            if let Some(want) = want {
                return Err(refuse(i, format!("has {r} axes; the kernel takes {want}")));
            }
        }
        Ok(())
    }

    pub(crate) fn arg_names(&self) -> String {
        self.sig
            .args
            .iter()
            .map(|a| format!("{}:{}", a.name, access_name(a.access)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn access_name(a: Access) -> &'static str {
    match a {
        Access::Read => "r",
        Access::Write => "w",
        Access::ReadWrite => "rw",
    }
}
