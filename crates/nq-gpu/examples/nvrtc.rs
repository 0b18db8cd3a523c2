//! Compiles the GPU kernel through the worker's own NVRTC path, for CI
//! (`.ci/gpu.sh`), which then checks the PTX with `ptxas`.
//!
//! ```text
//! nvrtc --n N --arch compute_90 --out FILE   # one PTX
//! nvrtc --write-embedded                     # rebuild kernel/count.ptx
//! nvrtc --check-embedded                     # fail if kernel/count.ptx differs
//! ```
//!
//! NVRTC is found through `LD_LIBRARY_PATH` (cudarc has no path override).

use std::process::ExitCode;

use nq_gpu::{
    Arch, EMBEDDED_ARCH, EMBEDDED_N, EMBEDDED_PTX, compile_ptx, embedded_header,
};

const USAGE: &str = "usage: nvrtc --n N --arch compute_80|compute_89|compute_90|compute_120 --out FILE | --write-embedded | --check-embedded";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvrtc: {e}");
            ExitCode::FAILURE
        }
    }
}

fn embedded() -> Result<String, String> {
    let arch = Arch::parse(EMBEDDED_ARCH).expect("a known arch");
    let ptx = compile_ptx(EMBEDDED_N, arch).map_err(|e| e.to_string())?;
    Ok(format!("{}{ptx}", embedded_header()))
}

fn run(args: Vec<String>) -> Result<(), String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/kernel/count.ptx");
    match args.first().map(String::as_str) {
        Some("--write-embedded") => {
            std::fs::write(path, embedded()?).map_err(|e| format!("{path}: {e}"))?;
            println!("wrote {path}");
            Ok(())
        }
        Some("--check-embedded") => {
            if embedded()? == EMBEDDED_PTX {
                println!("{path} matches NVRTC's output for the current source");
                Ok(())
            } else {
                Err(format!(
                    "{path} differs from NVRTC's output for the current source: run bash .ci/gpu.sh --write-embedded"
                ))
            }
        }
        _ => {
            let (mut n, mut arch, mut out) = (None, None, None);
            let mut it = args.iter();
            while let Some(flag) = it.next() {
                let value = it.next().ok_or(USAGE)?;
                match flag.as_str() {
                    "--n" => n = Some(value.parse::<u8>().map_err(|_| USAGE)?),
                    "--arch" => arch = Some(Arch::parse(value).ok_or(USAGE)?),
                    "--out" => out = Some(value.clone()),
                    _ => return Err(USAGE.into()),
                }
            }
            let (Some(n), Some(arch), Some(out)) = (n, arch, out) else {
                return Err(USAGE.into());
            };
            if !(1..=32).contains(&n) {
                return Err(format!("--n {n}: the kernel takes boards of 1 to 32"));
            }
            let ptx = compile_ptx(n, arch).map_err(|e| e.to_string())?;
            std::fs::write(&out, ptx).map_err(|e| format!("{out}: {e}"))?;
            println!("compiled N = {n} for {} into {out}", arch.name());
            Ok(())
        }
    }
}
