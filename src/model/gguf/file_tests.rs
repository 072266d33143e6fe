use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A folder under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ft-gguf-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

/// A minimal GGUF writer; tensor data is laid out at aligned offsets with no trailing padding.
struct Builder {
    version: u32,
    align: usize,
    n_kv: u64,
    kv: Vec<u8>,
    n_tensors: u64,
    infos: Vec<u8>,
    data: Vec<u8>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.extend(x.to_le_bytes()),
        MetaValue::I8(x) => out.extend(x.to_le_bytes()),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(a) => {
            out.extend(a.first().map_or(0, type_id).to_le_bytes());
            out.extend((a.len() as u64).to_le_bytes());
            for x in a {
                put_value(out, x);
            }
        }
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

impl Builder {
    fn new() -> Builder {
        Builder { version: 3, align: 32, n_kv: 0, kv: vec![], n_tensors: 0, infos: vec![], data: vec![] }
    }
    fn kv(mut self, key: &str, v: MetaValue) -> Builder {
        self.n_kv += 1;
        put_str(&mut self.kv, key);
        self.kv.extend(type_id(&v).to_le_bytes());
        put_value(&mut self.kv, &v);
        self
    }
    fn alignment(mut self, a: u32) -> Builder {
        self.align = a as usize;
        self.kv("general.alignment", MetaValue::U32(a))
    }
    /// A tensor info with everything given explicitly (for malformed files).
    fn info(mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Builder {
        self.n_tensors += 1;
        put_str(&mut self.infos, name);
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(ty.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self
    }
    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, bytes: &[u8]) -> Builder {
        let offset = self.data.len().div_ceil(self.align) * self.align;
        self.data.resize(offset, 0);
        self.data.extend(bytes);
        self.info(name, dims, ty, offset as u64)
    }
    fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.infos);
        if !self.data.is_empty() {
            out.resize(out.len().div_ceil(self.align) * self.align, 0);
            out.extend(&self.data);
        }
        out
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn all_values() -> Vec<(&'static str, MetaValue)> {
    use MetaValue::*;
    vec![
        ("t.u8", U8(200)),
        ("t.i8", I8(-5)),
        ("t.u16", U16(60000)),
        ("t.i16", I16(-300)),
        ("t.u32", U32(4_000_000_000)),
        ("t.i32", I32(-70000)),
        ("t.f32", F32(1.5)),
        ("t.bool", Bool(true)),
        ("t.str", String("héllo".into())),
        ("t.u64", U64(1 << 40)),
        ("t.i64", I64(-(1 << 40))),
        ("t.f64", F64(0.1)),
        ("t.strs", Array(vec![String("a".into()), String("".into()), String("ünï".into())])),
        ("t.ints", Array(vec![I32(1), I32(-2), I32(3)])),
        ("t.nested", Array(vec![Array(vec![U8(1), U8(2)]), Array(vec![U8(3)])])),
        ("t.empty", Array(vec![])),
    ]
}

fn q8_block(scale_bits: u16, fill: i8) -> Vec<u8> {
    let mut b = scale_bits.to_le_bytes().to_vec();
    b.extend((0..32).map(|i| (fill.wrapping_add(i)) as u8));
    b
}

/// A valid file: all value types, an F32 tensor followed by padding, then a Q8_0 tensor.
fn sample() -> (Builder, Vec<u8>, Vec<u8>) {
    let f = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, -6.5]);
    let q: Vec<u8> = [q8_block(0x3c00, -10), q8_block(0x3800, 7)].concat();
    let mut b = Builder::new().kv("general.architecture", MetaValue::String("qwen3moe".into()));
    for (k, v) in all_values() {
        b = b.kv(k, v);
    }
    b = b.tensor("f", &[3, 2], 0, &f).tensor("q", &[32, 2], 8, &q);
    (b, f, q)
}

fn format_problem(r: Result<GgufFile, GgufError>) -> String {
    match r {
        Err(e @ GgufError::Format { .. }) => e.to_string(),
        Err(e) => panic!("expected a format error, got {e}"),
        Ok(_) => panic!("expected a format error, the file opened"),
    }
}

fn open_err(b: &Builder) -> String {
    let dir = TempDir::new("err");
    format_problem(GgufFile::open(&dir.write("bad.gguf", &b.build())))
}

