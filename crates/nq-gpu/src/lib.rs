//! The GPU counter of nq: a CUDA kernel that counts the completions of the
//! border split's sub-problems, the host code that packs them for it, and the
//! driver calls that run it.
//!
//! The kernel is one file, `kernel/count.cu`, in a subset of CUDA C (no
//! barriers, no warp intrinsics, no inline PTX) so that the SAME text is
//! compiled three ways: by NVRTC at run time on a GPU host (with `-DNQ_N` for
//! the board), by NVRTC in CI into the PTX embedded here for hosts without
//! NVRTC, and as host C++ under UBSan for the tests, which compare it with
//! nq-core on every sub-problem of N = 4..12 and more.
//!
//! Nothing here links CUDA: the driver (`libcuda.so.1`) and NVRTC
//! (`libnvrtc.so.12`) are loaded at run time by cudarc, after this crate has
//! checked that they are present (cudarc panics on a missing library). A
//! machine without them gets [`Error::NoDriver`], [`Error::NoDevice`] or a
//! compile error naming what is missing.
//!
//! # Exactness
//!
//! Each task's count is a `u64` on the GPU, bounded below `2^64` by
//! construction ([`mod@pack`]); the host folds them into `u128` with checked adds,
//! and the worker checks every sub-problem's counts with
//! `SubProblem::check` before they count, as on the CPU path. Before any
//! work, [`Gpu::self_test`] counts N = 12 on the GPU against nq-core's
//! depth-first reference and refuses on any difference.
//!
//! # Layout
//!
//! * `pack`: sub-problems into the kernel's tables and tasks, results back
//!   into per-sub-problem counts ([`pack()`], [`Batch`]).
//! * `source`: the kernel source, its embedded PTX and the check that the two
//!   match ([`KERNEL_SOURCE`], [`EMBEDDED_PTX`]).
//! * `device`: every cudarc call: library checks, NVRTC, launch ([`Gpu`],
//!   [`compile_ptx`]).
//! * `host` (tests only): the kernel compiled as host C++, run on OS threads.

#![deny(missing_docs)]

mod device;
#[cfg(all(test, nq_host_kernel))]
mod host;
pub mod pack;
mod source;

pub use device::{
    Arch, Finished, Gpu, KernelCounters, Launch, LaunchTimes, Libraries, SLOTS,
    add_stats, compile_ptx, device_count, libraries,
};
pub use pack::{Batch, pack};
pub use source::{
    EMBEDDED_ARCH, EMBEDDED_N, EMBEDDED_PTX, KERNEL_SOURCE, embedded_header,
};

/// The name results computed here are reported under (`JobResult.kernel`),
/// so that a check of them runs on a CPU kernel.
pub const KERNEL_NAME: &str = "cuda";

/// Threads per block: `NQ_BLOCK` in the kernel, which it is compiled for.
pub const BLOCK: u32 = 64;

