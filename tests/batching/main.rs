//! The batching tests, in their own binary: whether late requests join running ones in a step
//! depends on timing, which heavy tests beside them in one process would upset.

#[path = "../integration/common/mod.rs"]
mod common;
mod batching;
