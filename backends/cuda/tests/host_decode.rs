//! The block decoders of `kernels/matmul_quant.cu`, checked on the host: no GPU runs them in
//! CI, so the CUDA C up to the kernel body (everything but the thread loop and reduction,
//! which mirror the lavapipe-tested WGSL) is compiled as plain C++ with `c++` against small
//! shims (`tests/host/decode_harness.cpp`) and every 32-value unit of random and of
//! quantized blocks is compared bit for bit with `ft_backend::quant::decode_block`.
//!
//! Without a C++ compiler the test prints a `skipped:` line and passes.

use ft_backend::DType;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

/// The matmul_quant.cu text before the kernel body (marked by its `// Grid` comment).
fn decoders() -> &'static str {
    let src = ft_backend_cuda::kernels::file("matmul_quant").expect("matmul_quant.cu").source;
    let end = src.find("// Grid (m, ceil(n / QM_TB))").expect("kernel marker in matmul_quant.cu");
    &src[..end]
}

/// Per block type: its code (the order of `DType::QUANTIZED`, which is the `Q_*` order),
/// block size, 64 blocks of bytes (half random, half quantized values) and their decoding.
fn cases() -> Vec<u8> {
    let mut out = Vec::new();
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (code, dt) in DType::QUANTIZED.iter().enumerate() {
        let (be, bb, nb) = (dt.block_elems(), dt.size(), 64usize);
        let mut bytes: Vec<u8> = (0..nb * bb).map(|_| rnd() as u8).collect();
        let vals: Vec<f32> = (0..nb / 2 * be)
            .map(|i| ((rnd() % 2001) as f32 / 1000.0 - 1.0) * (1.0 + (i / be) as f32))
            .collect();
        let q = ft_backend::quant::quantize_matrix(*dt, &vals, nb / 2, be);
        bytes[..q.len()].copy_from_slice(&q);
        let mut want = vec![0f32; nb * be];
        for b in 0..nb {
            ft_backend::quant::decode_block(*dt, &bytes[b * bb..][..bb], &mut want[b * be..][..be]);
        }
        for v in [code, be, bb, nb] {
            out.extend_from_slice(&(v as u32).to_le_bytes());
        }
        out.extend_from_slice(&bytes);
        want.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    }
    out
}

#[test]
fn cuda_block_decoders_match_the_reference_bit_for_bit() {
    // The Q_* codes of the .cu file follow DType::QUANTIZED.
    assert_eq!(
        DType::QUANTIZED,
        [DType::F8E4M3, DType::Nvfp4, DType::Mxfp4, DType::Q8_0, DType::Q4_0, DType::Q4K, DType::Q5K, DType::Q6K]
    );
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        println!("skipped: cuda_block_decoders_match_the_reference_bit_for_bit: no C++ compiler ({cxx})");
        return;
    }
    let dir = std::env::temp_dir().join(format!("ft-cuda-host-decode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let part = dir.join("decoders.cu");
    std::fs::write(&part, decoders()).expect("write decoders");
    let data = dir.join("cases.bin");
    std::fs::File::create(&data).and_then(|mut f| f.write_all(&cases())).expect("write cases");
    let harness = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/host/decode_harness.cpp");
    let exe = dir.join("decode_harness");
    let build = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-ffp-contract=off", "-Wno-unknown-pragmas", "-Wno-unused-result"])
        .arg(format!("-DDECODE_SOURCE=\"{}\"", part.display()))
        .arg(&harness)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run the C++ compiler");
    assert!(build.status.success(), "compiling the decoders as C++ failed:\n{}", String::from_utf8_lossy(&build.stderr));
    let run = Command::new(&exe).arg(&data).output().expect("run the harness");
    let report = String::from_utf8_lossy(&run.stdout).to_string();
    let _ = std::fs::remove_dir_all(&dir);
    println!("{report}");
    assert!(run.status.success(), "harness failed: {report}");
    let lines: Vec<&str> = report.lines().filter(|l| l.contains(" values differ")).collect();
    assert_eq!(lines.len(), DType::QUANTIZED.len(), "{report}");
    for l in lines {
        assert!(l.contains(": 0/"), "{report}");
    }
}
