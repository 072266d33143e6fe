//! How the CPU executors spread one layer's experts over the worker pool.
//!
//! Decode experts stream their weights; what decides their rate is how the two kinds of
//! parallelism meet. Side by side, each expert's three products run on one worker, whole, and
//! the workers take experts in turn: every thread reads its own weights front to back. Split,
//! each product's rows are shared by all workers, in the small tasks that keep one-token
//! products balanced ([`ft_backend_cpu::kernels::matmul`]); nesting those tasks inside
//! experts that also run side by side let the threads steal each other's rows all the way
//! through and halved the rate of bf16 experts (13.2 against 20.9 GB/s, 8 experts a layer on
//! 2 threads). Side by side needs experts enough to keep every worker busy to the end.

/// Most tokens an expert may have for its layer to run side by side: up to here its products
/// are memory-bound (the int8 kernels' one-pass limit), beyond they are compute and the
/// expert with most tokens would hold the layer up.
pub const SIDE_BY_SIDE_TOKENS: usize = 4;

/// Whether a layer's CPU experts, with `tokens[i]` tokens each, run side by side on `threads`
/// workers (one expert a worker at a time) rather than one after another, split: each
/// worker must get the same number of experts, or at least four, so that no worker is left
/// alone with the last one.
pub fn side_by_side(tokens: &[usize], threads: usize) -> bool {
    let jobs = tokens.len();
    threads > 1
        && jobs >= threads
        && (jobs.is_multiple_of(threads) || jobs >= 4 * threads)
        && tokens.iter().all(|&n| n <= SIDE_BY_SIDE_TOKENS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_layers_run_side_by_side_when_the_workers_share_them_evenly() {
        // Qwen3's 8 experts of one token on 2 threads: 4 each.
        assert!(side_by_side(&[1; 8], 2));
        // A batch of decoding sequences: up to 4 tokens an expert still streams.
        assert!(side_by_side(&[1, 2, 4, 1, 3, 1], 2));
        // 8 experts on 16 threads: half the workers would idle; each product is split.
        assert!(!side_by_side(&[1; 8], 16));
        // 3 on 2 threads: one worker would run the last alone; 9 on 2 is close enough.
        assert!(!side_by_side(&[1; 3], 2));
        assert!(side_by_side(&[1; 9], 2));
        // A prefill-sized expert is compute; one thread: nothing to spread.
        assert!(!side_by_side(&[1, 1, 1, 40], 2));
        assert!(!side_by_side(&[1; 8], 1));
        assert!(!side_by_side(&[], 2));
    }
}
