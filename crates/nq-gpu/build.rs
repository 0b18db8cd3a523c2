//! Compiles the kernel's own source as host C++ (kernel/host.cpp includes
//! kernel/count.cu through kernel/shim.h), under UBSan, for the tests in
//! `src/host.rs`.
//!
//! Only where a C++ compiler works: the crate itself needs none (the GPU
//! compiles the kernel at run time through NVRTC). CI has g++, and a test
//! fails there if this step was skipped. Nothing outside the tests refers to
//! the library built here, so the linker leaves it (and libubsan) out of
//! every binary.

fn main() {
    println!("cargo::rerun-if-changed=kernel");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(nq_host_kernel)");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("kernel/host.cpp")
        .include("kernel")
        .std("c++17")
        .opt_level(2)
        // A shift by 32 or more gives 0 on the GPU but not on x86: UBSan makes
        // it (and any other undefined behaviour) abort the test.
        .flag("-fsanitize=undefined")
        .flag("-fno-sanitize-recover=all")
        .warnings(true)
        .extra_warnings(true)
        .cargo_warnings(false);
    match build.try_compile("nq_gpu_host_kernel") {
        Ok(()) => {
            println!("cargo::rustc-link-lib=dylib=ubsan");
            println!("cargo::rustc-cfg=nq_host_kernel");
        }
        Err(e) => {
            println!(
                "cargo::warning=nq-gpu: no host C++ build of the kernel ({e}); \
                 its CPU tests are skipped"
            );
        }
    }
}
