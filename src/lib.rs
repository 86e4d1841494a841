//! mountgroup: a CSI driver and the FUSE filesystem inside it that presents a volume
//! as owned by a pod's fsGroup, without walking it and without changing a single
//! backing file.
//!
//! Layers, each seeing only the one below: `fs` (the group view; the only code that
//! sees fuser) → `sys` (the only `unsafe` and raw system calls). `config` is the typed
//! configuration shared by the CLI and, later, the CSI layer.

#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(rust_2018_idioms, unreachable_pub)]
#![allow(unreachable_pub)]

pub mod config;
pub mod fs;
pub mod sys;
