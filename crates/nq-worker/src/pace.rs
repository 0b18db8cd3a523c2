//! How many jobs the worker keeps outstanding: one per thread, plus a queue
//! just deep enough to cover the time a thread would otherwise wait for its
//! next job.
//!
//! A queued job waits behind a running one. When jobs are short (the tail of
//! any run, a load test) a thread that finishes must not wait a report and a
//! lease round trip for its next job, so the queue pays. When jobs are long it
//! only hurts: the coordinator hands out the heaviest jobs first, and at
//! N = 18 the first dozen jobs hold most of the run's work. A worker that
//! queued two of them behind two others computed them one after another while
//! the other machine ran dry, and the run took 1.4–1.7× the coordinator alone
//! on the same cores (issue 26). So the queue follows Little's law: jobs
//! finished per second times the seconds a refill takes, measured, with no
//! queue before the first measurement.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Job ends remembered for the finishing rate: enough to smooth the bursts
/// of a few threads, few enough to follow the run's jobs as they shrink.
const ENDS_KEPT: usize = 16;

/// The refill time is this many lease round trips: the report that frees
/// the thread and the lease that refills it.
const TRIPS_PER_REFILL: u32 = 2;

/// The worker's measured finishing rate and lease round trip.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    /// When the last jobs ended, oldest first, at most [`ENDS_KEPT`].
    ends: VecDeque<Instant>,
    /// Smoothed lease round trip; `None` before the first answer.
    round_trip: Option<Duration>,
}

impl Pace {
    /// Notes that a job's report was acknowledged at `now`.
    pub(crate) fn job_ended(&mut self, now: Instant) {
        if self.ends.len() == ENDS_KEPT {
            self.ends.pop_front();
        }
        self.ends.push_back(now);
    }

    /// Notes a lease call answered after `took`.
    pub(crate) fn answered(&mut self, took: Duration) {
        // An exponential average over about eight calls: one slow call does
        // not empty or flood the queue.
        self.round_trip = Some(match self.round_trip {
            None => took,
            Some(rtt) => (rtt * 7 + took) / 8,
        });
    }

    /// The jobs to hold (running and queued) on `threads` threads, at most
    /// `max_jobs`: every thread busy, plus the jobs the threads finish while
    /// a refill is on its way, rounded to the nearest.
    pub(crate) fn outstanding(&self, threads: usize, max_jobs: usize) -> usize {
        let queue = match (self.ends.front(), self.ends.back(), self.round_trip) {
            (Some(&first), Some(&last), Some(rtt)) if self.ends.len() >= 2 => {
                let span = last.saturating_duration_since(first).as_secs_f64();
                let refill = (rtt * TRIPS_PER_REFILL).as_secs_f64();
                if span > 0.0 {
                    ((self.ends.len() - 1) as f64 * refill / span).round() as usize
                } else {
                    // Every remembered job ended in the same instant: as
                    // short as jobs get.
                    max_jobs
                }
            }
            _ => 0,
        };
        threads.saturating_add(queue).min(max_jobs.max(threads))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A pace that saw `jobs` ends `apart` apart and lease calls of `rtt`.
    fn measured(jobs: usize, apart: Duration, rtt: Duration) -> Pace {
        let mut pace = Pace::default();
        let start = Instant::now();
        for i in 0..jobs {
            pace.job_ended(start + apart * i as u32);
        }
        pace.answered(rtt);
        pace
    }

    #[test]
    fn no_queue_before_anything_is_measured() {
        assert_eq!(Pace::default().outstanding(4, 8), 4);
        assert_eq!(measured(1, ms(1), ms(1)).outstanding(4, 8), 4);
        let mut unanswered = Pace::default();
        unanswered.job_ended(Instant::now());
        unanswered.job_ended(Instant::now() + ms(1));
        assert_eq!(unanswered.outstanding(4, 8), 4);
    }

    #[test]
    fn long_jobs_are_not_queued_behind_each_other() {
        // Jobs ending every 100 ms, a 1 ms round trip: a refill brings a
        // job long before the next thread frees.
        assert_eq!(measured(10, ms(100), ms(1)).outstanding(2, 4), 2);
    }

    #[test]
    fn short_jobs_fill_the_queue_up_to_the_limit() {
        // A job ends every 0.5 ms and a refill takes 2 ms: four jobs end
        // meanwhile, but the limit is two per thread.
        assert_eq!(
            measured(16, Duration::from_micros(500), ms(1)).outstanding(2, 4),
            4
        );
        // Every job ended at once.
        assert_eq!(measured(5, Duration::ZERO, ms(1)).outstanding(2, 4), 4);
    }

    #[test]
    fn the_queue_covers_the_jobs_that_end_during_a_refill() {
        // A job ends every 10 ms; a refill takes 2 × 10 ms: two end meanwhile.
        assert_eq!(measured(16, ms(10), ms(10)).outstanding(2, 8), 4);
    }

    #[test]
    fn the_rate_follows_the_latest_jobs() {
        let mut pace = measured(16, ms(1), ms(1));
        assert_eq!(pace.outstanding(2, 4), 4);
        // The jobs grew: once the remembered ends are all slow, no queue.
        let later = Instant::now() + Duration::from_secs(1);
        for i in 0..ENDS_KEPT as u32 {
            pace.job_ended(later + ms(200) * i);
        }
        assert_eq!(pace.outstanding(2, 4), 2);
    }

    #[test]
    fn a_slow_call_moves_the_round_trip_an_eighth_of_the_way() {
        let mut pace = measured(2, ms(1), ms(8));
        pace.answered(ms(16));
        assert_eq!(pace.round_trip, Some(ms(9)));
    }
}
