//! Host side of the Gated DeltaNet kernels: the causal convolution and the gated delta rule.

use crate::memory::{expect_dtype, need, u32_of};
use crate::pipelines::{dtype_code, Kernel};
use crate::WgpuBackend;
use ft_backend::{
    BackendError, ConvDesc, DType, DeltaRuleDesc, DeltaRuleInputs, DeviceBuffer, Result,
};

/// Largest key head size recurrent.wgsl keeps in workgroup memory.
const MAX_DK: usize = 256;

impl WgpuBackend {
    pub(crate) fn run_conv(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        state: &mut DeviceBuffer,
        out: &mut DeviceBuffer,
        d: &ConvDesc,
    ) -> Result<()> {
        for (b, what) in [(x, "conv x"), (&*state, "conv state"), (&*out, "conv out")] {
            expect_dtype(b, DType::F32, what)?;
        }
        if d.kernel == 0 {
            return Err(BackendError::Shape("conv: kernel of 0 taps".into()));
        }
        let len = need(d.n_tokens, d.channels, "conv")?;
        let xs = self.window(x, 0, len, "conv x")?;
        let ws = self.window(w, 0, need(d.channels, d.kernel, "conv w")?, "conv w")?;
        let ss = self.window(
            state,
            0,
            need(d.kernel - 1, d.channels, "conv state")?,
            "conv state",
        )?;
        let os = self.window(out, 0, len, "conv out")?;
        if len == 0 {
            return Ok(());
        }
        u32_of(need(d.n_tokens + d.kernel, d.channels, "conv")?, "conv")?;
        let params = [
            d.n_tokens as u32,
            d.channels as u32,
            d.kernel as u32,
            d.silu as u32,
            0,
            0,
            0,
            0,
        ];
        self.dispatch(
            Kernel::Conv,
            &[("WDT", dtype_code(w.dtype()))],
            &params,
            &[(1, xs.bind), (2, ws.bind), (3, ss.bind), (4, os.bind)],
            (d.channels as u64).div_ceil(64),
        )
    }

    pub(crate) fn run_delta_rule(
        &self,
        i: &DeltaRuleInputs<'_>,
        state: &mut DeviceBuffer,
        out: &mut DeviceBuffer,
        d: &DeltaRuleDesc,
    ) -> Result<()> {
        let (hk, hv, dk, dv) = (d.n_k_heads, d.n_v_heads, d.k_head_dim, d.v_head_dim);
        if hk == 0 || !hv.is_multiple_of(hk) {
            return Err(BackendError::Shape(format!(
                "delta rule: {hv} value heads over {hk} key heads"
            )));
        }
        if dk > MAX_DK {
            return Err(BackendError::Shape(format!(
                "delta rule: key head size {dk} exceeds the shader's {MAX_DK}"
            )));
        }
        let inputs = [
            (i.qkv, "delta rule qkv"),
            (i.beta_logits, "delta rule beta"),
            (i.decay_in, "delta rule decay"),
            (i.a_log, "delta rule a_log"),
            (i.dt_bias, "delta rule dt_bias"),
        ];
        for (b, what) in inputs
            .iter()
            .copied()
            .chain([(&*state, "delta rule state"), (&*out, "delta rule out")])
        {
            expect_dtype(b, DType::F32, what)?;
        }
        let row = need(2 * hk, dk, "delta rule row")?
            .checked_add(need(hv, dv, "delta rule row")?)
            .ok_or_else(|| BackendError::Shape("delta rule: row size overflows".into()))?;
        let qkv = self.window(
            i.qkv,
            0,
            need(d.n_tokens, row, "delta rule qkv")?,
            "delta rule qkv",
        )?;
        let beta = self.window(
            i.beta_logits,
            0,
            need(d.n_tokens, hv, "delta rule beta")?,
            "delta rule beta",
        )?;
        let decay = self.window(
            i.decay_in,
            0,
            need(d.n_tokens, hv, "delta rule decay")?,
            "delta rule decay",
        )?;
        let a_log = self.window(i.a_log, 0, hv, "delta rule a_log")?;
        let dt = self.window(i.dt_bias, 0, hv, "delta rule dt_bias")?;
        let st = self.window(
            state,
            0,
            need(need(hv, dk, "delta rule state")?, dv, "delta rule state")?,
            "delta rule state",
        )?;
        let os = self.window(
            out,
            0,
            need(
                need(d.n_tokens, hv, "delta rule out")?,
                dv,
                "delta rule out",
            )?,
            "delta rule out",
        )?;
        if d.n_tokens == 0 || hv == 0 {
            return Ok(());
        }
        u32_of(need(d.n_tokens, row, "delta rule qkv")?, "delta rule qkv")?;
        let params = [
            d.n_tokens as u32,
            hv as u32,
            hk as u32,
            0,
            dk as u32,
            u32_of(dv, "delta rule dv")?,
            d.l2norm_eps.to_bits(),
            d.scale.to_bits(),
        ];
        self.dispatch(
            Kernel::DeltaRule,
            &[],
            &params,
            &[
                (5, qkv.bind),
                (6, beta.bind),
                (7, decay.bind),
                (8, a_log.bind),
                (9, dt.bind),
                (10, st.bind),
                (11, os.bind),
            ],
            hv as u64,
        )
    }
}