/// What went wrong on the GPU path. The first four are a machine without a
/// usable GPU; each message names what is missing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `libcuda.so.1` could not be loaded.
    #[error(
        "no NVIDIA driver: libcuda.so.1 could not be loaded (install the NVIDIA driver, or run without --gpu)"
    )]
    NoDriver,
    /// The driver loaded but reports no device.
    #[error(
        "no NVIDIA GPU: the driver is installed but reports no CUDA device ({reason})"
    )]
    NoDevice {
        /// The driver's answer.
        reason: String,
    },
    /// `--gpu` names a device that does not exist.
    #[error(
        "GPU device {index} does not exist: this machine has {count} CUDA device(s), numbered from 0"
    )]
    DeviceIndex {
        /// The index asked for.
        index: usize,
        /// Devices present.
        count: usize,
    },
    /// Neither NVRTC nor the embedded PTX could give a kernel for the device.
    #[error(
        "no way to compile the GPU kernel: NVRTC (libnvrtc.so.12) is not installed and the driver refused the embedded PTX ({reason}); install the CUDA NVRTC library or a driver of CUDA 12.9 (R575) or newer"
    )]
    NoCompiler {
        /// Why the embedded PTX was refused.
        reason: String,
    },
    /// NVRTC is not installed (asked for explicitly, as by `compile_ptx`).
    #[error(
        "NVRTC is not installed: libnvrtc.so.12 could not be loaded (set LD_LIBRARY_PATH to its folder)"
    )]
    NoNvrtc,
    /// NVRTC rejected the kernel source.
    #[error("NVRTC failed to compile the kernel for {arch}: {log}")]
    Compile {
        /// The target.
        arch: &'static str,
        /// NVRTC's message and log.
        log: String,
    },
    /// A driver call failed.
    #[error("CUDA driver call {call} failed: {source}")]
    Driver {
        /// What was being done.
        call: &'static str,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// The startup self-test found a difference with the CPU reference.
    #[error(
        "the GPU kernel failed its startup check: sub-problem {subproblem} of N = 12 gave {got} completions and {got_nodes} nodes, the CPU reference {want} and {want_nodes}; refusing to count on this GPU"
    )]
    SelfTest {
        /// The sub-problem's prefix.
        subproblem: String,
        /// The GPU's count.
        got: u128,
        /// The GPU's nodes.
        got_nodes: u64,
        /// The reference count.
        want: u128,
        /// The reference nodes.
        want_nodes: u64,
    },
    /// [`pack()`] was given sub-problems of two board sizes.
    #[error(
        "a GPU batch mixes boards of N = {first} and N = {other}: pack one board at a time"
    )]
    MixedBoards {
        /// The first sub-problem's N.
        first: u8,
        /// Another N.
        other: u8,
    },
    /// More tasks than the kernel's 32-bit counter addresses.
    #[error(
        "{tasks} GPU tasks do not fit the kernel's 32-bit task counter: submit fewer sub-problems per batch"
    )]
    TooManyTasks {
        /// The number of tasks.
        tasks: usize,
    },
    /// [`Gpu::submit`] was called with every stream busy.
    #[error(
        "all {slots} GPU streams are busy: finish a launch before submitting another"
    )]
    SlotsBusy {
        /// Streams per GPU.
        slots: usize,
    },
    /// The kernel's output does not have one entry per task.
    #[error("the kernel returned {got} results for {want} tasks")]
    ResultLength {
        /// Entries returned.
        got: usize,
        /// Tasks launched.
        want: usize,
    },
    /// A sum overflowed (no correct result can).
    #[error("a GPU count overflowed its 128-bit total")]
    Overflow,
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// The full counts of a sub-problem whose completions the GPU counted:
/// `count` from the GPU, and the completions fixed by the half and quarter
/// turns, which only ring-kind sub-problems with those symmetries have, from
/// the CPU (they are rare and cheap). Returns `None` when `stop` was set.
pub fn fixed_counts(
    sub: &nq_core::split::SubProblem,
    count: u128,
    stop: &std::sync::atomic::AtomicBool,
) -> Option<nq_core::split::SubCounts> {
    use nq_core::symmetry::Symmetry;
    let stab = sub.stabilizer();
    let fixed = |g: Symmetry| -> Option<u128> {
        if stab.contains(g) {
            nq_core::search::count_fixed(sub.prefix(), g, stop)
        } else {
            Some(0)
        }
    };
    Some(nq_core::split::SubCounts {
        count,
        fixed180: fixed(Symmetry::Rot180)?,
        fixed90: fixed(Symmetry::Rot90)?,
    })
}

#[cfg(test)]
mod tests {
    /// CI has g++, so there the kernel's CPU tests must not be skipped.
    #[test]
    fn the_host_kernel_is_built_in_ci() {
        if std::env::var_os("CI").is_some() {
            let built = cfg!(nq_host_kernel);
            assert!(
                built,
                "build.rs could not compile kernel/host.cpp: the kernel's CPU tests did not run"
            );
        }
    }
}
