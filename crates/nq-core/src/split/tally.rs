//! The fold of sub-problem counts into Q(N) and U(N).

use super::{SubCounts, SubProblem};
use crate::error::{Error, ErrorKind, Result};
use crate::symmetry::Symmetry;

/// The running totals of a split: folds sub-problem counts into Q(N) and U(N).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// `Σ w·count`: the number of solutions so far.
    pub total: u128,
    /// `Σ w·Σ_{g∈Stab} Fix_g`: eight times the number of classes so far.
    pub burnside: u128,
}

impl Tally {
    /// Adds one sub-problem's counts. The caller should [`SubProblem::check`]
    /// them first.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Overflow`] if a sum would exceed 128 bits.
    pub fn add(&mut self, sub: &SubProblem, c: &SubCounts) -> Result<()> {
        let overflow = || Error::new(ErrorKind::Overflow);
        let w = u128::from(sub.weight());
        let total = c.count.checked_mul(w).ok_or_else(overflow)?;
        let burnside = sub.orbit_sum(c)?.checked_mul(w).ok_or_else(overflow)?;
        self.total = self.total.checked_add(total).ok_or_else(overflow)?;
        self.burnside = self.burnside.checked_add(burnside).ok_or_else(overflow)?;
        Ok(())
    }

    /// Adds another tally.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Overflow`] if a sum would exceed 128 bits.
    pub fn merge(&mut self, other: &Tally) -> Result<()> {
        let overflow = || Error::new(ErrorKind::Overflow);
        self.total = self.total.checked_add(other.total).ok_or_else(overflow)?;
        self.burnside = self
            .burnside
            .checked_add(other.burnside)
            .ok_or_else(overflow)?;
        Ok(())
    }

    /// The number of solutions up to symmetry: `burnside / 8`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::CountsInvalid`] when `burnside` is not a multiple of 8,
    /// which no complete and correct set of counts can produce.
    pub fn unique(&self) -> Result<u128> {
        if !self.burnside.is_multiple_of(8) {
            return Err(Error::new(ErrorKind::CountsInvalid {
                reason: "the symmetry fold is not a multiple of 8: a count is wrong",
            }));
        }
        Ok(self.burnside / 8)
    }
}

impl SubProblem {
    /// `Σ_{g ∈ Stab} Fix_g` for this sub-problem (see the module docs).
    pub(super) fn orbit_sum(&self, c: &SubCounts) -> Result<u128> {
        let n = self.prefix.board().n();
        let stab = self.stabilizer();
        let mut sum = 0u128;
        for g in Symmetry::ALL.into_iter().filter(|&g| stab.contains(g)) {
            let fixed = match g {
                Symmetry::Identity => c.count,
                Symmetry::Rot180 => c.fixed180,
                Symmetry::Rot90 | Symmetry::Rot270 => c.fixed90,
                // No reflection fixes a solution of N > 1 (module docs).
                _ if n == 1 => c.count,
                _ => 0,
            };
            sum = sum
                .checked_add(fixed)
                .ok_or(Error::new(ErrorKind::Overflow))?;
        }
        Ok(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_requires_whole_classes() {
        let t = Tally {
            total: 8,
            burnside: 12,
        };
        assert!(t.unique().is_err());
    }
}
