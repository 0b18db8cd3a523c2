//! Export: from a stored completion to the solutions, or the class
//! representative, that it stands for.

use super::lines::{bottom_col, ring_depth_of, ring_part, tied_set};
use super::{Kind, SplitSpec, Strategy, SubProblem};
use crate::board::{Board, EMPTY, Prefix};
use crate::error::{Error, ErrorKind, Result};
use crate::symmetry::{Stabilizer, Symmetry};

/// Rebuilds the sub-problem that a stored completion belongs to.
fn owner(spec: SplitSpec, rows: &[u8]) -> Result<(Prefix, SubProblem)> {
    let n = u64::try_from(rows.len()).expect("a slice length fits in u64");
    let s = Prefix::from_rows(Board::new(n)?, rows)?;
    if !s.is_complete() {
        return Err(Error::new(ErrorKind::NotCanonical));
    }
    // The owner's prefix is the completion cut down to the base placement
    // plus the first `extra` free columns of that base.
    let nn = s.board().n();
    let base = match spec.strategy(nn) {
        Strategy::Ring(depth) => ring_part(&s, depth),
        Strategy::Border => {
            let k = s.get(0).expect("complete");
            let mut tied = tied_set(&s, k);
            if k == nn - 1 - k && tied.len() == 1 {
                tied.place(bottom_col(&s), 0)
                    .map_err(|_| Error::new(ErrorKind::NotCanonical))?;
                tied
            } else if Stabilizer::of(&tied).order() == 1 {
                tied
            } else {
                ring_part(&s, 1)
            }
        }
    };
    let mut prefix = base;
    for c in (0..nn)
        .filter(|&c| base.get(c).is_none())
        .take(usize::from(spec.extra))
    {
        prefix
            .place(c, s.get(c).expect("complete"))
            .expect("subset of a solution");
    }
    let sub = SubProblem::from_prefix(spec, prefix)?;
    if !sub.is_completion(rows) {
        return Err(Error::new(ErrorKind::NotCanonical));
    }
    Ok((s, sub))
}

/// Every solution that a stored completion stands for.
///
/// `rows` is a completion of a sub-problem of `spec`. The result holds one
/// image of it per solution it stands for, `weight` solutions in all,
/// identity first. Over all completions of all sub-problems this lists every
/// solution of the board exactly once, so an export can stream them without
/// remembering what it wrote.
///
/// # Errors
///
/// [`ErrorKind::PrefixInvalid`] when `rows` is not a valid placement, and
/// [`ErrorKind::NotCanonical`] when it is not a completion of the split.
pub fn images_of_completion(spec: SplitSpec, rows: &[u8]) -> Result<Vec<Vec<u8>>> {
    let (s, sub) = owner(spec, rows)?;
    // One symmetry per coset of the stabilizer: those that give distinct
    // images of the base placement give distinct solutions, and together all
    // the members of the class that this completion stands for.
    let base = match sub.kind {
        Kind::Ring { .. } => ring_part(&s, ring_depth_of(sub.prefix())),
        Kind::Border { .. } => s,
    };
    let mut seen: Vec<Prefix> = Vec::with_capacity(8);
    let mut out = Vec::with_capacity(8);
    for g in Symmetry::ALL {
        let image = g.apply_prefix(&base);
        if !seen.contains(&image) {
            seen.push(image);
            out.push(g.apply_prefix(&s).rows().to_vec());
        }
    }
    Ok(out)
}

/// The class representative to list for a stored completion, if this
/// completion is the one that represents its class.
///
/// Each class meets the completions of its sub-problems in one orbit of the
/// sub-problem's stabilizer; the least member of that orbit answers
/// `Some(canonical form of the class)` and the others `None`. Over all stored
/// completions this yields every class exactly once.
///
/// # Errors
///
/// As [`images_of_completion`].
pub fn unique_of_completion(spec: SplitSpec, rows: &[u8]) -> Result<Option<Vec<u8>>> {
    let (s, sub) = owner(spec, rows)?;
    let stab = sub.stabilizer();
    let least = Symmetry::ALL
        .iter()
        .filter(|&&g| stab.contains(g))
        .all(|&g| s <= g.apply_prefix(&s));
    Ok(least.then(|| crate::symmetry::canonical_rows(rows)))
}

/// True when `rows` (a complete solution) is the canonical member of its
/// class: the least of its images. Used by `nq solutions --unique`.
pub fn is_canonical_solution(rows: &[u8]) -> bool {
    debug_assert!(rows.iter().all(|&r| r != EMPTY));
    crate::symmetry::canonical_rows(rows) == rows
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{all_solutions, completions};
    use super::super::split;
    use super::*;

    #[test]
    fn stored_completions_expand_to_every_solution_once() {
        for n in 1..=9u8 {
            let board = Board::new(n.into()).unwrap();
            for ring in [0, 1] {
                let spec = SplitSpec::new(ring, 1).unwrap();
                let mut all = vec![];
                let mut unique = vec![];
                completions(&split(board, spec), &mut |_, rows| {
                    all.extend(images_of_completion(spec, rows).unwrap());
                    unique.extend(unique_of_completion(spec, rows).unwrap());
                });
                let direct = all_solutions(board);
                all.sort();
                assert_eq!(all, direct, "n={n} ring={ring}");
                let mut want: Vec<_> = direct
                    .iter()
                    .filter(|r| is_canonical_solution(r))
                    .cloned()
                    .collect();
                unique.sort();
                want.sort();
                assert_eq!(unique, want, "unique n={n} ring={ring}");
            }
        }
    }
}
