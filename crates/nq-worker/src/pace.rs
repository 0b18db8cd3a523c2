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
//!
//! A GPU is paced the same way, by what it finishes per launch ([`Launches`]):
//! it counts every queued job in one launch, so it holds its measured rate
//! times the time a few launches of a chosen length take, not a fixed number
//! of jobs. A GPU that is twice as fast holds twice as many.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Job ends remembered for the finishing rate: enough to smooth the bursts
/// of a few threads, few enough to follow the run's jobs as they shrink.
const ENDS_KEPT: usize = 16;

/// The refill time is this many lease round trips: the report that frees
/// the thread and the lease that refills it.
const TRIPS_PER_REFILL: u32 = 2;

/// How long a GPU launch should last: long enough that its start, copies and
/// tail are a small share of it, short enough that a GPU holds seconds of
/// work rather than minutes (what a killed worker loses, and what the run's
/// end waits for). Modelled, not measured on a GPU: the worker logs each
/// launch's `wall_ms` beside its `kernel_ms`, which is where to check it.
const LAUNCH_TARGET: Duration = Duration::from_secs(2);

/// Launch ends remembered for a GPU's rate: a few launches of each GPU of a
/// machine, so the rate follows the run's jobs as they shrink.
const LAUNCHES_KEPT: usize = 16;

/// The jobs the GPUs of a worker finished, launch by launch: their measured
/// speed, which sizes what the worker leases for them.
#[derive(Debug, Default)]
pub(crate) struct Launches {
    /// When each remembered launch ended, how many jobs it finished, and
    /// how long it took from its submission; oldest first, at most
    /// [`LAUNCHES_KEPT`].
    ends: VecDeque<(Instant, usize, Duration)>,
}

impl Launches {
    /// Notes that a launch submitted `wall` ago finished `jobs` jobs at
    /// `now`.
    pub(crate) fn ended(&mut self, now: Instant, jobs: usize, wall: Duration) {
        if self.ends.len() == LAUNCHES_KEPT {
            self.ends.pop_front();
        }
        self.ends.push_back((now, jobs, wall));
    }

