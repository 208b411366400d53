//! Summary statistics of a set of timed trials, and the timing loop itself.

use std::time::Instant;

/// Median, extremes and 90th percentile of trial times, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Median (mean of the two middle values for an even count).
    pub median_ms: f64,
    /// Fastest trial.
    pub min_ms: f64,
    /// Slowest trial.
    pub max_ms: f64,
    /// 90th percentile, nearest-rank.
    pub p90_ms: f64,
}

impl Summary {
    /// Summarises trial times in milliseconds; `None` for an empty slice or
    /// when a time is not a finite number.
    pub fn of(times_ms: &[f64]) -> Option<Summary> {
        if times_ms.is_empty() || times_ms.iter().any(|t| !t.is_finite()) {
            return None;
        }
        let mut v = times_ms.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median_ms = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        // Nearest rank: the smallest value with at least 90% of trials at or below it.
        let rank = (0.9 * n as f64).ceil() as usize;
        let p90_ms = v[rank.clamp(1, n) - 1];
        Some(Summary {
            median_ms,
            min_ms: v[0],
            max_ms: v[n - 1],
            p90_ms,
        })
    }
}

/// Runs `f` `warmup` times untimed, then `trials` times under the host clock,
/// and returns each trial's wall time in milliseconds.
///
/// `f` gets the trial number (warm-up runs count from 0 as well) so a caller
/// can rotate through queries; the first error stops the loop.
pub fn time_trials<E>(
    warmup: usize,
    trials: usize,
    mut f: impl FnMut(usize) -> Result<(), E>,
) -> Result<Vec<f64>, E> {
    time_trials_prepared(warmup, trials, &mut (), |_, _| Ok(()), |_, i| f(i))
}

/// As [`time_trials`], with untimed `prep(state, i)` before each call
/// `f(state, i)` (warm-up calls included); both get `state` mutably.
pub fn time_trials_prepared<S: ?Sized, E>(
    warmup: usize,
    trials: usize,
    state: &mut S,
    mut prep: impl FnMut(&mut S, usize) -> Result<(), E>,
    mut f: impl FnMut(&mut S, usize) -> Result<(), E>,
) -> Result<Vec<f64>, E> {
    for i in 0..warmup {
        prep(state, i)?;
        f(state, i)?;
    }
    let mut times = Vec::with_capacity(trials);
    for i in 0..trials {
        prep(state, i)?;
        let start = Instant::now();
        f(state, i)?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preparation_runs_before_every_call_and_outside_the_clock() {
        let mut log: Vec<(char, usize)> = Vec::new();
        let times = time_trials_prepared(
            2,
            3,
            &mut log,
            |log, i| {
                log.push(('p', i));
                std::thread::sleep(std::time::Duration::from_millis(30));
                Ok::<(), ()>(())
            },
            |log, i| {
                log.push(('f', i));
                Ok(())
            },
        )
        .unwrap();
        let want: Vec<(char, usize)> = [0, 1, 0, 1, 2]
            .iter()
            .flat_map(|&i| [('p', i), ('f', i)])
            .collect();
        assert_eq!(log, want);
        assert_eq!(times.len(), 3);
        // The 30 ms of preparation is not in any trial's time.
        assert!(times.iter().all(|&t| t < 25.0), "{times:?}");
    }

    #[test]
    fn odd_and_even_medians() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median_ms, s.min_ms, s.max_ms), (2.0, 1.0, 3.0));
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.median_ms, 2.5);
    }

    #[test]
    fn p90_is_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(Summary::of(&v).unwrap().p90_ms, 18.0);
        assert_eq!(Summary::of(&[5.0]).unwrap().p90_ms, 5.0);
    }

    #[test]
    fn empty_or_nan_has_no_summary() {
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn trials_are_counted_and_errors_stop() {
        let mut calls = 0;
        let t = time_trials::<()>(2, 5, |_| {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!((t.len(), calls), (5, 7));
        let r = time_trials(0, 5, |i| if i == 2 { Err(i) } else { Ok(()) });
        assert_eq!(r, Err(2));
    }
}
