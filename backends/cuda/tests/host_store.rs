//! The f32 → f16/bf16 rounding of `kernels/elementwise.cu` (the KV cache's `store` kernels),
//! checked on the host: no GPU runs it in CI, so its two device functions are compiled as
//! plain C++ (`tests/host/store_harness.cpp`) and compared bit for bit with the reference
//! the CPU backend uses (the `half` crate's round-to-nearest-even, f16 saturating at ±65504)
//! over every special case and a million random bit patterns. NaNs only need to stay NaNs.
//!
//! Without a C++ compiler the test prints a `skipped:` line and passes.

use half::{bf16, f16};
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

/// The device functions of elementwise.cu, from the rounding comment to the first kernel.
fn rounding_source() -> String {
    let src = ft_backend_cuda::kernels::file("elementwise").expect("elementwise.cu").source;
    let start = src.find("// Round to nearest even").expect("rounding functions in elementwise.cu");
    let end = src.find("extern \"C\" __global__ void store_f16").expect("store_f16 in elementwise.cu");
    src[start..end].to_string()
}

#[test]
fn cuda_store_rounding_matches_the_reference_bit_for_bit() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        println!("skipped: cuda_store_rounding_matches_the_reference_bit_for_bit: no C++ compiler ({cxx})");
        return;
    }
    let mut values: Vec<u32> = vec![
        0, 0x8000_0000, 0x3f80_0000, 0x3f80_8000, 0x3f81_8000, 0x3f80_1000, 0x3f80_3000, 0x477f_e000, 0x477f_efff,
        0x477f_f000, 0x7f7f_ffff, 0x7f80_0000, 0xff80_0000, 0x3880_0000, 0x387f_ffff, 0x3300_0000, 0x3300_0001,
        0x32ff_ffff, 0x0000_0001, 0x33c0_0000, 0x3380_0000, 0x7fc0_0000, 0xffc0_0001,
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..1_000_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        values.push((seed >> 16) as u32);
    }
    // Every f16 subnormal and the normal range edges, as f32 bit patterns near them.
    values.extend((0x3300_0000u32..0x3880_0000).step_by(997));
    let dir = std::env::temp_dir().join(format!("ft-cuda-host-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let part = dir.join("rounding.cu");
    std::fs::write(&part, rounding_source()).expect("write source");
    let input = dir.join("in.bin");
    let output = dir.join("out.bin");
    std::fs::File::create(&input)
        .and_then(|mut f| f.write_all(&values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()))
        .expect("write values");
    let harness = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/host/store_harness.cpp");
    let exe = dir.join("store_harness");
    let build = Command::new(&cxx)
        .args(["-std=c++17", "-O1"])
        .arg(format!("-DSTORE_SOURCE=\"{}\"", part.display()))
        .arg(&harness)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run the C++ compiler");
    assert!(build.status.success(), "compiling the rounding functions as C++ failed:\n{}", String::from_utf8_lossy(&build.stderr));
    let run = Command::new(&exe).arg(&input).arg(&output).output().expect("run the harness");
    assert!(run.status.success(), "harness failed: {}", String::from_utf8_lossy(&run.stderr));
    let got = std::fs::read(&output).expect("read results");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(got.len(), values.len() * 4);
    let mut bad = vec![];
    for (i, &b) in values.iter().enumerate() {
        let x = f32::from_bits(b);
        let (h, bf) = (u16::from_le_bytes([got[4 * i], got[4 * i + 1]]), u16::from_le_bytes([got[4 * i + 2], got[4 * i + 3]]));
        let (want_h, want_bf) = (f16::from_f32(x.clamp(-65504.0, 65504.0)), bf16::from_f32(x));
        let ok = if x.is_nan() {
            f16::from_bits(h).is_nan() && bf16::from_bits(bf).is_nan()
        } else {
            h == want_h.to_bits() && bf == want_bf.to_bits()
        };
        if !ok && bad.len() < 8 {
            bad.push(format!("{b:#010x} ({x:e}): f16 {h:#06x} want {:#06x}, bf16 {bf:#06x} want {:#06x}", want_h.to_bits(), want_bf.to_bits()));
        }
    }
    assert!(bad.is_empty(), "the CUDA rounding differs from the reference:\n{}", bad.join("\n"));
}