#[test]
fn round_trips_values_and_tensors() {
    for version in [2, 3] {
        let (mut b, f, q) = sample();
        b.version = version;
        let bytes = b.build();
        let dir = TempDir::new("rt");
        let path = dir.write("m.gguf", &bytes);
        let g = GgufFile::open(&path).unwrap();
        for (k, v) in all_values() {
            assert_eq!(g.get(k), Some(&v), "{k}");
        }
        assert_eq!(g.get("general.architecture").and_then(MetaValue::as_str), Some("qwen3moe"));
        assert_eq!(g.metadata().len(), all_values().len() + 1);
        assert_eq!(g.tensor_names().collect::<Vec<_>>(), ["f", "q"]);
        let tf = g.tensor("f").unwrap();
        assert_eq!((tf.ggml_type, tf.dims.clone(), tf.bytes.as_slice()), (0, vec![3, 2], &f[..]));
        let tq = g.tensor("q").unwrap();
        assert_eq!((tq.ggml_type, tq.dims.clone(), tq.bytes.as_slice()), (8, vec![32, 2], &q[..]));
        assert_eq!(tq.file, path);
        assert!(g.contains("q") && !g.contains("x"));
        assert_eq!((g.path(), g.files()), (path.as_path(), &[path.clone()][..]));
        assert_eq!(g.total_bytes(), bytes.len() as u64);
        match g.tensor("nope") {
            Err(e @ GgufError::MissingTensor { .. }) => assert!(e.to_string().contains("`nope`") && e.to_string().contains("m.gguf")),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn custom_alignment() {
    let f = f32_bytes(&[1.0; 5]);
    let b = Builder::new().alignment(64).tensor("a", &[5], 0, &f).tensor("b", &[5], 0, &f);
    let dir = TempDir::new("align");
    let g = GgufFile::open(&dir.write("m.gguf", &b.build())).unwrap();
    let (a, bb) = (g.tensor("a").unwrap(), g.tensor("b").unwrap());
    assert_eq!((a.bytes.as_slice(), bb.bytes.as_slice()), (&f[..], &f[..]));
    // Padding zeros sit where the default alignment would have put `b`.
    assert_eq!(g.total_bytes() as usize % 64, 20);
    let off32 = Builder::new().alignment(64).tensor("a", &[5], 0, &f).info("b", &[1], 0, 32);
    assert!(open_err(&off32).contains("not a multiple of the alignment 64"));
    let bad = Builder::new().alignment(48).tensor("a", &[5], 0, &f);
    assert!(open_err(&bad).contains("not a power of two"));
}

#[test]
fn every_prefix_is_an_error() {
    let bytes = sample().0.build();
    let path = Path::new("prefix.gguf");
    assert!(parse(path, &bytes).is_ok());
    for n in 0..bytes.len() {
        let e = parse(path, &bytes[..n]).err().unwrap_or_else(|| panic!("prefix of {n} bytes parsed"));
        assert!(matches!(e, GgufError::Format { .. }), "{e}");
    }
    let dir = TempDir::new("prefix");
    for n in [0, 3, 4, 10, 30, bytes.len() / 2, bytes.len() - 1] {
        format_problem(GgufFile::open(&dir.write("p.gguf", &bytes[..n])));
    }
}

#[test]
fn header_errors() {
    let good = sample().0.build();
    let dir = TempDir::new("hdr");
    let mut elf = good.clone();
    elf[..4].copy_from_slice(b"\x7fELF");
    assert!(format_problem(GgufFile::open(&dir.write("a.gguf", &elf))).contains("not a GGUF file"));
    let with_version = |v: u32| {
        let mut b = good.clone();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        format_problem(GgufFile::open(&dir.write("v.gguf", &b)))
    };
    assert!(with_version(1).contains("version 1 is not supported"));
    assert!(with_version(3u32.swap_bytes()).contains("big-endian"));
    assert!(with_version(7).contains("unsupported GGUF version 7"));

    let mut b = Builder::new().kv("x", MetaValue::U8(1));
    b.kv[8 + 1..8 + 1 + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(open_err(&b).contains("unknown value type 13"));
    let mut b = Builder::new().kv("k", MetaValue::String("abc".into()));
    b.kv[8 + 1 + 4..8 + 1 + 4 + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(open_err(&b).contains("truncated"));
    let mut b = Builder::new().kv("k", MetaValue::Array(vec![MetaValue::U8(1)]));
    b.kv[8 + 1 + 4 + 4..8 + 1 + 4 + 4 + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(open_err(&b).contains("claims 1152921504606846976 array elements"));
    let mut b = Builder::new();
    b.n_kv = u64::MAX;
    assert!(open_err(&b).contains("metadata entries"));
    let b = Builder::new().kv("k", MetaValue::U8(1)).kv("k", MetaValue::U8(2));
    assert!(open_err(&b).contains("`k` appears twice"));
    let mut deep = MetaValue::U8(0);
    for _ in 0..40 {
        deep = MetaValue::Array(vec![deep]);
    }
    assert!(open_err(&Builder::new().kv("deep", deep)).contains("nests arrays"));
}

#[test]
fn tensor_errors() {
    let f = f32_bytes(&[0.0; 8]);
    let one = |dims: &[u64], ty: u32, offset: u64| {
        let mut b = Builder::new().tensor("pad", &[8], 0, &f);
        b = b.info("t", dims, ty, offset);
        open_err(&b)
    };
    assert!(one(&[1, 1, 1, 1, 1], 0, 0).contains("5 dimensions"));
    assert!(one(&[4, 0], 0, 0).contains("zero"));
    assert!(one(&[1 << 40, 1 << 40], 0, 0).contains("too many elements"));
    assert!(one(&[4], 123, 0).contains("unknown ggml type 123"));
    assert!(one(&[4], 31, 0).contains("unknown ggml type 31 (Q4_0_4_4"));
    assert!(one(&[16], 8, 0).contains("not a multiple of the Q8_0 block size 32"));
    assert!(one(&[4], 0, 8).contains("not a multiple of the alignment 32"));
    assert!(one(&[16], 0, 0).contains("offset past the end"));
    assert!(one(&[4], 0, 1 << 62).contains("past the end"));
    assert!(one(&[4], 0, u64::MAX - 31).contains("past the end"));
    let dup = Builder::new().tensor("t", &[8], 0, &f).tensor("t", &[8], 0, &f);
    assert!(open_err(&dup).contains("`t` appears twice"));
}

fn split(no: u16, count: u16, tensors: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = Builder::new().kv("split.no", MetaValue::U16(no)).kv("split.count", MetaValue::U16(count));
    if no == 0 {
        b = b.kv("general.architecture", MetaValue::String("llama".into()));
        b = b.kv("split.tensors.count", MetaValue::I32(3));
    }
    for (name, data) in tensors {
        b = b.tensor(name, &[data.len() as u64 / 4], 0, data);
    }
    b.build()
}

#[test]
fn split_files_open_from_the_first() {
    let (a, bb, c) = (f32_bytes(&[1.0; 4]), f32_bytes(&[2.0; 8]), f32_bytes(&[3.0; 2]));
    let dir = TempDir::new("split");
    let first = dir.write("m-00001-of-00002.gguf", &split(0, 2, &[("a", &a), ("b", &bb)]));
    let second = dir.write("m-00002-of-00002.gguf", &split(1, 2, &[("c", &c)]));
    let g = GgufFile::open(&first).unwrap();
    assert_eq!(g.files(), &[first.clone(), second.clone()][..]);
    assert_eq!(g.tensor_names().collect::<Vec<_>>(), ["a", "b", "c"]);
    let tc = g.tensor("c").unwrap();
    assert_eq!((tc.bytes.as_slice(), &tc.file), (&c[..], &second));
    assert_eq!(g.tensor("b").unwrap().file, first);
    assert_eq!(g.get("general.architecture").and_then(MetaValue::as_str), Some("llama"));
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert_eq!(g.total_bytes(), size(&first) + size(&second));

    let e = format_problem(GgufFile::open(&second));
    assert!(e.contains("split 2 of 2") && e.contains("m-00001-of-00002.gguf"), "{e}");

    // The same tensor in both splits.
    dir.write("m-00002-of-00002.gguf", &split(1, 2, &[("a", &c)]));
    assert!(format_problem(GgufFile::open(&first)).contains("`a` appears again"));
    // Wrong split.no in the second file.
    dir.write("m-00002-of-00002.gguf", &split(0, 2, &[("c", &c)]));
    assert!(format_problem(GgufFile::open(&first)).contains("split.no is 0"));
    // split.tensors.count disagreeing with the tensors found.
    dir.write("m-00002-of-00002.gguf", &split(1, 2, &[("c", &c), ("d", &c)]));
    assert!(format_problem(GgufFile::open(&first)).contains("split.tensors.count"));
    std::fs::remove_file(&second).unwrap();
    assert!(format_problem(GgufFile::open(&first)).contains("split 2 of 2 is missing"));

    // A split file renamed so its name no longer says so.
    let lone = dir.write("renamed.gguf", &split(0, 2, &[("a", &a)]));
    assert!(format_problem(GgufFile::open(&lone)).contains("one of 2 splits"));
    let three = dir.write("n-00001-of-00003.gguf", &split(0, 2, &[("a", &a)]));
    dir.write("n-00002-of-00003.gguf", &split(1, 2, &[]));
    dir.write("n-00003-of-00003.gguf", &split(2, 2, &[]));
    assert!(format_problem(GgufFile::open(&three)).contains("split.count is 2"));
}

#[test]
fn missing_file_is_io_error() {
    let dir = TempDir::new("io");
    match GgufFile::open(&dir.0.join("absent.gguf")) {
        Err(e @ GgufError::Io { .. }) => assert!(e.to_string().contains("absent.gguf")),
        other => panic!("{:?}", other.err()),
    }
}

#[test]
fn type_table() {
    assert_eq!(ggml_block(0), Some((1, 4)));
    assert_eq!(ggml_block(8), Some((32, 34)));
    assert_eq!(ggml_block(12), Some((256, 144)));
    assert_eq!(ggml_block(14), Some((256, 210)));
    assert_eq!(ggml_block(39), Some((32, 17)));
    assert_eq!(ggml_block(31), None);
    assert_eq!(ggml_block(999), None);
    assert_eq!(ggml_type_name(30), "BF16");
    assert_eq!(ggml_type_name(16), "IQ2_XXS");
    assert_eq!(ggml_type_name(39), "MXFP4");
    assert_eq!(ggml_type_name(123), "type 123");
}

const PY_WRITER: &str = r#"
import sys, numpy as np, gguf
from gguf.quants import quantize
out = sys.argv[1]
w = gguf.GGUFWriter(out + "/py.gguf", "llama")
w.add_uint8("t.u8", 200)
w.add_int16("t.i16", -300)
w.add_uint32("t.u32", 4000000000)
w.add_int32("t.i32", -70000)
w.add_uint64("t.u64", 2**40)
w.add_int64("t.i64", -2**40)
w.add_float32("t.f32", 1.5)
w.add_float64("t.f64", 0.1)
w.add_bool("t.bool", True)
w.add_string("t.str", "héllo")
w.add_array("t.strs", ["a", "bc", "ünï"])
w.add_array("t.ints", [1, -2, 3])
w.add_array("t.floats", [0.5, 2.0])
f = (np.arange(12, dtype=np.float32) * 0.25).reshape(3, 4)
w.add_tensor("f", f)
src = np.linspace(-1.0, 1.0, 128, dtype=np.float32).reshape(2, 64)
q = quantize(src, gguf.GGMLQuantizationType.Q8_0)
w.add_tensor("q", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
open(out + "/f.bin", "wb").write(f.tobytes())
open(out + "/q.bin", "wb").write(q.tobytes())
"#;

#[test]
fn reads_a_file_written_by_gguf_py() {
    let python = std::env::var_os("FT_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    let require = std::env::var("FT_REQUIRE_GGUF_PY").is_ok_and(|v| v == "1");
    let probe = std::process::Command::new(&python).args(["-c", "import gguf, numpy"]).output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        let why = match &probe {
            Ok(o) => std::string::String::from_utf8_lossy(&o.stderr).into_owned(),
            Err(e) => e.to_string(),
        };
        assert!(!require, "FT_REQUIRE_GGUF_PY=1 but {} cannot import gguf: {why}", python.display());
        eprintln!("skipping the gguf-py cross-check: {} cannot import gguf and numpy ({why})", python.display());
        return;
    }
    let dir = TempDir::new("py");
    let run = std::process::Command::new(&python).args(["-c", PY_WRITER]).arg(&dir.0).output().unwrap();
    assert!(run.status.success(), "gguf-py writer failed: {}", std::string::String::from_utf8_lossy(&run.stderr));

    let g = GgufFile::open(&dir.0.join("py.gguf")).unwrap();
    use MetaValue::*;
    let expect = [
        ("general.architecture", String("llama".into())),
        ("t.u8", U8(200)),
        ("t.i16", I16(-300)),
        ("t.u32", U32(4_000_000_000)),
        ("t.i32", I32(-70000)),
        ("t.u64", U64(1 << 40)),
        ("t.i64", I64(-(1 << 40))),
        ("t.f32", F32(1.5)),
        ("t.f64", F64(0.1)),
        ("t.bool", Bool(true)),
        ("t.str", String("héllo".into())),
        ("t.strs", Array(vec![String("a".into()), String("bc".into()), String("ünï".into())])),
        ("t.ints", Array(vec![I32(1), I32(-2), I32(3)])),
        ("t.floats", Array(vec![F32(0.5), F32(2.0)])),
    ];
    for (k, v) in expect {
        assert_eq!(g.get(k), Some(&v), "{k}");
    }
    let read = |n: &str| std::fs::read(dir.0.join(n)).unwrap();
    let f = g.tensor("f").unwrap();
    assert_eq!((f.ggml_type, f.dims.clone()), (0, vec![4, 3]));
    assert_eq!(f.bytes.as_slice(), &read("f.bin")[..]);
    let q = g.tensor("q").unwrap();
    assert_eq!((q.ggml_type, q.dims.clone()), (8, vec![64, 2]));
    assert_eq!(q.bytes.as_slice(), &read("q.bin")[..]);
}
