//! The CUDA C sources, embedded in the binary and compiled at run time by NVRTC.

/// Helpers every kernel file uses; prepended to each file before compiling.
pub const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// One `.cu` file of the top-level `kernels/`.
#[derive(Clone, Copy, Debug)]
pub struct KernelFile {
    /// File stem, also the module name (`matmul` for `matmul.cu`).
    pub name: &'static str,
    /// The file's text.
    pub source: &'static str,
}

impl KernelFile {
    /// The text NVRTC compiles: [`COMMON`], then the file, with `#line` so that compiler
    /// messages name the real file and line.
    pub fn full_source(&self) -> String {
        format!("{COMMON}\n#line 1 \"{}.cu\"\n{}", self.name, self.source)
    }
}

macro_rules! kernel_files {
    ($($name:literal),* $(,)?) => {
        /// Every kernel file, split by op so that no one module takes long to compile.
        pub const FILES: &[KernelFile] = &[
            $(KernelFile { name: $name, source: include_str!(concat!("../../../kernels/", $name, ".cu")) }),*
        ];
    };
}

kernel_files!("matmul", "matmul_quant", "norm", "rope", "attention", "elementwise", "softmax_topk", "gather_scatter", "recurrent");

/// The kernel file named `name`, if there is one.
pub fn file(name: &str) -> Option<&'static KernelFile> {
    FILES.iter().find(|f| f.name == name)
}
