//! Guest test of the eBPF programs' rare-event messages (aya-log): a provoked unmatched end
//! reaches the loader's stderr with `-v`, and nothing does without it.

use super::harness::rdma_trace;

/// A `sleep` pinned to CPU 0 enters hrtimer_nanosleep there; moved to CPU 1 while it sleeps,
/// it returns on CPU 1, whose entry slot holds nothing: an end without its start.
const MIGRATING_SLEEP: &str =
    "taskset 1 sleep 1 & p=$!; sleep 0.3; taskset -p 2 $p >/dev/null; wait $p";

fn funclat(verbose: bool) -> (String, String) {
    let v: &[&str] = if verbose { &["-v"] } else { &[] };
    let funclat = [
        "funclat",
        "hrtimer_nanosleep",
        "--",
        "sh",
        "-c",
        MIGRATING_SLEEP,
    ];
    let out = rdma_trace(&[v, &funclat].concat());
    out.assert_success("rdma-trace funclat");
    (out.stdout, out.stderr)
}

#[test]
fn ebpf_log_shows_a_provoked_unmatched_return_with_v_and_nothing_without() {
    let (stdout, stderr) = funclat(true);
    assert!(
        stderr.contains("[ebpf WARN] hrtimer_nanosleep: a return without its entry on this CPU"),
        "no eBPF message for the migrated sleep:\n{stderr}\n{stdout}"
    );
    let (_, quiet) = funclat(false);
    assert!(
        !quiet.contains("[ebpf"),
        "eBPF messages without -v:\n{quiet}"
    );
}
