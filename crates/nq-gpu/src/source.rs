//! The kernel source, and the PTX built from it in CI for hosts whose driver
//! has no NVRTC beside it.
//!
//! `kernel/count.ptx` is NVRTC's output for `-DNQ_N=32` (valid for every
//! board: N only sizes the stack) and `compute_80` (which the driver JIT
//! compiles for any later GPU), after one header line that records the FNV-1a
//! hash of `kernel/count.cu` it was built from. A test checks that hash
//! against the source, so an edit of the kernel without a rebuild of the PTX
//! fails; CI rebuilds the PTX with the pinned NVRTC and fails on any
//! difference. Regenerate it with `bash .ci/gpu.sh --write-embedded`.

/// The kernel's CUDA C source.
pub const KERNEL_SOURCE: &str = include_str!("../kernel/count.cu");

/// The embedded PTX, header line included.
pub const EMBEDDED_PTX: &str = include_str!("../kernel/count.ptx");

/// The board size the embedded PTX is compiled for: the largest, so that its
/// stack holds every board.
pub const EMBEDDED_N: u8 = 32;

/// The virtual architecture the embedded PTX targets.
pub const EMBEDDED_ARCH: &str = "compute_80";

/// FNV-1a, 64 bits: enough to tell two versions of one file apart, and a few
/// lines with no dependency.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The header line of the embedded PTX for the current kernel source
/// (newline included). The PTX file is this line followed by NVRTC's output.
pub fn embedded_header() -> String {
    format!(
        "// nq-gpu embedded PTX of kernel/count.cu fnv1a64={:016x}, -DNQ_N={EMBEDDED_N}, {EMBEDDED_ARCH}; regenerate with: bash .ci/gpu.sh --write-embedded\n",
        fnv1a64(KERNEL_SOURCE.as_bytes())
    )
}

/// True when [`EMBEDDED_PTX`] was built from [`KERNEL_SOURCE`].
pub(crate) fn embedded_is_current() -> bool {
    EMBEDDED_PTX.starts_with(&embedded_header())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded PTX was regenerated after the last edit of the kernel.
    #[test]
    fn embedded_ptx_matches_the_kernel_source() {
        let first = EMBEDDED_PTX.lines().next().unwrap_or("");
        assert!(
            embedded_is_current(),
            "kernel/count.ptx is stale: its header is\n  {first}\nbut the source needs\n  {}run: bash .ci/gpu.sh --write-embedded",
            embedded_header()
        );
        // And it is real NVRTC output for the entry point, with no local
        // memory (a stack frame would mean spills or a local array).
        assert!(EMBEDDED_PTX.contains(".entry nq_count"));
        assert!(EMBEDDED_PTX.contains(".target sm_80"));
        assert!(!EMBEDDED_PTX.contains(".local"));
    }

    #[test]
    fn the_hash_tells_sources_apart() {
        assert_ne!(fnv1a64(b"a"), fnv1a64(b"b"));
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    }
}
