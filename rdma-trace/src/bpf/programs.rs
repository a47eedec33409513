//! The eBPF object and the loader must agree on the programs: every program a loader path can
//! attach exists in the object, and every program of the object belongs to a loader path. The
//! numbered families (`kslot!` pairs, `cq_probe!`) are kept in step with their constants
//! (`MAX_KSLOTS`, `CQ_FUNCTIONS`) by hand in the eBPF crate: this test is what catches a line
//! added or removed on one side only.

/// Every program of the embedded object with the family of its ELF section (`kprobe`,
/// `tracepoint`, `raw_tp`, ...), for the tests that check names against mechanisms.
#[cfg(test)]
pub(crate) fn object_program_sections() -> std::collections::BTreeMap<String, String> {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _, SymbolKind};
    let file =
        object::File::parse(crate::bpf::loader::OBJECT).expect("the embedded eBPF object parses");
    file.symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_global())
        .filter_map(|s| {
            let section = file.section_by_index(s.section_index()?).ok()?;
            let family = section.name().ok()?.split('/').next()?.to_owned();
            tests::PROGRAM_SECTIONS
                .contains(&family.as_str())
                .then(|| (s.name().expect("symbol name").to_owned(), family))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rdma_trace_common::{MAX_KSLOTS, cq::CQ_FUNCTIONS};

    /// Section prefixes of BPF programs (aya's naming).
    pub(super) const PROGRAM_SECTIONS: &[&str] = &[
        "kprobe",
        "kretprobe",
        "fentry",
        "fexit",
        "raw_tp",
        "raw_tracepoint",
        "tracepoint",
        "tp_btf",
        "uprobe",
        "uretprobe",
    ];

    /// Programs with a fixed name, and the loader path that attaches each.
    const FIXED: &[(&str, &str)] = &[
        ("softirq_entry", "bpf.rs: softirq probes"),
        ("softirq_exit", "bpf.rs: softirq probes"),
        ("irq_handler_entry", "bpf.rs: IRQ probes"),
        ("irq_handler_exit", "bpf.rs: IRQ probes"),
        ("napi_poll", "bpf.rs: NAPI probe"),
        ("ibcq_schedule", "bpf.rs: ib_cq wake-up probe"),
        ("ibcq_reschedule", "bpf.rs: ib_cq wake-up probe"),
        ("ibcq_process", "bpf.rs: ib_cq wake-up probe"),
        ("ibcq_poll", "bpf.rs: ib_cq wake-up probe"),
        ("ibcq_free", "bpf.rs: ib_cq wake-up probe"),
        ("nvme_setup_cmd", "bpf.rs: nvme io probe"),
        ("nvme_post_send", "bpf.rs: nvme io probe"),
        ("nvme_callback", "bpf.rs: nvme io probe"),
        ("nvmet_req_init", "bpf.rs: nvmet io probe"),
        ("nvmet_req_complete", "bpf.rs: nvmet io probe"),
        ("nvme_complete_rq", "bpf.rs: nvme io probe"),
        ("cm_send_req", "bpf.rs: rdma_cm connect probe"),
        ("cm_event_handler", "bpf.rs: rdma_cm connect probe"),
        ("cm_event_done", "bpf.rs: rdma_cm connect probe"),
        ("cm_id_destroy", "bpf.rs: rdma_cm connect probe"),
        ("uentry", "bpf.rs: user-space probes"),
        ("ureturn", "bpf.rs: user-space probes"),
        ("verify_sys_enter", "cmd/verify.rs"),
        ("verify_sys_exit", "cmd/verify.rs"),
        ("cal_kprobe", "calibrate.rs"),
        ("cal_kretprobe", "calibrate.rs"),
        ("cal_raw_tp", "calibrate.rs"),
        ("cal_tracepoint", "calibrate.rs"),
        ("cal_fentry", "calibrate.rs"),
        ("proc_exec", "workload.rs"),
        ("proc_exit", "workload.rs"),
        ("task_newtask", "workload.rs"),
        ("wf_handler_entry", "waterfall"),
        ("wf_handler_return", "waterfall"),
        ("wf_mlx5_cq_comp", "waterfall"),
        ("wf_mlx5_irq", "waterfall"),
        ("wf_queue_init", "waterfall"),
        ("wf_read_entry", "waterfall"),
        ("wf_read_return", "waterfall"),
        ("wf_rxe_arm", "waterfall"),
        ("wf_rxe_cq_post", "waterfall"),
        ("wf_sched_switch", "waterfall"),
        ("wf_sched_waking", "waterfall"),
        ("wf_thread_exit", "waterfall"),
    ];

    /// Names of the program symbols in the embedded object.
    fn object_programs() -> BTreeSet<String> {
        super::object_program_sections().into_keys().collect()
    }

    /// What the loader can attach: the numbered families from their constants, plus the
    /// fixed names.
    fn loader_programs() -> BTreeSet<String> {
        let mut want = BTreeSet::new();
        for n in 0..MAX_KSLOTS {
            for family in ["kentry", "kreturn", "fentry", "fexit"] {
                want.insert(format!("{family}_{n}"));
            }
        }
        for i in 0..CQ_FUNCTIONS.len() {
            want.insert(format!("cq_{i}"));
        }
        want.extend(FIXED.iter().map(|(p, _)| (*p).to_owned()));
        want
    }

    /// Fails, saying `what` and naming them, if `a` has programs that `b` lacks.
    fn assert_no_program_only_in(a: &BTreeSet<String>, b: &BTreeSet<String>, what: &str) {
        let only_in_a: Vec<_> = a.difference(b).collect();
        assert!(only_in_a.is_empty(), "{what}: {only_in_a:?}");
    }

    #[test]
    fn the_object_has_every_program_the_loader_can_attach() {
        assert_no_program_only_in(
            &loader_programs(),
            &object_programs(),
            "programs the loader attaches but the eBPF object lacks (a kslot!/cq_probe! line \
             removed, or a constant raised without one)",
        );
    }

    #[test]
    fn no_program_of_the_object_is_left_over() {
        assert_no_program_only_in(
            &object_programs(),
            &loader_programs(),
            "programs in the eBPF object that no loader path attaches (add them to the table, \
             a constant or FIXED here, or remove them)",
        );
    }

    #[test]
    fn the_object_is_read_for_real() {
        // Guards the two tests above against passing on an empty list.
        let have = object_programs();
        assert!(have.contains("kentry_0") && have.contains("wf_sched_switch"));
        assert!(have.len() >= 4 * MAX_KSLOTS as usize + CQ_FUNCTIONS.len());
    }
}
