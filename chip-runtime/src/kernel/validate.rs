//! Checks a launch against the kernel's signature before anything runs.

use strata_wire::{Access, ArgTag, DType, Footprint, Overlap, Tensor};

use super::{ArgSpec, DTypes, Kernel, Rank};
use crate::Error;

/// Checks, in order: the argument count; per argument its dtype, rank, tag
/// (against how the kernel uses it) and the buffer's grant; the scalar
/// count; the kernel's own shape rules; and that no argument the kernel
/// writes shares a byte with another argument.
pub(crate) fn validate_launch(
    kernel: &dyn Kernel,
    args: &[(Tensor, ArgTag)],
    scalars: &[u64],
) -> Result<(), Error> {
    let desc = kernel.descriptor();
    // Named only when a check fails: formatting it per launch was most of
    // the cost of validating a small task.
    let bad = |index: usize, reason: String| Error::Argument {
        kernel: desc.qualified_name(),
        index,
        name: desc
            .args
            .get(index)
            .map_or_else(|| "?".to_owned(), |a| a.name.clone()),
        reason,
    };
    if args.len() != desc.args.len() {
        return Err(bad(
            args.len().min(desc.args.len()),
            format!(
                "expected {} tensor arguments, got {}",
                desc.args.len(),
                args.len()
            ),
        ));
    }
    for (i, ((tensor, tag), spec)) in args.iter().zip(&desc.args).enumerate() {
        check_dtype(i, tensor, spec, args).map_err(|r| bad(i, r))?;
        check_rank(tensor, spec, args).map_err(|r| bad(i, r))?;
        check_tag(*tag, spec.access).map_err(|r| bad(i, r))?;
        let grant = tensor.buffer().access();
        if spec.access.allows_read() && !grant.allows_read() {
            return Err(bad(
                i,
                format!("the kernel reads it but the buffer grants {}", grant.name()),
            ));
        }
        if spec.access.allows_write() && !grant.allows_write() {
            return Err(bad(
                i,
                format!(
                    "the kernel writes it but the buffer grants {}",
                    grant.name()
                ),
            ));
        }
    }
    if scalars.len() != desc.scalars.len() {
        return Err(Error::Scalars {
            kernel: desc.qualified_name(),
            reason: format!(
                "expected {} scalars, got {}",
                desc.scalars.len(),
                scalars.len()
            ),
        });
    }
    let tensors: Vec<Tensor> = args.iter().map(|(t, _)| *t).collect();
    kernel
        .check(&tensors, scalars)
        .map_err(|(i, reason)| bad(i, reason))?;
    let prints: Vec<Footprint> = tensors.iter().map(Footprint::of).collect();
    for j in 0..args.len() {
        for i in 0..j {
            let writes = desc.args[i].access.allows_write() || desc.args[j].access.allows_write();
            if writes && prints[i].overlap(&prints[j]) != Overlap::Disjoint {
                return Err(bad(
                    j,
                    format!(
                        "shares bytes with argument {i} ({}), and the kernel writes one of them",
                        desc.args[i].name
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn check_dtype(
    i: usize,
    t: &Tensor,
    spec: &ArgSpec,
    args: &[(Tensor, ArgTag)],
) -> Result<(), String> {
    let d = t.dtype();
    match &spec.dtypes {
        DTypes::Any => Ok(()),
        DTypes::OneOf(list) if list.contains(&d) => Ok(()),
        DTypes::OneOf(list) => Err(format!(
            "dtype {d} is not accepted (accepted: {})",
            list.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
        )),
        DTypes::SameAs(j) => match args.get(*j) {
            Some((other, _)) if other.dtype() == d => Ok(()),
            Some((other, _)) => Err(format!(
                "dtype {d} differs from argument {j}'s {}",
                other.dtype()
            )),
            None => Err(format!(
                "signature of argument {i} refers to missing argument {j}"
            )),
        },
        // Names this build does not know, beside ones it may: a tensor's
        // dtype is accepted when it is among them.
        DTypes::Unknown(names) if names.split('|').any(|n| DType::from_name(n) == Some(d)) => {
            Ok(())
        }
        DTypes::Unknown(names) => Err(format!("dtype {d} is not accepted (accepted: {names})")),
    }
}

fn check_rank(t: &Tensor, spec: &ArgSpec, args: &[(Tensor, ArgTag)]) -> Result<(), String> {
    let n = t.ndims();
    let ok = match spec.rank {
        Rank::Any => true,
        Rank::Exactly(k) => n == k,
        Rank::AtLeast(k) => n >= k,
        Rank::SameAs(j) => args.get(j).is_some_and(|(o, _)| o.ndims() == n),
    };
    if ok {
        return Ok(());
    }
    let want = match spec.rank {
        Rank::Any => "any rank".to_owned(),
        Rank::Exactly(k) => format!("rank {k}"),
        Rank::AtLeast(k) => format!("rank {k} or more"),
        Rank::SameAs(j) => format!("the rank of argument {j}"),
    };
    Err(format!("rank {n} given, {want} expected"))
}

fn check_tag(tag: ArgTag, access: Access) -> Result<(), String> {
    let ok = match access {
        Access::Read => matches!(tag, ArgTag::Input | ArgTag::NoDep),
        Access::Write => matches!(tag, ArgTag::Output | ArgTag::OutputExisting | ArgTag::NoDep),
        Access::ReadWrite => matches!(tag, ArgTag::InOut | ArgTag::NoDep),
    };
    if ok {
        return Ok(());
    }
    let want = match access {
        Access::Read => "INPUT (or NO_DEP)",
        Access::Write => "OUTPUT or OUTPUT_EXISTING (or NO_DEP)",
        Access::ReadWrite => "INOUT (or NO_DEP)",
    };
    let verb = match access {
        Access::Read => "reads",
        Access::Write => "writes",
        Access::ReadWrite => "reads and writes",
    };
    Err(format!(
        "tagged {tag}, but the kernel {verb} it: tag it {want}"
    ))
}
