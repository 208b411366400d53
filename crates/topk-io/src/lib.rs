//! placeholder while the crate is written
