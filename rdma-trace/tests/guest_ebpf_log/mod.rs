//! Guest test of the eBPF programs' rare-event messages (aya-log): a provoked nested start or
//! unmatched end reaches the loader's stderr with `-v`, and nothing does without it.

use super::harness::rdma_trace;

/// Two `sleep`s pinned to CPU 0 at once: the second enters hrtimer_nanosleep while CPU 0's
/// slot still holds the first one's start, and one of their returns then finds the slot empty.
/// Both are rare events the eBPF side reports. (A single sleep migrated to CPU 1 was flaky:
/// any other process sleeping on CPU 1 at that moment, such as the guest runner's own, filled
/// the slot its return found empty.)
const OVERLAPPING_SLEEPS: &str = "taskset 1 sleep 1 & taskset 1 sleep 1 & wait";

/// The messages the eBPF side sends for those rare events.
const RARE: [&str; 2] = [
    "[ebpf WARN] hrtimer_nanosleep: entered while this CPU's slot still held another call's start",
    "[ebpf WARN] hrtimer_nanosleep: a return without its entry on this CPU",
];

fn funclat(verbose: bool) -> (String, String) {
    let v: &[&str] = if verbose { &["-v"] } else { &[] };
    let funclat = [
        "funclat",
        "hrtimer_nanosleep",
        "--",
        "sh",
        "-c",
        OVERLAPPING_SLEEPS,
    ];
    let out = rdma_trace(&[v, &funclat].concat());
    out.assert_success("rdma-trace funclat");
    (out.stdout, out.stderr)
}

#[test]
fn ebpf_log_shows_a_provoked_rare_event_with_v_and_nothing_without() {
    let (stdout, stderr) = funclat(true);
    assert!(
        RARE.iter().any(|m| stderr.contains(m)),
        "no eBPF message for the overlapping sleeps:\n{stderr}\n{stdout}"
    );
    let (_, quiet) = funclat(false);
    assert!(
        !quiet.contains("[ebpf"),
        "eBPF messages without -v:\n{quiet}"
    );
}
