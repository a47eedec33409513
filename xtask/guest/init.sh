#!/bin/busybox sh
# PID 1 of the `cargo xtask vm` guest (built into the base initramfs by xtask/src/vm/image.rs).
# Per-run settings come from /vm/env.sh and the command from /vm/cmd.sh (the per-run cpio).
# Console markers read by xtask: @@RDMA_VM_BOOTED@@ and @@RDMA_VM_EXIT=<status>@@.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/busybox HOME=/root
warn() { echo "vm-init: $*"; }

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tracefs tracefs /sys/kernel/tracing || warn "no tracefs"
mount -t debugfs debugfs /sys/kernel/debug || warn "no debugfs"
mount -t bpf bpf /sys/fs/bpf || warn "no bpffs"

# Under multi-threaded TCG a vCPU can run code that the other vCPU is patching. Flipping the static
# branch of a hot tracepoint (when its first program attaches or its last one detaches) has oopsed
# the guest with "int3" in __schedule and try_to_wake_up. So the hot tracepoints rdma-trace uses stay
# enabled for the whole boot (ftrace events with recording off): attaching and detaching programs
# then never patch the scheduler's, the softirq path's or the syscall entry's code. The syscall
# tracepoints are among them: the start-up calibration's raw tracepoint on sys_enter flips their
# key, and a bench guest died of a soft lockup at that key's site in syscall_trace_enter.
t=/sys/kernel/tracing
if [ -d $t/events ]; then
    echo 0 >$t/tracing_on
    echo 4 >$t/buffer_size_kb
    for e in sched/sched_switch sched/sched_waking sched/sched_wakeup sched/sched_process_exit \
        sched/sched_process_fork task/task_newtask irq/softirq_entry irq/softirq_exit \
        irq/irq_handler_entry irq/irq_handler_exit napi/napi_poll raw_syscalls/sys_enter \
        raw_syscalls/sys_exit; do
        echo 1 >$t/events/$e/enable 2>/dev/null || warn "cannot keep $e enabled"
    done
fi
# BPF run-time statistics stay on for the same reason: rdma-trace turns them on at start
# (BPF_ENABLE_STATS) and off at exit, which flips the static key inlined wherever a BPF program
# runs (trace_call_bpf, the tracepoint calls in try_to_wake_up); the 6.12 guest has oopsed with
# "int3" at both. With the sysctl on, the key is already set and nothing is patched.
echo 1 >/proc/sys/kernel/bpf_stats_enabled 2>/dev/null || warn "cannot keep BPF statistics on"
echo "@@RDMA_VM_BOOTED@@"

. /vm/env.sh

# Modules, in the dependency order computed on the host.
while read -r m; do
    insmod "/lib/modules/$m.ko" 2>/tmp/insmod.err ||
        { warn "insmod $m failed: $(cat /tmp/insmod.err)"; }
done </lib/modules/load.list

# Two Soft-RoCE devices on the two ends of a veth pair. Policy routing sends traffic between the
# two local addresses out of the other end of the veth (not through lo), so RoCE between rxe0 and
# rxe1 crosses the IP stack (NET_RX softirq). Busybox sh prefers its own applets to PATH: call
# iproute2 by absolute path.
try() { "$@" || warn "failed: $*"; }
IP=/usr/bin/ip
try $IP link set lo up
try $IP link add va type veth peer name vb
try $IP addr add 10.9.0.1/24 dev va
try $IP addr add 10.9.0.2/24 dev vb
try $IP link set va up
try $IP link set vb up
for d in all default va vb; do
    echo 1 >/proc/sys/net/ipv4/conf/$d/accept_local
    echo 0 >/proc/sys/net/ipv4/conf/$d/rp_filter
done
try $IP route add 10.9.0.2 dev va src 10.9.0.1 table 100
try $IP route add 10.9.0.1 dev vb src 10.9.0.2 table 100
try $IP rule add pref 10 iif lo lookup 100
try $IP rule add pref 100 lookup local
try $IP rule del pref 0
try /usr/bin/rdma link add rxe0 type rxe netdev va
try /usr/bin/rdma link add rxe1 type rxe netdev vb

# Wait until both ports are ACTIVE and have the RoCE v2 GID of their IPv4 address
# (::ffff:10.9.0.x; the GID table fills asynchronously); export its index as RXE_GID_INDEX.
gid_index() {
    p=/sys/class/infiniband/$1/ports/1
    for g in $p/gids/*; do
        i=${g##*/}
        case $(cat "$g" 2>/dev/null) in
        0000:0000:0000:0000:0000:ffff:*)
            [ "$(cat "$p/gid_attrs/types/$i" 2>/dev/null)" = "RoCE v2" ] && { echo "$i"; return 0; } ;;
        esac
    done
    return 1
}
active() { case $(cat /sys/class/infiniband/$1/ports/1/state 2>/dev/null) in *ACTIVE*) return 0 ;; esac; return 1; }
n=0
until active rxe0 && active rxe1 && RXE_GID_INDEX=$(gid_index rxe0) && gid_index rxe1 >/dev/null; do
    n=$((n + 1))
    [ $n -gt 100 ] && { warn "rxe0/rxe1 not active with a RoCE v2 IPv4 GID"; RXE_GID_INDEX=; break; }
    sleep 0.05
done
export RXE_GID_INDEX

# The workspace (read-only) and the results folder, at the host's paths.
opts=trans=virtio,version=9p2000.L,msize=512000
# The read-only mounts cache pages (cache=loose): nothing changes them while the guest runs, and an
# uncached exec of a debug binary pages it in over 9p at every start (about 1 s under TCG).
ro_opts=$opts,ro,cache=loose
mkdir -p "$VM_WORKSPACE"
mount -t 9p -o "$ro_opts" workspace "$VM_WORKSPACE" || warn "mounting the workspace failed"
if [ -n "$VM_TARGET" ]; then
    mkdir -p "$VM_TARGET" 2>/dev/null
    mount -t 9p -o "$ro_opts" target "$VM_TARGET" || warn "mounting the target dir failed"
fi
mkdir -p "$RESULTS_DIR" 2>/dev/null
mount -t 9p -o "$opts" results "$RESULTS_DIR" || warn "mounting the results dir failed"

cd "$VM_WORKSPACE" || cd /
ulimit -l unlimited
if [ "$VM_INTERACTIVE" = 1 ]; then
    # The host's terminal is on ttyS0: give the command a session with it as controlling
    # terminal (keys, Ctrl-C, the live view) and the host window's size.
    if [ -n "$LINES" ] && [ -n "$COLUMNS" ]; then
        busybox stty -F /dev/ttyS0 rows "$LINES" cols "$COLUMNS" 2>/dev/null
    fi
    busybox setsid -c /bin/bash /vm/cmd.sh </dev/ttyS0 >/dev/ttyS0 2>&1
else
    /bin/bash /vm/cmd.sh </dev/null
fi
rc=$?
echo "@@RDMA_VM_EXIT=$rc@@"
cd /
umount "$RESULTS_DIR" 2>/dev/null
sync
poweroff -f
