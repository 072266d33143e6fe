//! The soak test, in its own binary: it bounds the growth of the process's memory (RSS), which
//! tests running beside it in one process would move.

#[path = "../integration/server_common/mod.rs"]
mod server_common;
mod soak;
