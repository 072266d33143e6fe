//! `attention_paged`: a sequence's rows scattered over the pages of a shared pool give the
//! same attention as the same rows kept contiguous.

use super::{assert_rel, download, supported, upload, upload_f32, Rng, ATTENTION_ATOL, ATTENTION_RTOL};
use crate::{reference, AttentionDesc, Backend, BufferUsage, DType, KvPages, Op};

/// Prefill and decode, GQA and a latent cache read as keys and values from one pool buffer,
/// windows and sinks, pages of 1, 4 and 16 rows, a last page partly filled, and pages placed
/// out of order (some neighbours in the pool, most not). Pool rows outside the table hold
/// 1e30, which must never be read.
pub fn attention_paged(b: &dyn Backend, dtype: DType) {
    if !supported(b, Op::Attention, dtype) {
        return;
    }
    let mut rng = Rng::new(0x7061_6765 + dtype.size() as u64);
    // (n_tokens, n_heads, n_kv_heads, head_dim, v_head_dim, kv_len, page_rows, window, sinks, latent)
    let cases = [
        (1, 8, 2, 64, 64, 37, 16, None, false, false),
        (5, 4, 2, 16, 16, 21, 4, None, false, false),
        (7, 4, 1, 32, 32, 7, 16, None, true, false),
        (3, 6, 2, 32, 32, 40, 4, Some(9), true, false),
        (2, 4, 2, 24, 24, 13, 1, None, false, false),
        (1, 16, 4, 128, 128, 300, 16, None, false, false),
        (4, 8, 1, 96, 96, 50, 16, None, false, true),
    ];
    for (n_tokens, n_heads, n_kv_heads, head_dim, v_head_dim, kv_len, page_rows, window, with_sinks, latent) in cases {
        if head_dim % dtype.block_elems() != 0 {
            continue;
        }
        let desc = AttentionDesc { n_tokens, n_heads, n_kv_heads, head_dim, v_head_dim, kv_len, scale: 1.0 / (head_dim as f32).sqrt(), window };
        if !b.supports_attention(&desc, dtype) {
            println!("skipped: paged {desc:?}: beyond the {} backend's attention kernels", b.kind());
            continue;
        }
        let pages = kv_len.div_ceil(page_rows);
        let pool_pages = 2 * pages + 3;
        // A shuffled choice of pool pages, with one pair kept as neighbours.
        let mut free: Vec<u32> = (0..pool_pages as u32).collect();
        let mut table = Vec::with_capacity(pages);
        for i in 0..pages {
            let at = if i > 0 && i % 3 == 1 { free.iter().position(|&p| p == table[i - 1] + 1) } else { None };
            let at = at.unwrap_or_else(|| rng.below(free.len()));
            table.push(free.remove(at));
        }
        let paged = KvPages { table: &table, page_rows };
        let pool_with = |rng: &mut Rng, width: usize| {
            let mut pool = vec![1e30f32; pool_pages * page_rows * width];
            let rows = rng.vec(kv_len * width, 1.0);
            for j in 0..kv_len {
                let r = paged.row(j).expect("row in table");
                pool[r * width..][..width].copy_from_slice(&rows[j * width..][..width]);
            }
            pool
        };
        let (kw, vw) = (n_kv_heads * head_dim, n_kv_heads * v_head_dim);
        let k_host = pool_with(&mut rng, kw);
        let (k, k_pool) = upload(b, dtype, &k_host, BufferUsage::Kv);
        let (v, v_pool) = if latent { (None, k_pool.clone()) } else {
            let (v, vd) = upload(b, dtype, &pool_with(&mut rng, vw), BufferUsage::Kv);
            (Some(v), vd)
        };
        let logical = |pool: &[f32], width: usize| -> Vec<f32> {
            (0..kv_len).flat_map(|j| pool[paged.row(j).expect("row") * width..][..width].to_vec()).collect()
        };
        let q = rng.vec(n_tokens * n_heads * head_dim, 2.0);
        let sinks_v = rng.vec(n_heads, 2.0);
        let sinks = with_sinks.then(|| upload_f32(b, &sinks_v));
        let mut out = b.alloc(DType::F32, n_tokens * n_heads * v_head_dim, BufferUsage::Scratch).expect("alloc");
        let what = format!("paged attention {dtype} {desc:?} pages of {page_rows} {table:?} latent={latent}");
        b.attention_paged(&upload_f32(b, &q), &k, v.as_ref().unwrap_or(&k), &paged, sinks.as_ref(), &mut out, &desc)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = reference::attention(&q, &logical(&k_pool, kw), &logical(&v_pool, vw), with_sinks.then_some(&sinks_v[..]), &desc);
        assert_rel(&what, &download(b, &out), &want, ATTENTION_RTOL, ATTENTION_ATOL);
    }
    // A table that does not cover kv_len is an error, not a read past it.
    let desc = AttentionDesc { n_tokens: 1, n_heads: 2, n_kv_heads: 1, head_dim: 32, v_head_dim: 32, kv_len: 9, scale: 1.0, window: None };
    let (k, _) = upload(b, dtype, &vec![0.5; 16 * 32], BufferUsage::Kv);
    let mut out = b.alloc(DType::F32, 64, BufferUsage::Scratch).expect("alloc");
    let short = KvPages { table: &[1], page_rows: 8 };
    assert!(b.attention_paged(&upload_f32(b, &[0.1; 64]), &k, &k, &short, None, &mut out, &desc).is_err(), "a short page table must be refused");
}
