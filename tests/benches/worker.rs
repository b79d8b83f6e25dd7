#![allow(missing_docs)]
//! placeholder
fn main() {}
