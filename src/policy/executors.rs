//! How the CPU executors spread one layer's experts over the worker pool.
//!
//! Decode experts stream their weights; what decides their rate is that every worker reads
//! long runs of weights front to back and that all of them finish the layer together. Flat,
//! a layer's products become one list of row chunks a phase (every gate and up product, then
//! every down product), each worker takes a contiguous run of it, and the first to finish
//! takes the others' last chunks ([`ft_backend_cpu::kernels::matmul_many`]). Whole experts a
//! worker each (as before) read as well but left one worker idle at the layer's end: 60 µs in
//! the median, 280 µs on average, since a worker descheduled mid-expert held the layer up for
//! milliseconds (12-layer Q4_K_M decode, 2 threads, 1.2 ms a layer). Nesting each product's
//! own split inside experts that run side by side let the threads steal each other's rows all
//! the way through and halved the rate of bf16 experts (13.2 against 20.9 GB/s). Flat also
//! keeps a decode going on a shared machine: with another process busy on one of the two
//! cores, the worker there loses half its time, and the other now takes over its chunks
//! instead of waiting for its experts (12.1–12.4 → 13.4–13.6 tokens/s). Experts with many
//! tokens are compute: they run side by side as rayon splits them, each product split over
//! the pool too (flat, or one after another, a 512-token prefill ran at 205–225 tokens/s
//! instead of 255–265).

/// Most tokens an expert may have for its layer to run flat: up to here its products are
/// memory-bound (the int8 kernels' one-pass limit), beyond they are compute.
pub const FLAT_TOKENS: usize = 4;

/// Whether a layer's CPU experts, with `tokens[i]` tokens each, run flat on `threads` workers
/// (module docs) rather than one after another.
pub fn flat(tokens: &[usize], threads: usize) -> bool {
    threads > 1 && !tokens.is_empty() && tokens.iter().all(|&n| n <= FLAT_TOKENS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_bound_layers_run_flat_on_several_workers() {
        // Qwen3's 8 experts of one token on 2 threads, a batch of decoding sequences, and
        // counts that do not share out evenly: chunks balance them.
        assert!(flat(&[1; 8], 2));
        assert!(flat(&[1, 2, 4, 1, 3, 1], 2));
        assert!(flat(&[1; 8], 16));
        assert!(flat(&[1; 3], 2));
        // A prefill-sized expert is compute; one thread: nothing to spread.
        assert!(!flat(&[1, 1, 1, 40], 2));
        assert!(!flat(&[1; 8], 1));
        assert!(!flat(&[], 2));
    }
}
