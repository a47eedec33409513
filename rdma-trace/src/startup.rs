//! Where start-up time goes: the steps from the process's start to "all attached", each with its
//! wall time. `rdma-trace run -v` prints them on one line once everything is attached, so a slow
//! start (a large kernel BTF, many programs to verify, a slow calibration) can be told apart.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

struct Clock {
    start: Instant,
    last: Instant,
    steps: Vec<(&'static str, Duration)>,
}

static CLOCK: Mutex<Option<Clock>> = Mutex::new(None);

/// Starts the clock (at the top of `main`).
pub fn begin() {
    let now = Instant::now();
    if let Ok(mut c) = CLOCK.lock() {
        *c = Some(Clock {
            start: now,
            last: now,
            steps: Vec::new(),
        });
    }
}

/// Ends step `name`: the time since the previous step ended (or the clock began).
pub fn step(name: &'static str) {
    let now = Instant::now();
    if let Ok(mut guard) = CLOCK.lock()
        && let Some(c) = guard.as_mut()
    {
        c.steps.push((name, now - c.last));
        c.last = now;
    }
}

/// The steps so far on one line ("start-up 2.41 s: load 1.02 s, attach 0.80 s, …"), largest
/// first; None before [`begin`].
pub fn summary() -> Option<String> {
    let guard = CLOCK.lock().ok()?;
    let c = guard.as_ref()?;
    Some(render(c.last - c.start, &c.steps))
}

/// With `-v`: the steps on stderr (call once everything is attached).
pub fn print_if_verbose() {
    if crate::verbosity::level() > 0
        && let Some(line) = summary()
    {
        eprintln!("rdma-trace: {line}");
    }
}

fn render(total: Duration, steps: &[(&'static str, Duration)]) -> String {
    // One entry per name (a step can run more than once), in order of first appearance.
    let mut merged: Vec<(&str, Duration)> = Vec::new();
    for &(name, d) in steps {
        match merged.iter_mut().find(|(n, _)| *n == name) {
            Some((_, sum)) => *sum += d,
            None => merged.push((name, d)),
        }
    }
    merged.sort_by_key(|m| std::cmp::Reverse(m.1));
    let parts: Vec<String> = merged
        .iter()
        .map(|(n, d)| format!("{n} {:.2} s", d.as_secs_f64()))
        .collect();
    format!(
        "start-up {:.2} s: {}",
        total.as_secs_f64(),
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_merged_by_name_and_sorted_largest_first() {
        let ms = Duration::from_millis;
        let line = render(
            ms(2500),
            &[
                ("kernel facts", ms(300)),
                ("load", ms(900)),
                ("attach", ms(400)),
                ("load", ms(200)),
            ],
        );
        assert_eq!(
            line,
            "start-up 2.50 s: load 1.10 s, attach 0.40 s, kernel facts 0.30 s"
        );
    }
}
