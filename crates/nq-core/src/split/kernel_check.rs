//! The startup self-test of a count kernel against the depth-first
//! reference search.

use std::sync::atomic::AtomicBool;

use super::{SplitSpec, split};
use crate::board::Board;
use crate::error::{Error, ErrorKind, Result};
use crate::search::{self, Kernel};

/// The board [`check_kernel`] counts on: large enough to reach every part of
/// a SIMD kernel (full vectors, every level of the walk, masked border lines,
/// symmetric classes), small enough to take a few milliseconds.
const CHECK_BOARD: u8 = 12;

/// Counts every sub-problem of N = 12 (the border split with one extra
/// column: about 400 sub-problems) on `kernel` and on the depth-first
/// reference search ([`crate::search::count_masked_reference`]), completions
/// and nodes, and fails on the first difference.
///
/// A startup check for programs that run a kernel for hours: a CPU with a
/// defective vector unit, a miscompiled build, or a fault in the walk that
/// every kernel (the scalar one included) shares, shows here in a few
/// milliseconds instead of as a wrong total. It compares two computations; it
/// does not consult the published values.
///
/// # Errors
///
/// [`ErrorKind::KernelMismatch`] naming the first sub-problem that differs.
pub fn check_kernel(kernel: Kernel) -> Result<()> {
    let resolved = kernel.resolved();
    let board = Board::new(CHECK_BOARD.into()).expect("a valid board size");
    let spec = SplitSpec::border(1).expect("one extra column is a valid spec");
    let never = AtomicBool::new(false);
    for sub in split(board, spec) {
        let forbidden = sub.forbidden();
        let got = search::count_masked(sub.prefix(), &forbidden, resolved, &never)
            .expect("never stopped");
        let want = search::count_masked_reference(sub.prefix(), &forbidden, &never)
            .expect("never stopped");
        if got != want {
            return Err(Error::new(ErrorKind::KernelMismatch {
                kernel: resolved.name(),
                subproblem: format!("{:?}", sub.prefix()),
                got: got.count,
                want: want.count,
            }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_passes_its_startup_check() {
        for kernel in Kernel::ALL.into_iter().filter(|k| k.is_available()) {
            let t = std::time::Instant::now();
            check_kernel(kernel).unwrap();
            eprintln!("{kernel}: checked in {:?}", t.elapsed());
        }
        let e = Error::new(ErrorKind::KernelMismatch {
            kernel: "avx2",
            subproblem: "[3 - -]".into(),
            got: 5,
            want: 6,
        })
        .to_string();
        assert!(
            e.contains("avx2") && e.contains("[3 - -]") && e.contains("--kernel scalar"),
            "{e}"
        );
    }
}
