//! How an `apply` run shows its steps: spinners on a terminal, plain lines otherwise
//! (docs/architecture.md, "Progress is an event stream").

use std::collections::BTreeMap;
use std::io::IsTerminal as _;

use super::Cli;

/// How an `apply` run shows its steps (see docs/commands.md "Operator comfort"):
/// - stdout a terminal, no `--quiet`, no `-v` (log lines would tear the display): one spinner
///   line per running step (device, step, elapsed) under a bar of steps done/total, drawn by
///   `indicatif`; each finished step also leaves a line in the scrollback.
/// - otherwise one plain line per finished step, stable for logs and scripts:
///   `  [3/8] osd0: add osd-kek v2 into keyslot 2 (unlock with osd-kek v1): added keyslot 2 (1.2s)`
///   or `  [FAILED] ...: after 1.2s: <error>` (the counter counts finished steps only).
/// - `--quiet`: nothing.
pub(super) struct ProgressView {
    mode: ViewMode,
    /// Start instant of each running step, by step index.
    started: BTreeMap<usize, std::time::Instant>,
}

enum ViewMode {
    Quiet,
    Lines,
    Bars {
        multi: indicatif::MultiProgress,
        overall: indicatif::ProgressBar,
        running: BTreeMap<usize, indicatif::ProgressBar>,
    },
}

/// `1.2s`, or `2m03s` from a minute on: the elapsed time of a step, in progress lines.
pub(super) fn elapsed_text(d: std::time::Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        let whole = d.as_secs();
        format!("{}m{:02}s", whole / 60, whole % 60)
    }
}

impl ProgressView {
    /// Picks the display for `cli` (see [`ProgressView`]).
    pub(super) fn new(cli: &Cli) -> ProgressView {
        let mode = if cli.quiet {
            ViewMode::Quiet
        } else if cli.verbose == 0 && std::io::stdout().is_terminal() {
            let multi =
                indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stdout());
            let overall = multi.add(indicatif::ProgressBar::new(0));
            let style = indicatif::ProgressStyle::with_template(
                "  [{bar:30}] {pos}/{len} steps, {elapsed}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            overall.set_style(style);
            ViewMode::Bars {
                multi,
                overall,
                running: BTreeMap::new(),
            }
        } else {
            ViewMode::Lines
        };
        ProgressView {
            mode,
            started: BTreeMap::new(),
        }
    }

    /// Shows one executor event.
    pub(super) fn event(&mut self, ev: crate::apply::StepEvent<'_>) {
        use crate::apply::StepEvent;
        match ev {
            StepEvent::Started {
                step, total, desc, ..
            } => {
                self.started.insert(step, std::time::Instant::now());
                if let ViewMode::Bars {
                    multi,
                    overall,
                    running,
                } = &mut self.mode
                {
                    overall.set_length(total as u64);
                    let spinner =
                        multi.insert_before(overall, indicatif::ProgressBar::new_spinner());
                    if let Ok(style) =
                        indicatif::ProgressStyle::with_template("  {spinner} {msg} ({elapsed})")
                    {
                        spinner.set_style(style);
                    }
                    spinner.set_message(desc.to_string());
                    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
                    running.insert(step, spinner);
                }
            }
            StepEvent::Finished {
                step,
                total,
                done,
                desc,
                result,
                ..
            } => {
                let took = self
                    .started
                    .remove(&step)
                    .map(|t| elapsed_text(t.elapsed()))
                    .unwrap_or_default();
                let line = match result {
                    Ok(o) => format!("  [{done}/{total}] {desc}: {o} ({took})"),
                    Err(e) => format!("  [FAILED] {desc}: after {took}: {e}"),
                };
                // (`outln!` redacts; indicatif's `println` does not.)
                let line = crate::secret::redact::redact(&line).into_owned();
                match &mut self.mode {
                    ViewMode::Quiet => {}
                    ViewMode::Lines => outln!("{line}"),
                    ViewMode::Bars {
                        multi,
                        overall,
                        running,
                    } => {
                        if let Some(sp) = running.remove(&step) {
                            sp.finish_and_clear();
                            multi.remove(&sp);
                        }
                        overall.set_length(total as u64);
                        overall.set_position(done as u64);
                        let _ = multi.println(&line);
                    }
                }
            }
        }
    }

    /// Removes the spinners and the bar (the finished-step lines stay).
    pub(super) fn finish(&mut self) {
        if let ViewMode::Bars {
            multi,
            overall,
            running,
        } = &mut self.mode
        {
            for (_, sp) in std::mem::take(running) {
                sp.finish_and_clear();
            }
            overall.finish_and_clear();
            let _ = multi.clear();
        }
    }
}
