//! The border lines and rings of a placement: corner distances, tied sets,
//! ring parts, and the masks of the border split's strict lines.

use super::{LINE_BOTTOM, LINE_RIGHT, LINE_TOP};
use crate::board::{MAX_N, Prefix};
use crate::symmetry::Symmetry;

/// Corner distance of position `p` on a line of `n` squares.
pub(super) fn corner(n: u8, p: u8) -> u8 {
    p.min(n - 1 - p)
}

/// The corner distance of a queen on the border, `None` inside the board.
/// A corner queen lies on two border lines, at distance 0 on both.
pub(super) fn border_m(n: u8, (c, r): (u8, u8)) -> Option<u8> {
    let on_col = c == 0 || c == n - 1;
    let on_row = r == 0 || r == n - 1;
    match (on_col, on_row) {
        (true, true) => Some(0),
        (true, false) => Some(corner(n, r)),
        (false, true) => Some(corner(n, c)),
        (false, false) => None,
    }
}

/// The queens of `p` on the border with corner distance exactly `k`.
pub(super) fn tied_set(p: &Prefix, k: u8) -> Prefix {
    let n = p.board().n();
    let mut out = Prefix::empty(p.board());
    for q in p.queens().filter(|&q| border_m(n, q) == Some(k)) {
        out.place(q.0, q.1)
            .expect("a subset of a valid placement is valid");
    }
    out
}

/// The queens of `p` on ring lines of depth `depth` (depth 1: the border).
pub(super) fn ring_part(p: &Prefix, depth: u8) -> Prefix {
    let n = p.board().n();
    let on = |i: u8| i < depth || i + depth >= n;
    let mut out = Prefix::empty(p.board());
    for (c, r) in p.queens().filter(|&(c, r)| on(c) || on(r)) {
        out.place(c, r)
            .expect("a subset of a valid placement is valid");
    }
    out
}

/// True when `p` has a queen on every ring line of depth `depth`.
pub(super) fn ring_complete(p: &Prefix, depth: u8) -> bool {
    let n = p.board().n();
    let used = p.used_rows();
    (0..n)
        .filter(|&i| i < depth || i + depth >= n)
        .all(|i| p.get(i).is_some() && used & (1 << i) != 0)
}

/// The column of the queen on row 0. The caller MUST know there is one.
pub(super) fn bottom_col(p: &Prefix) -> u8 {
    p.queens()
        .find(|&(_, r)| r == 0)
        .expect("a queen on row 0")
        .0
}

/// True when `x` is the least of its T-images (images whose column-0 queen
/// is at row `k`; see the module docs). `x` itself must be one.
pub(super) fn least_t_image(x: &Prefix, k: u8) -> bool {
    Symmetry::ALL.iter().all(|g| {
        let img = g.apply_prefix(x);
        img.get(0) != Some(k) || *x <= img
    })
}

/// Rows forbidden by the `strict` border lines for a border sub-problem at
/// distance `k`, per column; with `top_before`, row N−1 is also forbidden in
/// the columns left of that one (case 1b).
pub(super) fn strict_masks(
    n: u8,
    k: u8,
    strict: u8,
    top_before: Option<u8>,
) -> [u32; MAX_N as usize] {
    let mut f = [0u32; MAX_N as usize];
    for c in 0..top_before.unwrap_or(0) {
        f[usize::from(c)] |= 1 << (n - 1);
    }
    for p in (0..n).filter(|&p| corner(n, p) >= k) {
        if strict & LINE_RIGHT != 0 {
            f[usize::from(n - 1)] |= 1 << p;
        }
        if strict & LINE_BOTTOM != 0 {
            f[usize::from(p)] |= 1;
        }
        if strict & LINE_TOP != 0 {
            f[usize::from(p)] |= 1 << (n - 1);
        }
    }
    f
}

/// The ring depth of a ring sub-problem's prefix: the largest depth whose
/// ring it fills (the border split's case 3 and `ring = 1` use depth 1).
pub(super) fn ring_depth_of(p: &Prefix) -> u8 {
    (1..=3u8)
        .rev()
        .find(|&d| ring_complete(&ring_part(p, d), d))
        .unwrap_or(1)
}
