//! `strata-orchestrator`: the driver-side half of strata, and the `strata`
//! command-line tool.
//!
//! Today it holds the CLI ([`cli`]) with its first subcommand,
//! `strata inspect`, which decodes wire-format files. The orchestrator proper
//! (dependency inference and scheduling cores, actors, buffers, endpoints and
//! the driver API) arrives with issues 5 and 6.
//!
//! ```
//! use strata_orchestrator::cli::inspect::to_json;
//! use strata_wire::{decode_any, TaskArgs};
//! let blob = TaskArgs::new(vec![], vec![7]).unwrap().encode();
//! let json = to_json(&decode_any(&blob).unwrap());
//! assert_eq!(json["kind"], "task_args");
//! assert_eq!(json["scalars"][0], 7);
//! ```

#![forbid(unsafe_code)]

pub mod cli;
