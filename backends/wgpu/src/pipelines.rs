//! WGSL sources, the lazily filled pipeline cache, and the one dispatch path every kernel
//! goes through.

use crate::{block_on, WgpuBackend};
use ft_backend::{BackendError, DType, Result};
use std::collections::HashMap;
use std::sync::Mutex;
use wgpu::util::DeviceExt;

macro_rules! shader {
    ($file:literal) => {
        concat!(
            include_str!("../../../shaders/common.wgsl"),
            include_str!(concat!("../../../shaders/", $file))
        )
    };
}

/// A compute entry point of one of the shader files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    Matmul,
    MatmulQuant,
    RmsNorm,
    Rope,
    Attention,
    Binary,
    Scale,
    Softmax,
    Gather,
    ScatterAdd,
    Copy16,
    Conv,
    DeltaRule,
}

impl Kernel {
    fn source(self) -> (&'static str, &'static str) {
        match self {
            Kernel::Matmul => ("matmul", shader!("matmul.wgsl")),
            Kernel::MatmulQuant => ("matmul_quant", shader!("matmul_quant.wgsl")),
            Kernel::RmsNorm => ("norm", shader!("norm.wgsl")),
            Kernel::Rope => ("rope", shader!("rope.wgsl")),
            Kernel::Attention => ("attention", shader!("attention.wgsl")),
            Kernel::Binary | Kernel::Scale | Kernel::Softmax => {
                ("elementwise", shader!("elementwise.wgsl"))
            }
            Kernel::Gather | Kernel::ScatterAdd | Kernel::Copy16 => ("rows", shader!("rows.wgsl")),
            Kernel::Conv | Kernel::DeltaRule => ("recurrent", shader!("recurrent.wgsl")),
        }
    }

    fn entry(self) -> &'static str {
        match self {
            Kernel::Binary => "binary",
            Kernel::Scale => "scale",
            Kernel::Softmax => "softmax",
            Kernel::Gather => "gather",
            Kernel::ScatterAdd => "scatter_add",
            Kernel::Copy16 => "copy16",
            Kernel::Conv => "conv",
            Kernel::DeltaRule => "delta_rule",
            _ => "main",
        }
    }
}

/// The code of `dtype` in the shaders' `DT_*` constants.
pub(crate) fn dtype_code(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        // Unreachable: block types go to matmul_quant.wgsl (codes in `crate::quant`), and
        // `WgpuBackend::window` refuses them for every other kernel.
        _ => 0,
    }
}

/// A pipeline's identity: its entry point and the values of its override constants.
type PipelineKey = (Kernel, Vec<(&'static str, u32)>);

/// Compiled modules and pipelines, keyed by entry point and override constants.
#[derive(Default)]
pub(crate) struct PipelineCache {
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<PipelineKey, wgpu::ComputePipeline>>,
}

/// A storage buffer range bound to one binding slot.
#[derive(Clone, Copy)]
pub(crate) struct Bind<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl<'a> Bind<'a> {
    /// The whole of `buffer`.
    pub(crate) fn all(buffer: &'a wgpu::Buffer) -> Self {
        Bind {
            buffer,
            offset: 0,
            size: buffer.size(),
        }
    }
}

impl WgpuBackend {
    fn pipeline(
        &self,
        kernel: Kernel,
        constants: &[(&'static str, u32)],
    ) -> Result<wgpu::ComputePipeline> {
        let key = (kernel, constants.to_vec());
        let lock_err = || BackendError::Device("pipeline cache poisoned".into());
        if let Some(p) = self
            .pipelines
            .pipelines
            .lock()
            .map_err(|_| lock_err())?
            .get(&key)
        {
            return Ok(p.clone());
        }
        let (name, src) = kernel.source();
        let module = {
            let mut modules = self.pipelines.modules.lock().map_err(|_| lock_err())?;
            match modules.get(name) {
                Some(m) => m.clone(),
                None => {
                    let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
                    let m = self
                        .device
                        .create_shader_module(wgpu::ShaderModuleDescriptor {
                            label: Some(name),
                            source: wgpu::ShaderSource::Wgsl(src.into()),
                        });
                    if let Some(e) = block_on(scope.pop()) {
                        return Err(BackendError::Device(format!("shader {name}.wgsl: {e}")));
                    }
                    modules.insert(name, m.clone());
                    m
                }
            }
        };
        let consts: Vec<(&str, f64)> = constants.iter().map(|(k, v)| (*k, *v as f64)).collect();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kernel.entry()),
                layout: None,
                module: &module,
                entry_point: Some(kernel.entry()),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &consts,
                    // Kernels initialise what they read; skipping zeroing saves a pass per call.
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        if let Some(e) = block_on(scope.pop()) {
            return Err(BackendError::Device(format!(
                "pipeline {name}::{}: {e}",
                kernel.entry()
            )));
        }
        self.pipelines
            .pipelines
            .lock()
            .map_err(|_| lock_err())?
            .insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// A read-only storage buffer holding `data` (host tables, ids, scales).
    pub(crate) fn temp_buffer(&self, data: &[u8]) -> wgpu::Buffer {
        // A binding cannot be empty, so an empty table still gets one word.
        let mut bytes = data.to_vec();
        bytes.resize(data.len().max(4).next_multiple_of(4), 0);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("ft-temp"),
                contents: &bytes,
                usage: wgpu::BufferUsages::STORAGE,
            })
    }

    /// Submits one dispatch of `groups` workgroups of `kernel`; `params` fill the uniform at
    /// binding 0 and `binds` are `(binding, range)` pairs for exactly the bindings it uses.
    pub(crate) fn dispatch(
        &self,
        kernel: Kernel,
        constants: &[(&'static str, u32)],
        params: &[u32],
        binds: &[(u32, Bind<'_>)],
        groups: u64,
    ) -> Result<()> {
        if groups == 0 {
            return Ok(());
        }
        let max = u64::from(self.limits.max_compute_workgroups_per_dimension.max(1));
        let (gx, gy) = if groups <= max {
            (groups, 1)
        } else {
            (max, groups.div_ceil(max))
        };
        if gy > max {
            return Err(BackendError::Shape(format!(
                "{kernel:?}: {groups} workgroups exceed the adapter's grid"
            )));
        }
        let pipeline = self.pipeline(kernel, constants)?;
        let mut words = params.to_vec();
        words.resize(params.len().next_multiple_of(4).max(4), 0);
        let uniform = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("ft-params"),
                contents: bytemuck::cast_slice(&words),
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        for (slot, b) in binds {
            entries.push(wgpu::BindGroupEntry {
                binding: *slot,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: b.buffer,
                    offset: b.offset,
                    size: std::num::NonZeroU64::new(b.size),
                }),
            });
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(gx as u32, gy as u32, 1);
        }
        self.queue.submit([enc.finish()]);
        if let Some(e) = block_on(scope.pop()) {
            return Err(BackendError::Device(format!("{kernel:?}: {e}")));
        }
        self.check_device()
    }
}
