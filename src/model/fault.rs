//! Faults of the expert pipeline (copies, CPU executors, the actors between them), typed so
//! that the API can tell a device that is out of memory for now (retry) from a real fault.

use ft_backend::BackendError;

/// What failed while a layer's experts were computed outside the reference pass.
#[derive(Debug, thiserror::Error)]
pub enum PipelineFault {
    /// Copying an expert (or a whole layer, `expert: None`) to the device failed.
    #[error("copying {} of layer {layer} to the device: {source}", expert_name(*.expert))]
    Copy {
        /// The MoE layer.
        layer: usize,
        /// The expert, or `None` for a whole-layer copy.
        expert: Option<u32>,
        /// What the backend said.
        #[source]
        source: BackendError,
    },
    /// The CPU executors failed on an expert.
    #[error("CPU executors, expert {expert} of layer {layer}: {source}")]
    Cpu {
        /// The MoE layer.
        layer: usize,
        /// The expert.
        expert: u32,
        /// What the kernels said.
        #[source]
        source: BackendError,
    },
    /// An actor of the pipeline stopped before replying.
    #[error("the {0} stopped before replying")]
    Stopped(&'static str),
    /// The pipeline's own bookkeeping failed (a slot missing, a lock poisoned).
    #[error("expert pipeline: {0}")]
    Internal(String),
}

fn expert_name(e: Option<u32>) -> String {
    e.map_or_else(|| "every expert".into(), |e| format!("expert {e}"))
}

impl PipelineFault {
    /// The backend error underneath, if any.
    pub fn backend(&self) -> Option<&BackendError> {
        match self {
            PipelineFault::Copy { source, .. } | PipelineFault::Cpu { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Whether `e` says the device ran out of memory (other work holds it: retrying can succeed).
pub fn is_out_of_memory(e: &BackendError) -> bool {
    matches!(e, BackendError::OutOfMemory { .. })
}