    /// Jobs per second, every GPU together; `None` before the first launch
    /// ended. The larger of two measures, each of which can only read low:
    ///
    /// * the jobs of the launches that ended after the oldest remembered
    ///   one, over the time since it ended (a launch's jobs end together,
    ///   so the oldest launch's own jobs only mark where the time starts).
    ///   This includes any wait for jobs: a starved GPU reads slower than
    ///   it is;
    /// * the latest launch's jobs over its own time from submission. This
    ///   includes any wait behind the other stream's launch, but no wait
    ///   for jobs: it sizes the second launch from the first, where the
    ///   first measure would need several launches to grow from one job
    ///   per stream.
    pub(crate) fn rate(&self) -> Option<f64> {
        let &(last, latest_jobs, latest_wall) = self.ends.back()?;
        let &(first, _, _) = self.ends.front()?;
        let span = last.saturating_duration_since(first).as_secs_f64();
        let over_span = (span > 0.0).then(|| {
            let jobs: usize = self.ends.iter().skip(1).map(|&(_, jobs, _)| jobs).sum();
            jobs as f64 / span
        });
        let wall = latest_wall.as_secs_f64();
        let over_wall = (wall > 0.0).then(|| latest_jobs as f64 / wall);
        match (over_span, over_wall) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

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

    /// The jobs to hold for GPUs with `streams` launch streams in all that
    /// finish `rate` jobs a second (from [`Launches::rate`]), at most
    /// `max_jobs`: what they finish while each stream counts one launch of
    /// [`LAUNCH_TARGET`] and one more is gathered, plus a refill's round
    /// trips. One job per stream before anything is measured: a launch
    /// expands even one job into enough tasks to fill a GPU.
    pub(crate) fn launch_outstanding(
        &self,
        rate: Option<f64>,
        streams: usize,
        max_jobs: usize,
    ) -> usize {
        let floor = streams.min(max_jobs).max(1);
        let (Some(rate), Some(rtt)) = (rate, self.round_trip) else {
            return floor;
        };
        let launches = u32::try_from(streams).unwrap_or(u32::MAX).saturating_add(1);
        let horizon = (LAUNCH_TARGET * launches + rtt * TRIPS_PER_REFILL).as_secs_f64();
        // Saturating float-to-int cast: an absurd rate gives `max_jobs`.
        ((rate * horizon).round() as usize).clamp(floor, max_jobs.max(floor))
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

    /// Launches of `jobs` jobs ending `apart` apart, each of which took
    /// `wall`.
    fn launches(count: usize, jobs: usize, apart: Duration, wall: Duration) -> Launches {
        let mut launches = Launches::default();
        let start = Instant::now();
        for i in 0..count {
            launches.ended(start + apart * i as u32, jobs, wall);
        }
        launches
    }

    #[test]
    fn a_gpu_holds_one_job_per_stream_before_it_is_measured() {
        let pace = measured(0, ms(1), ms(1));
        assert_eq!(pace.launch_outstanding(None, 2, 256), 2);
        assert_eq!(Launches::default().rate(), None);
        assert_eq!(
            launches(3, 100, Duration::ZERO, Duration::ZERO).rate(),
            None
        );
        // Never more than the limit, never none.
        assert_eq!(pace.launch_outstanding(None, 4, 3), 3);
        assert_eq!(pace.launch_outstanding(None, 0, 3), 1);
        // Measured, but no lease call answered yet.
        assert_eq!(Pace::default().launch_outstanding(Some(100.0), 2, 256), 2);
    }

    #[test]
    fn a_launch_rate_counts_whole_launches() {
        // Three launches of 50 jobs, one a second, each 2 s from
        // submission (two streams): 100 jobs in the two seconds after the
        // first ended, not 150.
        let secs = Duration::from_secs;
        assert_eq!(launches(3, 50, secs(1), secs(2)).rate(), Some(50.0));
        // It follows the latest launches only.
        let mut l = launches(LAUNCHES_KEPT, 10, secs(1), secs(2));
        let later = Instant::now() + secs(60);
        for i in 0..LAUNCHES_KEPT as u32 {
            l.ended(later + ms(100) * i, 10, ms(200));
        }
        assert_eq!(l.rate().map(f64::round), Some(100.0));
    }

    #[test]
    fn the_first_launch_sizes_the_second() {
        // One launch of two jobs in 40 ms: 50 jobs a second.
        let l = launches(1, 2, Duration::ZERO, ms(40));
        assert_eq!(l.rate(), Some(50.0));
        // Launches that waited for jobs between them: their own time says
        // more than the span.
        let starved = launches(3, 2, Duration::from_secs(1), ms(40));
        assert_eq!(starved.rate(), Some(50.0));
    }

    #[test]
    fn a_gpu_holds_in_proportion_to_its_speed() {
        let pace = measured(0, ms(1), ms(5));
        // Two streams: three launches of 2 s and two 5 ms trips, 6.01 s.
        let slow = pace.launch_outstanding(Some(10.0), 2, 10_000);
        let fast = pace.launch_outstanding(Some(20.0), 2, 10_000);
        assert_eq!((slow, fast), (60, 120));
        // Two GPUs (four streams): five launches' worth.
        assert_eq!(pace.launch_outstanding(Some(20.0), 4, 10_000), 200);
        // The limit still holds.
        assert_eq!(pace.launch_outstanding(Some(1e9), 2, 256), 256);
        assert_eq!(pace.launch_outstanding(Some(f64::INFINITY), 2, 256), 256);
        // A GPU slower than a job per launch keeps one job per stream.
        assert_eq!(pace.launch_outstanding(Some(0.01), 2, 256), 2);
    }

    /// Both measures read low: the span counts the GPU's waits for jobs,
    /// a launch's own time its wait behind the other stream. This plays a
    /// GPU with two streams that starts with one job per stream (every
    /// launch counts all it holds at `capacity` jobs a second, reads twice
    /// that time from its submission, then waits a refill) and checks that
    /// what it holds reaches its full-speed share within a few launches
    /// instead of settling low.
    #[test]
    fn a_starved_gpu_grows_to_its_full_share() {
        let capacity = 400.0;
        let rtt = ms(20);
        let mut pace = Pace::default();
        pace.answered(rtt);
        let mut l = Launches::default();
        let mut now = Instant::now();
        let mut held = pace.launch_outstanding(l.rate(), 2, 100_000);
        assert_eq!(held, 2);
        for _ in 0..6 {
            let compute = Duration::from_secs_f64(held as f64 / capacity);
            now += compute + rtt * TRIPS_PER_REFILL;
            l.ended(now, held, compute * 2);
            held = pace.launch_outstanding(l.rate(), 2, 100_000);
        }
        // Full speed: 400 jobs/s × (3 × 2 s + 2 × 20 ms) = 2,416.
        let full = 2416.0;
        assert!(
            (held as f64 - full).abs() < 0.05 * full,
            "held {held}, full speed wants about {full}"
        );
    }

    #[test]
    fn a_slow_call_moves_the_round_trip_an_eighth_of_the_way() {
        let mut pace = measured(2, ms(1), ms(8));
        pace.answered(ms(16));
        assert_eq!(pace.round_trip, Some(ms(9)));
    }
}
