//! mountgroup: a CSI driver and the FUSE filesystem inside it that presents a volume
//! as owned by a pod's fsGroup, without walking it and without changing a single
//! backing file.
//!
//! Layers, each seeing only the ones below: `csi` (gRPC: the only code that sees
//! tonic) → `driver` (the composition root: what `serve` is made of, in which order)
//! → `volume` (volume lifecycle, node state, how a publish is served) and `share` (the
//! backing share) → `transport` (a view process's FUSE connection: the only code that
//! sees fuser) → `fs` (the group view as a filesystem, free of FUSE types) → `sys` (the
//! only `unsafe` and raw system calls). `config` declares the view options they share;
//! `kube` asks the Kubernetes API what a pod is. tests/layers.rs checks this.

#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(rust_2018_idioms)]

pub mod config;
pub mod csi;
pub mod driver;
pub mod fs;
pub mod kube;
pub mod logfile;
pub mod pathkey;
pub mod share;
pub mod sys;
pub mod transport;
pub mod volume;
pub mod wire;
