//! Progress of the long steps (loading, building, uploading, saving) on
//! stderr, never on stdout, which carries the report.
//!
//! On a terminal each step draws an indicatif bar or spinner that is cleared
//! when the step ends. When stderr is a file or a pipe nothing is drawn (no
//! control characters in a log); a step that counts rows (the HNSW build)
//! logs an info line at each tenth of the way before the end instead, so a
//! log of a long build still shows it moving. `--no-progress` turns both off.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a spinner redraws itself while its step runs.
const TICK: Duration = Duration::from_millis(120);

/// Where progress goes for this run.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Whether progress is reported at all (`--no-progress` clears it).
    enabled: bool,
    /// Whether stderr is a terminal (bars) or not (log lines).
    terminal: bool,
}

impl Progress {
    /// Progress for this process's stderr, or none with `--no-progress`.
    pub fn new(no_progress: bool) -> Self {
        Progress {
            enabled: !no_progress,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    /// Whether anything is reported.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// A spinner showing `message` until the step is finished.
    pub fn spinner(&self, message: impl Into<String>) -> Step {
        if !(self.enabled && self.terminal) {
            return Step::hidden();
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(message.into());
        bar.enable_steady_tick(TICK);
        Step { bar, log: None }
    }

    /// A bar of `len` `unit` (e.g. "rows") for `message`.
    pub fn bar(&self, len: u64, unit: &str, message: impl Into<String>) -> Step {
        let message = message.into();
        if !self.enabled {
            return Step::hidden();
        }
        if !self.terminal {
            return Step {
                bar: ProgressBar::hidden(),
                log: Some(Arc::new(Log {
                    message,
                    unit: unit.to_owned(),
                    len,
                    tenths: AtomicU64::new(0),
                })),
            };
        }
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        let template = format!(
            "{{msg}} {{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {unit} (eta {{eta}})"
        );
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(message);
        Step { bar, log: None }
    }
}

/// One step's bar, spinner or log lines; cloned into callbacks that report
/// from other threads.
#[derive(Debug, Clone)]
pub struct Step {
    bar: ProgressBar,
    log: Option<Arc<Log>>,
}

/// The log lines of a step when stderr is not a terminal.
#[derive(Debug)]
struct Log {
    message: String,
    unit: String,
    len: u64,
    /// Tenths of the way already logged.
    tenths: AtomicU64,
}

impl Step {
    /// A step that shows nothing.
    pub fn hidden() -> Self {
        Step {
            bar: ProgressBar::hidden(),
            log: None,
        }
    }

    /// The step has come `pos` of its way.
    pub fn set(&self, pos: u64) {
        self.bar.set_position(pos);
        if self.bar.length().is_some_and(|len| pos >= len) {
            // Cleared at once, before the step logs that it is done.
            self.bar.finish_and_clear();
        }
        if let Some(log) = &self.log {
            let tenths = pos.saturating_mul(10) / log.len.max(1);
            // The end is not logged: the step's own "done" line follows.
            if tenths > log.tenths.fetch_max(tenths, Ordering::Relaxed) && tenths < 10 {
                tracing::info!(
                    "{}: {pos} of {} {} ({}%)",
                    log.message,
                    log.len,
                    log.unit,
                    tenths.min(10) * 10
                );
            }
        }
    }

    /// Ends the step and clears its line.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_come_once_per_tenth() {
        let p = Progress {
            enabled: true,
            terminal: false,
        };
        let step = p.bar(100, "rows", "test");
        let log = step.log.clone();
        for pos in [5, 10, 15, 19, 20, 100, 100] {
            step.set(pos);
        }
        let tenths = log.map(|l| l.tenths.load(Ordering::Relaxed));
        assert_eq!(tenths, Some(10));
        step.finish();
    }

    #[test]
    fn no_progress_shows_nothing() {
        let p = Progress {
            enabled: false,
            terminal: true,
        };
        assert!(p.bar(10, "rows", "test").log.is_none());
        assert!(p.bar(10, "rows", "test").bar.is_hidden());
        assert!(p.spinner("test").bar.is_hidden());
    }
}
