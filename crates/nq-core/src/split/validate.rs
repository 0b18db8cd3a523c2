//! Validation: rebuilding a sub-problem from its prefix, recognising its
//! completions, and bounding reported counts.

use super::lines::{
    border_m, least_t_image, ring_complete, ring_depth_of, ring_part, tied_set,
};
use super::{
    Kind, LINE_BOTTOM, LINE_RIGHT, LINE_TOP, SplitSpec, Strategy, SubCounts, SubProblem,
};
use crate::board::Prefix;
use crate::error::{Error, ErrorKind, Result};
use crate::symmetry::{Stabilizer, Symmetry, canonical};

impl SubProblem {
    /// Rebuilds a sub-problem from its prefix (as received from a coordinator
    /// or read from a store) and checks that it belongs to the split `spec`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotCanonical`] when the prefix is not one of the split's
    /// sub-problems.
    pub fn from_prefix(spec: SplitSpec, prefix: Prefix) -> Result<SubProblem> {
        let not = || Error::new(ErrorKind::NotCanonical);
        let n = prefix.board().n();
        let (base, kind) = match spec.strategy(n) {
            Strategy::Ring(depth) => {
                let ring = ring_part(&prefix, depth);
                if !ring_complete(&ring, depth) || canonical(&ring).0 != ring {
                    return Err(not());
                }
                (
                    ring,
                    Kind::Ring {
                        stabilizer: Stabilizer::of(&ring),
                    },
                )
            }
            Strategy::Border => border_base(&prefix, n)?,
        };
        // The other queens must fill exactly the first free columns of the base.
        let expected: Vec<u8> = (0..n)
            .filter(|&c| base.get(c).is_none())
            .take(usize::from(spec.extra))
            .collect();
        let actual: Vec<u8> = (0..n)
            .filter(|&c| base.get(c).is_none() && prefix.get(c).is_some())
            .collect();
        if actual != expected {
            return Err(not());
        }
        let sub = SubProblem { prefix, kind };
        let forbidden = sub.forbidden();
        if prefix
            .queens()
            .any(|(c, r)| forbidden[usize::from(c)] & (1 << r) != 0)
        {
            return Err(not());
        }
        Ok(sub)
    }

    /// True when `rows` (a complete placement) is a completion of this
    /// sub-problem: a solution that contains the prefix and avoids its
    /// forbidden squares. Lets a coordinator check every reported solution.
    pub fn is_completion(&self, rows: &[u8]) -> bool {
        let Ok(s) = Prefix::from_rows(self.prefix.board(), rows) else {
            return false;
        };
        let forbidden = self.forbidden();
        s.is_complete()
            && self.prefix.queens().all(|(c, r)| s.get(c) == Some(r))
            && s.queens()
                .all(|(c, r)| forbidden[usize::from(c)] & (1 << r) == 0)
            && match self.kind {
                // The inner search cannot reach ring lines, but a stored
                // solution could: check that its ring part is the prefix's.
                Kind::Ring { .. } => {
                    let depth = ring_depth_of(&self.prefix);
                    ring_part(&s, depth) == ring_part(&self.prefix, depth)
                }
                Kind::Border { .. } => true,
            }
    }

    /// Checks reported counts against invariants that every true result
    /// satisfies, so that a corrupted or forged result is rejected before it
    /// counts.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::CountsInvalid`] naming the broken invariant.
    pub fn check(&self, spec: SplitSpec, c: &SubCounts) -> Result<()> {
        let bad = |reason| Err(Error::new(ErrorKind::CountsInvalid { reason }));
        let stab = self.stabilizer();
        if !stab.contains(Symmetry::Rot180) && c.fixed180 != 0 {
            return bad("fixed180 is not 0 although the half turn fixes no completion");
        }
        if !stab.contains(Symmetry::Rot90) && c.fixed90 != 0 {
            return bad("fixed90 is not 0 although the quarter turn fixes no completion");
        }
        if c.fixed180 > c.count || c.fixed90 > c.fixed180 {
            return bad(
                "symmetric completions exceed completions (need fixed90 ≤ fixed180 ≤ count)",
            );
        }
        if self.prefix.is_complete() && c.count != 1 {
            return bad("a complete placement has exactly one completion");
        }
        // Cheap bounds that catch a made-up count of any size: a completion
        // puts one queen on an allowed square of each empty column, in
        // distinct rows, and is a solution of the whole board.
        if c.count > self.max_completions() {
            return bad("more completions than the empty columns' free squares allow");
        }
        if let Some((total, _)) = crate::published::published(self.prefix.board().n())
            && c.count > total
        {
            return bad("more completions than the board has solutions (OEIS A000170)");
        }
        // With no extra columns the stabilizer acts on this sub-problem's own
        // completions, so its orbits give exact divisibility conditions.
        if matches!(self.kind, Kind::Ring { .. })
            && (spec.extra == 0 || self.prefix.is_complete())
        {
            if stab.contains(Symmetry::Rot180)
                && !(c.count - c.fixed180).is_multiple_of(2)
            {
                return bad("completions not fixed by the half turn must come in pairs");
            }
            if stab.contains(Symmetry::Rot90)
                && !(c.fixed180 - c.fixed90).is_multiple_of(2)
            {
                return bad("completions fixed by the half turn only must come in pairs");
            }
            if !self.orbit_sum(c)?.is_multiple_of(u128::from(stab.order())) {
                return bad("completions do not split into whole symmetry classes");
            }
        }
        Ok(())
    }

