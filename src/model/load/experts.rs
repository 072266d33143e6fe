//! Routed experts in the layouts checkpoints use: one tensor per expert and
//! projection (the hub layout), transformers 5's fused `[E, 2I, H]` / `[E, H, I]` tensors,
//! gpt-oss's fused, transposed, interleaved tensors with biases, and gpt-oss split per expert (GGUF).

use super::shape_error;
use crate::model::config::ModelConfig;
use crate::model::weights::{ExpertBiases, ExpertWeights, HostMatrix, Loader};
use crate::model::weights_file::TensorRef;
use crate::model::ModelError;
use ft_backend::HostBytes;
use rayon::prelude::*;

impl Loader<'_> {
    /// The routed experts of one MoE layer under `prefix` (`….mlp.experts`), copied together
    /// into huge pages where the memory allows ([`crate::model::hot::copy_experts`]).
    pub fn experts(&mut self, prefix: &str, cfg: &ModelConfig) -> Result<Vec<ExpertWeights>, ModelError> {
        let mut experts = self.checkpoint_experts(prefix, cfg)?;
        let copied = crate::model::hot::copy_experts(&mut experts);
        tracing::debug!(layer = prefix, copied, "routed experts {}", if copied > 0 { "copied into huge pages" } else { "left mapped" });
        Ok(experts)
    }

    /// The routed experts as the checkpoint holds them: views of the mapped files where the
    /// layout allows, owned conversions where it does not (gpt-oss).
    fn checkpoint_experts(&mut self, prefix: &str, cfg: &ModelConfig) -> Result<Vec<ExpertWeights>, ModelError> {
        let (n, hidden, inter) = (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size);
        let names = crate::model::arch::spec(cfg.arch).hf;
        let fused = format!("{prefix}.gate_up_proj");
        if names.stacked_experts {
            return self.gpt_oss_experts(prefix, n, hidden, inter);
        }
        if self.files.contains(&fused) {
            let gu = self.tensor(&fused, &[n, 2 * inter, hidden])?;
            let down = self.tensor(&format!("{prefix}.down_proj"), &[n, hidden, inter])?;
            let m = inter * hidden;
            let view = |t: &TensorRef, off: usize, rows: usize, cols: usize| -> Result<HostMatrix, ModelError> {
                let es = t.dtype.size();
                let bytes = t.bytes.slice(off * es, rows * cols * es).ok_or_else(|| shape_error(&t.name, &t.shape, vec![n, rows, cols]))?;
                Ok(HostMatrix { bytes, dtype: t.dtype, rows, cols })
            };
            return (0..n)
                .map(|e| {
                    Ok(ExpertWeights {
                        gate: view(&gu, e * 2 * m, inter, hidden)?,
                        up: view(&gu, e * 2 * m + m, inter, hidden)?,
                        down: view(&down, e * m, hidden, inter)?,
                        biases: None,
                    })
                })
                .collect();
        }
        let [g, u, d] = names.expert_proj;
        (0..n)
            .map(|e| {
                Ok(ExpertWeights {
                    gate: self.host_matrix(&format!("{prefix}.{e}.{g}.weight"), inter, hidden)?,
                    up: self.host_matrix(&format!("{prefix}.{e}.{u}.weight"), inter, hidden)?,
                    down: self.host_matrix(&format!("{prefix}.{e}.{d}.weight"), hidden, inter)?,
                    biases: None,
                })
            })
            .collect()
    }

    /// gpt-oss stores `gate_up_proj [E, H, 2I]` in `[in, out]` orientation with gate and up
    /// interleaved on the last axis, `down_proj [E, I, H]`, and f32-convertible biases
    /// `gate_up_proj_bias [E, 2I]`, `down_proj_bias [E, H]`.
    ///
    /// The engine's expert kernels take row-major `[out, in]` matrices, so every expert is
    /// converted once, here, into owned `gate`/`up [I, H]` and `down [H, I]` copies in process
    /// memory, which then are the host pool for this model (the mapped originals are not read
    /// again, so their pages may leave the page cache). Loading therefore reads and writes
    /// every expert byte once, and the pool is anonymous memory rather than file-backed.
    fn gpt_oss_experts(&mut self, prefix: &str, n: usize, hidden: usize, inter: usize) -> Result<Vec<ExpertWeights>, ModelError> {
        if self.files.contains(&format!("{prefix}.gate_up_proj_blocks")) {
            return self.gpt_oss_mxfp4_experts(prefix, n, hidden, inter);
        }
        if self.files.contains(&format!("{prefix}.0.gate_proj.weight")) {
            return self.gpt_oss_split_experts(prefix, n, hidden, inter);
        }
        let gu = self.tensor(&format!("{prefix}.gate_up_proj"), &[n, hidden, 2 * inter])?;
        let down = self.tensor(&format!("{prefix}.down_proj"), &[n, inter, hidden])?;
        let gu_bias = self.tensor(&format!("{prefix}.gate_up_proj_bias"), &[n, 2 * inter])?.to_f32();
        let down_bias = self.tensor(&format!("{prefix}.down_proj_bias"), &[n, hidden])?.to_f32();
        let (es, dtype) = (gu.dtype.size(), gu.dtype);
        if down.dtype != dtype {
            return Err(ModelError::Invalid(format!("{prefix}: gate_up_proj is {dtype} but down_proj is {}", down.dtype)));
        }
        let (gu_src, down_src) = (gu.bytes.as_slice(), down.bytes.as_slice());
        let f32_bytes = |v: &[f32]| HostBytes::from_vec(bytemuck::cast_slice(v).to_vec());
        let convert = |e: usize| -> ExpertWeights {
            let gu_e = &gu_src[e * hidden * 2 * inter * es..(e + 1) * hidden * 2 * inter * es];
            let down_e = &down_src[e * inter * hidden * es..(e + 1) * inter * hidden * es];
            let mut gate = vec![0u8; inter * hidden * es];
            let mut up = vec![0u8; inter * hidden * es];
            // Column 2i of the [H, 2I] block is row i of gate, column 2i + 1 row i of up.
            for c in 0..hidden {
                let row = &gu_e[c * 2 * inter * es..(c + 1) * 2 * inter * es];
                for i in 0..inter {
                    let to = (i * hidden + c) * es;
                    gate[to..to + es].copy_from_slice(&row[2 * i * es..(2 * i + 1) * es]);
                    up[to..to + es].copy_from_slice(&row[(2 * i + 1) * es..(2 * i + 2) * es]);
                }
            }
            let mut down_t = vec![0u8; hidden * inter * es];
            for i in 0..inter {
                for c in 0..hidden {
                    let (from, to) = ((i * hidden + c) * es, (c * inter + i) * es);
                    down_t[to..to + es].copy_from_slice(&down_e[from..from + es]);
                }
            }
            let b = &gu_bias[e * 2 * inter..(e + 1) * 2 * inter];
            let gate_b: Vec<f32> = b.iter().step_by(2).copied().collect();
            let up_b: Vec<f32> = b.iter().skip(1).step_by(2).copied().collect();
            let m = |bytes: Vec<u8>, rows, cols| HostMatrix { bytes: HostBytes::from_vec(bytes), dtype, rows, cols };
            ExpertWeights {
                gate: m(gate, inter, hidden),
                up: m(up, inter, hidden),
                down: m(down_t, hidden, inter),
                biases: Some(ExpertBiases {
                    gate: f32_bytes(&gate_b),
                    up: f32_bytes(&up_b),
                    down: f32_bytes(&down_bias[e * hidden..(e + 1) * hidden]),
                }),
            }
        };
        Ok((0..n).into_par_iter().map(convert).collect())
    }

    /// gpt-oss already split and transposed (a GGUF from llama.cpp's converter, see
    /// `arch/gpt_oss.rs`): per-expert `gate_proj`/`up_proj [I, H]` and `down_proj [H, I]` in
    /// any type, read as views like the hub layout, and stacked biases `gate_proj_bias`/
    /// `up_proj_bias [E, I]`, `down_proj_bias [E, H]` (f32 ones viewed, others converted).
    fn gpt_oss_split_experts(&mut self, prefix: &str, n: usize, hidden: usize, inter: usize) -> Result<Vec<ExpertWeights>, ModelError> {
        let mut bias = |name: &str, width: usize| -> Result<Vec<HostBytes>, ModelError> {
            let t = self.tensor(&format!("{prefix}.{name}"), &[n, width])?;
            let owned;
            let all = if t.dtype == ft_backend::DType::F32 {
                t.bytes
            } else {
                owned = t.to_f32();
                HostBytes::from_vec(bytemuck::cast_slice(&owned).to_vec())
            };
            (0..n).map(|e| all.slice(e * width * 4, width * 4).ok_or_else(|| shape_error(&t.name, &t.shape, vec![n, width]))).collect()
        };
        let (gate_b, up_b, down_b) = (bias("gate_proj_bias", inter)?, bias("up_proj_bias", inter)?, bias("down_proj_bias", hidden)?);
        (0..n)
            .zip(gate_b.into_iter().zip(up_b).zip(down_b))
            .map(|(e, ((gate, up), down))| {
                Ok(ExpertWeights {
                    gate: self.host_matrix(&format!("{prefix}.{e}.gate_proj.weight"), inter, hidden)?,
                    up: self.host_matrix(&format!("{prefix}.{e}.up_proj.weight"), inter, hidden)?,
                    down: self.host_matrix(&format!("{prefix}.{e}.down_proj.weight"), hidden, inter)?,
                    biases: Some(ExpertBiases { gate, up, down }),
                })
            })
            .collect()
    }

    /// gpt-oss as published: MXFP4 `*_blocks`/`*_scales` in `[out, in]` orientation, gate and
    /// up interleaved by row. Rows are split and packed into the engine's MXFP4 blocks (every
    /// code and scale kept as stored).
    fn gpt_oss_mxfp4_experts(&mut self, prefix: &str, n: usize, hidden: usize, inter: usize) -> Result<Vec<ExpertWeights>, ModelError> {
        use crate::model::quant::mxfp4_experts;
        use ft_backend::DType;
        for name in ["gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"] {
            (self.on_tensor)(&format!("{prefix}.{name}"));
        }
        let gu = mxfp4_experts(self.files, prefix, "gate_up_proj", n, 2 * inter, hidden)?;
        let down = mxfp4_experts(self.files, prefix, "down_proj", n, hidden, inter)?;
        let gu_bias = self.tensor(&format!("{prefix}.gate_up_proj_bias"), &[n, 2 * inter])?.to_f32();
        let down_bias = self.tensor(&format!("{prefix}.down_proj_bias"), &[n, hidden])?.to_f32();
        let rb = DType::Mxfp4.row_bytes(hidden);
        let f32_bytes = |v: &[f32]| HostBytes::from_vec(bytemuck::cast_slice(v).to_vec());
        let m = |bytes: Vec<u8>, rows, cols| HostMatrix { bytes: HostBytes::from_vec(bytes), dtype: DType::Mxfp4, rows, cols };
        Ok(gu
            .into_iter()
            .zip(down)
            .enumerate()
            .map(|(e, (gu_e, down_e))| {
                let rows = |parity: usize| -> Vec<u8> { gu_e.chunks_exact(rb).skip(parity).step_by(2).flatten().copied().collect() };
                let b = &gu_bias[e * 2 * inter..(e + 1) * 2 * inter];
                let gate_b: Vec<f32> = b.iter().step_by(2).copied().collect();
                let up_b: Vec<f32> = b.iter().skip(1).step_by(2).copied().collect();
                ExpertWeights {
                    gate: m(rows(0), inter, hidden),
                    up: m(rows(1), inter, hidden),
                    down: m(down_e, hidden, inter),
                    biases: Some(ExpertBiases {
                        gate: f32_bytes(&gate_b),
                        up: f32_bytes(&up_b),
                        down: f32_bytes(&down_bias[e * hidden..(e + 1) * hidden]),
                    }),
                }
            })
            .collect())
    }
}
