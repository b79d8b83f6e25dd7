//! Tests of the cores: the differential test against sequential execution,
//! the missed-edge and false-edge checks, and the behaviour of each part.

mod behaviour;
mod differential;
mod false_edges;
