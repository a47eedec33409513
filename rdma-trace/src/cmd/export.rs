//! `rdma-trace export`: attach the probe table and the waterfall, and serve what they count to
//! Prometheus for as long as it runs (`views::prometheus` renders and serves). It spawns
//! nothing: it traces whatever runs.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, atomic::AtomicU64},
    time::Duration,
};

use anyhow::{Context as _, Result};
use hyper::body::Bytes;
use tokio::net::TcpListener;

use crate::{
    bpf::{loader::ObjectConfig, session::Session},
    kernel::{facts::Kernel, plan::Options, probes::PROBES},
    model::{losses::Losses, window::Waiter},
    views::prometheus::{
        AbortOnDrop, CqSeries, Limits, ProbeLabels, render, render_losses, render_waterfall,
        serve_http,
    },
};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Exit codes: 0 stopped by Ctrl-C or SIGTERM; 1 failure (e.g. the address \
                        is in use); 2 bad usage; 3 no probe can be attached (not root, no eBPF).\n\n\
                        Examples:\n  sudo rdma-trace export --listen 0.0.0.0:9464\n  \
                        sudo rdma-trace export --listen 127.0.0.1:9464 --interval 5\n  \
                        curl -s http://127.0.0.1:9464/metrics | grep NET_RX"
)]
pub struct Args {
    /// Address to serve on (`0.0.0.0:9464`, `[::]:9464`, `127.0.0.1:0` for any free port).
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Seconds between two reads of the eBPF maps.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = crate::cmd::parse_seconds)]
    pub interval: Duration,
    /// Value of the `host` label [default: the kernel's hostname].
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Keep probes of driver paths without a device here.
    #[arg(long)]
    pub all_drivers: bool,
}

pub async fn run(args: &Args) -> Result<()> {
    let kernel = Kernel::live();
    let mut config = ObjectConfig::default();
    let prepared = crate::waterfall::prepare_or_explain(
        false,
        crate::waterfall::Settings::default(),
        &mut config,
    );
    let mut session = Session::start_with(
        &kernel,
        PROBES,
        Options {
            all_drivers: args.all_drivers,
            // uprobes trap on every call of every process: not for an always-on exporter.
            ..Options::default()
        },
        &config,
    )?;
    let wf = crate::waterfall::start_or_explain(prepared, &mut session);
    let session = session;
    let host = args.host.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "unknown".to_owned())
    });
    let labels = ProbeLabels::new(&kernel.rdma_devices(), &host);
    let release = kernel.release();
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr().context("the listening address")?;
    eprintln!(
        "rdma-trace: probes:\n{}rdma-trace: serving http://{addr}/metrics (refresh every {:?})",
        session.attach_table(),
        args.interval
    );

    let page = Arc::new(Mutex::new(Bytes::new()));
    // Which CQs have a series of their own: kept across refreshes (see `CqSeries`).
    let series = Mutex::new(CqSeries::default());
    let refresh = |page: &Mutex<Bytes>| -> Result<()> {
        let mut text = render(&session, &session.snapshot()?, &labels);
        let snap = wf.as_ref().map(|w| w.snapshot()).transpose()?;
        if let Some(s) = &snap {
            let mut series = series.lock().unwrap_or_else(|p| p.into_inner());
            render_waterfall(&mut text, s, &labels.host, &mut series);
        }
        let mut stats = session.program_stats().0;
        stats.extend(wf.iter().flat_map(|w| w.program_stats(session.bpf())));
        let merged = snap.as_ref().and_then(|s| s.merged_data());
        let losses = Losses::new(
            merged.as_ref().map(|t| &t.counts),
            stats
                .iter()
                .map(|p| (p.name.as_str(), p.recursion_misses, p.kprobe_misses)),
            release.as_deref(),
        );
        render_losses(&mut text, &losses, &labels.host);
        *page.lock().unwrap_or_else(|p| p.into_inner()) = Bytes::from(text);
        Ok(())
    };
    refresh(&page)?;
    // No duration, no command: only a stop signal ends the export.
    let mut waiter =
        Waiter::new(None, None).every(args.interval, tokio::time::MissedTickBehavior::Delay);
    let server = tokio::spawn(serve_http(
        listener,
        Arc::clone(&page),
        Limits::DEFAULT,
        Arc::new(AtomicU64::new(0)),
    ));
    // Aborts the server (and so closes the listener) however this function ends.
    let _server = AbortOnDrop(server);
    while waiter.next_tick().await?.is_none() {
        refresh(&page)?;
    }
    eprintln!("rdma-trace: stopped; probes detached");
    Ok(())
}