    /// An upper bound on the completions of the sub-problem, from the prefix
    /// alone: the product over the empty columns of the squares the prefix
    /// leaves free in them, and at most k! for k empty columns (the queens take
    /// distinct rows). Saturates at `u128::MAX`.
    pub fn max_completions(&self) -> u128 {
        let n = self.prefix.board().n();
        let (mut product, mut factorial, mut k) = (1u128, 1u128, 0u128);
        for col in (0..n).filter(|&c| self.prefix.get(c).is_none()) {
            let free = (0..n).filter(|&r| self.prefix.allows(col, r)).count();
            product = product.saturating_mul(free as u128);
            k += 1;
            factorial = factorial.saturating_mul(k);
        }
        product.min(factorial)
    }
}

/// The base and kind of a sub-problem of the border split (see
/// [`SubProblem::from_prefix`]): the tied set of its border queens, or the
/// ring of its first line when that set is symmetric.
fn border_base(prefix: &Prefix, n: u8) -> Result<(Prefix, Kind)> {
    let not = || Error::new(ErrorKind::NotCanonical);
    let k = prefix.get(0).ok_or_else(not)?;
    if k == 0 || k > n - 1 - k {
        return Err(not());
    }
    if prefix
        .queens()
        .any(|q| border_m(n, q).is_some_and(|m| m > k))
    {
        return Err(not());
    }
    let tied = tied_set(prefix, k);
    Ok(if k == n - 1 - k && tied.len() == 1 {
        // Case 1b: the base is the column-0 queen and the row-0 queen.
        let (c, _) = prefix.queens().find(|&(_, r)| r == 0).ok_or_else(not)?;
        if c == n - 1 {
            return Err(not());
        }
        let mut base = tied;
        base.place(c, 0).map_err(|_| not())?;
        let kind = Kind::Border {
            k,
            strict: LINE_RIGHT | LINE_TOP,
            top_after_bottom: true,
        };
        (base, kind)
    } else if Stabilizer::of(&tied).order() == 1 {
        if !least_t_image(&tied, k) {
            return Err(not());
        }
        let used = tied.used_rows();
        let mut strict = 0;
        if tied.get(n - 1).is_none() {
            strict |= LINE_RIGHT;
        }
        if used & 1 == 0 {
            strict |= LINE_BOTTOM;
        }
        if used & (1 << (n - 1)) == 0 {
            strict |= LINE_TOP;
        }
        (
            tied,
            Kind::Border {
                k,
                strict,
                top_after_bottom: false,
            },
        )
    } else {
        let ring = ring_part(prefix, 1);
        if !ring_complete(&ring, 1) || !least_t_image(&ring, k) {
            return Err(not());
        }
        (
            ring,
            Kind::Ring {
                stabilizer: Stabilizer::of(&ring),
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::super::fixtures::never;
    use super::super::split;
    use super::*;
    use crate::board::Board;

    #[test]
    fn counts_beyond_the_bounds_are_refused() {
        let never = AtomicBool::new(false);
        for n in [8u64, 10, 12] {
            let board = Board::new(n).unwrap();
            let (total, _) = crate::published::published(board.n()).unwrap();
            for spec in [
                SplitSpec::border(1).unwrap(),
                SplitSpec::ring_split(1, 0).unwrap(),
            ] {
                for sub in split(board, spec) {
                    let (c, _) = sub.solve(&never).unwrap();
                    assert!(c.count <= sub.max_completions(), "{:?}", sub.prefix());
                    sub.check(spec, &c).unwrap();
                    let too_many = SubCounts {
                        count: sub.max_completions().min(total) + 1,
                        ..c
                    };
                    assert!(sub.check(spec, &too_many).is_err(), "{:?}", sub.prefix());
                }
            }
        }
    }

    #[test]
    fn split_is_deterministic_and_checks_prefixes() {
        let board = Board::new(10).unwrap();
        for ring in [0, 1] {
            let spec = SplitSpec::new(ring, 1).unwrap();
            let a = split(board, spec);
            assert_eq!(a, split(board, spec));
            // A non-canonical image of a weight-8 base is refused.
            let sub = a.iter().find(|s| s.weight() == 8).unwrap();
            for g in &Symmetry::ALL[1..] {
                let img = g.apply_prefix(&sub.prefix);
                assert!(
                    SubProblem::from_prefix(spec, img).is_err()
                        || a.iter().any(|s| s.prefix == img),
                    "{g:?} image of {sub:?} accepted"
                );
            }
        }
        let empty = Prefix::empty(board);
        assert!(SubProblem::from_prefix(SplitSpec::BORDER, empty).is_err());
    }

    #[test]
    fn check_rejects_impossible_counts() {
        let board = Board::new(10).unwrap();
        for ring in [0, 1] {
            let spec = SplitSpec::new(ring, 0).unwrap();
            let subs = split(board, spec);
            let plain = subs.iter().find(|s| s.weight() == 8).unwrap();
            let ok = plain.solve(&never()).unwrap().0;
            assert!(plain.check(spec, &ok).is_ok());
            let forged = SubCounts { fixed180: 1, ..ok };
            assert!(plain.check(spec, &forged).is_err());
            if let Some(sym) = subs.iter().find(|s| s.weight() < 8) {
                let ok = sym.solve(&never()).unwrap().0;
                assert!(sym.check(spec, &ok).is_ok());
                let odd = SubCounts {
                    count: ok.count + 1,
                    ..ok
                };
                assert!(sym.check(spec, &odd).is_err());
            }
        }
    }
}
