//! The integration tests, one binary: each module was its own test target, but 25 binaries that
//! each link the whole engine cost CI minutes of linking and gigabytes of disk (a CI run ran out
//! of space linking them). `cargo test --test integration MODULE::` runs one of them. Tests
//! that measure the whole process (memory growth) or depend on timing keep binaries of their
//! own: `tests/soak`, `tests/server_load`, `tests/batching`.

mod common;
mod server_common;

mod agent_clis;
mod cli;
mod configs_plan;
mod deepseek_v4;
mod embed;
mod fallback;
mod faults;
mod fixture_models;
mod gguf;
mod hub;
mod kv_dtype;
mod kv_pool;
mod pipeline;
mod plan;
mod prefix_reuse;
mod prefix_store;
mod quantized;
mod server_api;
mod server_cli;
mod server_sdk;
mod shell;
mod state_snapshot;
mod synth;
mod tokenizer_cases;
mod web_page;
mod wgpu_fixture;
