//! ft-actor: a local inference engine for Mixture-of-Experts language models.
//!
//! A personal computer is treated as one system (GPU, CPU, host RAM and the link between
//! them). The pieces: [`model`] (config, weights, architectures, the reference forward
//! pass), [`kv`] (per-sequence state), [`engine`] and [`actors`] (the runtime that runs generations), [`policy`] (its decisions), [`tokenizer`] and
//! [`chat`] (text in and out), [`device`] (choosing a backend), [`bench`] and [`synth`]
//! (measuring speed at real sizes), [`cli`] (the `ft-actor` command).

pub mod actors;
pub mod bench;
pub mod chat;
pub mod cli;
pub mod config;
pub mod demo;
pub mod device;
pub mod engine;
pub mod hub;
pub mod kv;
pub mod launch;
pub mod model;
pub mod npy;
pub mod policy;
pub mod quantize;
pub mod sampling;
pub mod server;
pub mod synth;
pub mod tokenizer;
