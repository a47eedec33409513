//! `rdma-demo`: RDMA verbs demos. See `rdma-demo --help`.

#![forbid(unsafe_code)]

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory as _, Parser, Subcommand};
use rdma_demo::completion::CompletionFaults;
use rdma_demo::completion::Mode;
use rdma_demo::devices::{self, DevicesError};
use rdma_demo::endpoint::{EndpointOptions, Fault};
use rdma_demo::error::{DemoError, EXIT_CODES_HELP, exit};
use rdma_demo::exchange::{self, SizedParams};
use rdma_demo::flags::{Renamed, When};
use rdma_demo::role::{Client, Server};
use rdma_demo::{atomic, limits, pingpong, write_pingpong, write_read};

#[derive(Debug, Parser)]
#[command(
    name = "rdma-demo",
    version,
    about = "RDMA verbs demos (Rust ports of the classic C examples)"
)]
#[command(after_help = with_exit_codes(EXAMPLES), propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List RDMA devices, their ports and GID tables
    #[command(after_help = with_exit_codes(DEVICES_EXAMPLES))]
    Devices(DevicesArgs),
    /// SEND/RECV ping-pong between a server (--server) and a client, like ibv_rc_pingpong
    #[command(after_help = with_exit_codes(PINGPONG_EXAMPLES))]
    Pingpong(SizedArgs),
    /// One-sided RDMA WRITE/READ: the client reads, writes and reads back the server's buffer
    #[command(after_help = with_exit_codes(WRITE_READ_EXAMPLES))]
    #[command(mut_arg("iterations", |a| a.help("WRITE + READ-back rounds")))]
    #[command(mut_arg("size", |a| a.help("Buffer size in bytes")))]
    WriteRead(SizedArgs),
    /// RDMA WRITE ping-pong polling memory on both sides, like ib_write_lat
    #[command(after_help = with_exit_codes(WRITE_PINGPONG_EXAMPLES))]
    WritePingpong(WritePingPongArgs),
    /// Remote atomics: a Fetch-and-Add counter and a Compare-and-Swap lock, N clients at once
    #[command(after_help = with_exit_codes(ATOMIC_EXAMPLES))]
    Atomic(AtomicArgs),
    /// Print a shell completion script to stdout
    #[command(after_help = "Examples:\n  \
                            rdma-demo completions bash > /etc/bash_completion.d/rdma-demo\n  \
                            rdma-demo completions zsh > \"${fpath[1]}/_rdma-demo\"\n  \
                            rdma-demo completions fish > ~/.config/fish/completions/rdma-demo.fish")]
    Completions {
        /// The shell to complete for
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write a man page per subcommand into DIR (what `cargo xtask man` runs)
    #[command(hide = true)]
    Man {
        /// Directory for the pages (created when missing)
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

const EXAMPLES: &str = "Examples:
  rdma-demo devices
  rdma-demo pingpong --loopback -d rxe1 --server-device rxe0 -n 1000 -s 64
  rdma-demo pingpong --server -d rxe0      # server; then on the client host:
  rdma-demo pingpong -d rxe1 10.9.0.1

The flags follow perftest: -s size, -n iterations, -x GID index, -e events, -d device,
-i IB port, -p TCP port, -m MTU.";
const DEVICES_EXAMPLES: &str = "Examples:
  rdma-demo devices
  rdma-demo devices -d rxe0 --json";
const PINGPONG_EXAMPLES: &str = "Examples:
  rdma-demo pingpong --loopback -d rxe1 --server-device rxe0 -n 1000 -s 64
  rdma-demo pingpong --server -d rxe0 -e
  rdma-demo pingpong -d rxe1 -e --json pingpong.json 10.9.0.1";
const WRITE_READ_EXAMPLES: &str = "Examples:
  rdma-demo write-read --loopback -d rxe1 --server-device rxe0 -s 65536
  rdma-demo write-read --server -d rxe0
  rdma-demo write-read -d rxe1 -n 100 10.9.0.1";
const WRITE_PINGPONG_EXAMPLES: &str = "Examples:
  rdma-demo write-pingpong --loopback -d rxe1 --server-device rxe0 -s 64
  rdma-demo write-pingpong --server -d rxe0
  rdma-demo write-pingpong -d rxe1 -n 1000 -s 4096 10.9.0.1";
const ATOMIC_EXAMPLES: &str = "Examples:
  rdma-demo atomic --loopback -d rxe1 --server-device rxe0 --clients 4
  rdma-demo atomic --server -d rxe0 --clients 2
  rdma-demo atomic -d rxe1 --clients 2 -n 500 10.9.0.1
  rdma-demo atomic -d rxe1 --repeat faa -n 500 10.9.0.1   (as ib_atomic_lat -A FETCH_AND_ADD)";

/// The demos with a message or buffer size.
const SIZED: &[&str] = &["pingpong", "write-read", "write-pingpong"];
/// Every demo.
const DEMOS: &[&str] = &["pingpong", "write-read", "write-pingpong", "atomic"];

/// Old spellings, refused for one release with the new one (exit 2), before clap parses the
/// line: the flags now follow perftest (`-s` size, `-n` iterations, `-x` GID index, `-i` IB
/// port). `-s` and `-i` have their new meaning already where the value fits it.
const RENAMED: &[Renamed] = &[
    Renamed {
        subcommands: SIZED,
        old: "-s",
        new: "--size",
        when: When::NotANumber,
        message: "-s is now --size (as in perftest); run the server with --server",
    },
    Renamed {
        subcommands: &["atomic"],
        old: "-s",
        new: "--server",
        when: When::Always,
        message: "-s is now --size (as in perftest), which atomic does not have; run the server \
                  with --server",
    },
    Renamed {
        subcommands: SIZED,
        old: "-S",
        new: "--size",
        when: When::Always,
        message: "-S is now -s (--size), as in perftest",
    },
    Renamed {
        subcommands: DEMOS,
        old: "-g",
        new: "--gid-index",
        when: When::Always,
        message: "-g is now -x (--gid-index), as in perftest",
    },
    Renamed {
        subcommands: DEMOS,
        old: "-i",
        new: "--iterations",
        when: When::NotIn(1, u8::MAX as u64),
        message: "-i is now -n (--iterations), as in perftest; -i is the IB port (--ib-port)",
    },
];

/// `examples`, a blank line, and the exit codes.
fn with_exit_codes(examples: &str) -> String {
    format!("{examples}\n\n{EXIT_CODES_HELP}")
}

#[derive(Debug, Args)]
struct DevicesArgs {
    /// Show only this device (e.g. rxe0, mlx5_0)
    #[arg(short = 'd', long = "device", value_name = "NAME")]
    device: Option<String>,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
}

/// Flags every demo shares.
#[derive(Debug, Args)]
struct CommonArgs {
    /// Run as the server (waits for a client)
    #[arg(long, conflicts_with_all = ["host", "loopback"])]
    server: bool,
    /// Address of the server (client mode)
    #[arg(value_name = "SERVER", required_unless_present_any = ["server", "loopback"])]
    host: Option<String>,
    /// Server and client in this process (server on a thread, TCP over 127.0.0.1)
    #[arg(long)]
    loopback: bool,
    /// RDMA device [default: the first one]
    #[arg(short = 'd', long, value_name = "NAME")]
    device: Option<String>,
    /// Device of the server with --loopback [default: --device]
    #[arg(long, value_name = "NAME")]
    server_device: Option<String>,
    /// Port of the RDMA device (perftest's -i)
    #[arg(short = 'i', long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..))]
    ib_port: u8,
    /// GID index (perftest's -x) [default: the first IPv4-mapped RoCE v2 GID; none on InfiniBand]
    #[arg(short = 'x', long, value_name = "INDEX")]
    gid_index: Option<u32>,
    /// Path MTU in bytes (256..4096) [default: the port's active MTU]; both sides must agree
    #[arg(short = 'm', long, value_name = "BYTES", value_parser = ["256", "512", "1024", "2048", "4096"])]
    mtu: Option<String>,
    /// TCP port of the connection exchange (0 with --loopback: any free port)
    #[arg(short = 'p', long, value_name = "PORT", default_value_t = 18515)]
    port: u16,
    /// Address the server listens on
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0")]
    bind: String,
    /// How to wait for completions
    #[arg(long, value_enum, default_value_t = Mode::Poll)]
    mode: Mode,
    /// Same as --mode event (sleep on a completion channel)
    #[arg(short = 'e', long)]
    event: bool,
    /// Seconds to wait for TCP connect/accept, each whole exchange message, and each completion
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = parse_timeout)]
    timeout: f64,
    /// Also write the results and the run's parameters as JSON to PATH
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Per side, stamp (CLOCK_MONOTONIC) the first N completion-event reads, right after
    /// ibv_get_cq_event returns, and the first N posts, right before ibv_post_send, with the
    /// thread's id: `stamps` in the --json reports
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=i64::from(limits::MAX_STAMPS)))]
    stamps: u32,
    /// Inject a fault on the client side (for tests)
    #[arg(long, value_enum, value_name = "FAULT", hide = true)]
    inject_fault: Option<Fault>,
    /// Event mode, for tests (the client's side, or the server's with --server): stop calling
    /// ibv_req_notify_cq after N completion events
    #[arg(long, value_name = "N", hide = true)]
    fault_no_rearm_after: Option<u64>,
    /// Event mode, for tests (the side as above): read completion events but never poll the
    /// CQ once one was read
    #[arg(long, hide = true)]
    fault_no_poll: bool,
    /// Event mode, for tests (the side as above): the first N waits poll for their completion
    /// with the CQ armed, leaving each event queued unread; then all are read in one burst
    /// (`cq_events_burst` in the --json report)
    #[arg(long, value_name = "N", default_value_t = 0, hide = true)]
    fault_unread_events: u64,
}

fn parse_timeout(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("not a number: {s:?}"))?;
    if v.is_finite() && v > 0.0 && v <= 3600.0 {
        Ok(v)
    } else {
        Err("want 0 < SECS <= 3600".to_string())
    }
}

/// The flags of a demo of one client and one server that agree on `iterations` and `size`
/// (`pingpong`, `write-read`); the help lines are pingpong's, which write-read rewords.
#[derive(Debug, Args)]
struct SizedArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Round trips
    #[arg(short = 'n', long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=i64::from(limits::MAX_ITERATIONS)))]
    iterations: u32,
    /// Message size in bytes
    #[arg(short = 's', long, value_name = "BYTES", default_value_t = limits::DEFAULT_SIZE, value_parser = clap::value_parser!(u32).range(i64::from(limits::MIN_SIZE)..=i64::from(limits::MAX_SIZE)))]
    size: u32,
}

#[derive(Debug, Args)]
struct WritePingPongArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Round trips
    #[arg(short = 'n', long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=i64::from(limits::MAX_ITERATIONS)))]
    iterations: u32,
    /// Message size in bytes, a multiple of 8 (the last 8 bytes carry the message number)
    #[arg(short = 's', long, value_name = "BYTES", default_value_t = limits::DEFAULT_SIZE, value_parser = parse_size_of_words)]
    size: u32,
}

/// A message size for write-pingpong: within the demos' bounds and a multiple of 8.
fn parse_size_of_words(s: &str) -> Result<u32, String> {
    let v: u32 = s.parse().map_err(|_| format!("not a number: {s:?}"))?;
    if !(limits::MIN_SIZE..=limits::MAX_SIZE).contains(&v) || !v.is_multiple_of(8) {
        return Err(format!(
            "want a multiple of 8 from {} to {}",
            limits::MIN_SIZE,
            limits::MAX_SIZE
        ));
    }
    Ok(v)
}

#[derive(Debug, Args)]
struct AtomicArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Rounds per client (FADD, lock, check, unlock); with --repeat, atomics per client
    #[arg(short = 'n', long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(limits::MAX_ITERATIONS)))]
    iterations: u32,
    /// Clients at once: the server waits for this many, the client side starts this many
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=atomic::MAX_CLIENTS as i64))]
    clients: u32,
    /// Repeat one atomic on one word instead of the lock rounds, each timed post → completion
    /// (what ib_atomic_lat -A FETCH_AND_ADD / CMP_AND_SWAP measures): -n adds, or -n successful
    /// CASes (a CAS another client beat is retried, and timed too)
    #[arg(long, value_enum, value_name = "OP")]
    repeat: Option<atomic::Repeat>,
}

/// What ends the program early: the one line for stderr and the exit code.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl From<DevicesError> for Failure {
    fn from(e: DevicesError) -> Self {
        DemoError::from(e).into()
    }
}

impl From<DemoError> for Failure {
    fn from(e: DemoError) -> Self {
        Failure {
            code: e.exit_code(),
            message: e.to_string(),
        }
    }
}

fn main() -> ExitCode {
    if let Some(code) = rdma_demo::flags::refuse_renamed("rdma-demo", RENAMED) {
        return code;
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(args) => run_devices(&args),
        Command::Pingpong(a) => run_sized(
            &a.common,
            "pingpong",
            SizedParams {
                iterations: a.iterations,
                size: a.size,
            },
            pingpong::client,
            pingpong::server,
            pingpong::Report::render,
        ),
        Command::WriteRead(a) => run_sized(
            &a.common,
            "write-read",
            SizedParams {
                iterations: a.iterations,
                size: a.size,
            },
            write_read::client,
            write_read::server,
            write_read::Report::render,
        ),
        Command::WritePingpong(a) if a.common.event || a.common.mode == Mode::Event => {
            Err(Failure {
                code: exit::USAGE,
                message: "write-pingpong polls memory for the peer's WRITEs (as ib_write_lat): it \
                          has no event mode; leave out --mode event / -e"
                    .to_string(),
            })
        }
        Command::WritePingpong(a) if a.common.stamps > 0 => Err(Failure {
            code: exit::USAGE,
            message: "write-pingpong takes no completion events and posts no sends it waits for: \
                      --stamps is for pingpong, write-read and atomic"
                .to_string(),
        }),
        Command::WritePingpong(a) => run_sized(
            &a.common,
            "write-pingpong",
            SizedParams {
                iterations: a.iterations,
                size: a.size,
            },
            write_pingpong::client,
            write_pingpong::server,
            write_pingpong::Report::render,
        ),
        Command::Atomic(a) => {
            let p = atomic::Params {
                iterations: a.iterations,
                clients: a.clients,
                repeat: a.repeat,
            };
            run_demo(
                &a.common,
                "atomic",
                serde_json::json!({ "iterations": p.iterations, "clients": p.clients, "repeat": p.repeat }),
                |c| atomic::clients(c, p),
                move |s| atomic::server(s, p).map(|r| vec![r]),
                atomic::Report::render,
            )
        }
        Command::Completions { shell } => completions(shell),
        Command::Man { out } => man_pages(&out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // Not eprintln!: it panics if stderr is gone.
            let _ = writeln!(io::stderr(), "rdma-demo: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn run_devices(args: &DevicesArgs) -> Result<(), Failure> {
    let inventory = devices::collect(args.device.as_deref())?;
    let text = if args.json {
        let mut json = serde_json::to_string_pretty(&inventory).map_err(|e| Failure {
            code: exit::FAILURE,
            message: format!("encoding JSON: {e}"),
        })?;
        json.push('\n');
        json
    } else {
        devices::render_text(&inventory)
    };
    print(&text)
}

impl CommonArgs {
    fn options(&self, device: Option<&String>) -> EndpointOptions {
        EndpointOptions {
            device: device.cloned(),
            ib_port: self.ib_port,
            gid_index: self.gid_index,
            mtu: self.mtu.as_deref().and_then(|m| m.parse().ok()),
            mode: if self.event { Mode::Event } else { self.mode },
            timeout: Duration::from_secs_f64(self.timeout),
            fault: None,
            completion_faults: CompletionFaults::default(),
            stamps: self.stamps,
        }
    }

    fn client_options(&self) -> EndpointOptions {
        let mut o = self.options(self.device.as_ref());
        o.fault = self.inject_fault;
        o.completion_faults = self.completion_faults();
        o
    }

    fn completion_faults(&self) -> CompletionFaults {
        CompletionFaults {
            no_rearm_after: self.fault_no_rearm_after,
            no_poll: self.fault_no_poll,
            unread_events: self.fault_unread_events,
        }
    }

    fn server_options(&self) -> EndpointOptions {
        let mut o = self.options(self.server_device.as_ref().or(self.device.as_ref()));
        if self.server {
            o.fault = self.inject_fault;
            o.completion_faults = self.completion_faults();
        }
        o
    }

    fn params_json(&self) -> serde_json::Value {
        let o = self.client_options();
        serde_json::json!({
            "role": if self.loopback { "loopback" } else if self.server { "server" } else { "client" },
            "server": self.host,
            "device": self.device,
            "server_device": self.server_device,
            "ib_port": self.ib_port,
            "gid_index": self.gid_index,
            "mtu": o.mtu,
            "tcp_port": self.port,
            "bind": self.bind,
            "mode": o.mode,
            "timeout_s": self.timeout,
            "stamps": self.stamps,
        })
    }
}

/// Runs a demo in the role the flags ask for; returns the reports (client first).
fn run_roles<R, C, S>(c: &CommonArgs, client: C, server: S) -> Result<Vec<R>, Failure>
where
    R: Send + 'static,
    C: FnOnce(&Client) -> Result<R, DemoError>,
    S: FnOnce(&Server) -> Result<R, DemoError> + Send + 'static,
{
    if c.server_device.is_some() && !c.loopback {
        return Err(Failure {
            code: exit::USAGE,
            message: "--server-device needs --loopback (a server alone takes --device)".into(),
        });
    }
    if c.loopback {
        let listener = exchange::listen("127.0.0.1", c.port).map_err(DemoError::from)?;
        let port = listener
            .local_addr()
            .map_err(|e| DemoError::Other(format!("local address of the listener: {e}")))?
            .port();
        let sopts = c.server_options();
        let server = std::thread::Builder::new()
            .name("server".into())
            .spawn(move || {
                server(&Server {
                    opts: &sopts,
                    listener: &listener,
                })
            })
            .map_err(|e| DemoError::Other(format!("starting the server thread: {e}")))?;
        let client_result = client(&Client {
            opts: &c.client_options(),
            host: "127.0.0.1",
            port,
        });
        if client_result.is_err() {
            // If the server still waits for the client, an empty connection ends its wait at
            // once (the peer closed) instead of after the accept timeout.
            let _ = std::net::TcpStream::connect(("127.0.0.1", port));
        }
        let server_result = server
            .join()
            .unwrap_or_else(|_| Err(DemoError::Other("the server thread panicked".into())));
        match (client_result, server_result) {
            (Ok(cr), Ok(sr)) => Ok(vec![cr, sr]),
            (Err(e), _) => Err(e.on("client").into()),
            (Ok(_), Err(e)) => Err(e.on("server").into()),
        }
    } else if c.server {
        let listener = exchange::listen(&c.bind, c.port).map_err(DemoError::from)?;
        Ok(vec![server(&Server {
            opts: &c.server_options(),
            listener: &listener,
        })?])
    } else {
        let host = c.host.as_deref().unwrap_or("127.0.0.1");
        Ok(vec![client(&Client {
            opts: &c.client_options(),
            host,
            port: c.port,
        })?])
    }
}

fn output<R: serde::Serialize>(
    c: &CommonArgs,
    demo: &str,
    params: serde_json::Value,
    reports: &[R],
    render: impl Fn(&R) -> String,
) -> Result<(), Failure> {
    let text: String = reports.iter().map(&render).collect::<Vec<_>>().join("\n");
    print(&text)?;
    if let Some(path) = &c.json {
        let mut run = c.params_json();
        if let (Some(run), Some(p)) = (run.as_object_mut(), params.as_object()) {
            run.extend(p.clone());
        }
        let v = serde_json::json!({ "demo": demo, "params": run, "reports": reports });
        let mut s = serde_json::to_string_pretty(&v).map_err(|e| Failure {
            code: exit::FAILURE,
            message: format!("encoding JSON: {e}"),
        })?;
        s.push('\n');
        std::fs::write(path, s).map_err(|e| Failure {
            code: exit::FAILURE,
            message: format!("writing {}: {e}", path.display()),
        })?;
    }
    Ok(())
}

/// The one dispatcher of the demos: run the roles the flags ask for, print every report
/// (client first), and write the JSON. Each role returns its reports (the atomic client side
/// runs several clients).
fn run_demo<R, C, S>(
    c: &CommonArgs,
    demo: &str,
    params: serde_json::Value,
    client: C,
    server: S,
    render: fn(&R) -> String,
) -> Result<(), Failure>
where
    R: serde::Serialize + Send + 'static,
    C: FnOnce(&Client) -> Result<Vec<R>, DemoError>,
    S: FnOnce(&Server) -> Result<Vec<R>, DemoError> + Send + 'static,
{
    let reports: Vec<R> = run_roles(c, client, server)?
        .into_iter()
        .flatten()
        .collect();
    output(c, demo, params, &reports, render)
}

/// [`run_demo`] for a demo of one client and one server that agree on `iterations` and `size`.
fn run_sized<R>(
    c: &CommonArgs,
    demo: &str,
    p: SizedParams,
    client: fn(&Client, SizedParams) -> Result<R, DemoError>,
    server: fn(&Server, SizedParams) -> Result<R, DemoError>,
    render: fn(&R) -> String,
) -> Result<(), Failure>
where
    R: serde::Serialize + Send + 'static,
{
    run_demo(
        c,
        demo,
        serde_json::json!({ "iterations": p.iterations, "size": p.size }),
        |c| client(c, p).map(|r| vec![r]),
        move |s| server(s, p).map(|r| vec![r]),
        render,
    )
}

fn completions(shell: clap_complete::Shell) -> Result<(), Failure> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "rdma-demo", &mut script);
    print(&String::from_utf8_lossy(&script))
}

/// `rdma-demo.1` and `rdma-demo-<subcommand>.1` for every visible subcommand, into `dir`.
fn man_pages(dir: &std::path::Path) -> Result<(), Failure> {
    let fail = |what: String| Failure {
        code: exit::FAILURE,
        message: what,
    };
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
    let mut cmd = Cli::command();
    cmd.build();
    let mut pages: Vec<(String, clap::Command)> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| (format!("rdma-demo-{}", s.get_name()), s.clone()))
        .collect();
    pages.push(("rdma-demo".to_string(), cmd));
    for (name, page) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut text = Vec::new();
        // clap wants a 'static name; this runs once per page in a short-lived process.
        let page = page.name(&*Box::leak(name.into_boxed_str()));
        clap_mangen::Man::new(page)
            .render(&mut text)
            .and_then(|()| std::fs::write(&path, text))
            .map_err(|e| fail(format!("writing {}: {e}", path.display())))?;
    }
    Ok(())
}

/// Writes to stdout; a closed pipe (`rdma-demo devices | head`) ends quietly.
fn print(text: &str) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(Failure {
            code: exit::FAILURE,
            message: format!("writing output: {e}"),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_documents_exit_codes() {
        rdma_demo::flags::check_exit_codes_help(&Cli::command().render_long_help().to_string());
    }

    #[test]
    fn no_exit_code_means_two_things() {
        let mut codes: Vec<u8> = exit::ALL.iter().map(|(c, _)| *c).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), exit::ALL.len(), "{:?}", exit::ALL);
        assert!(codes.iter().all(|&c| c < exit::SIGNAL_BASE));
    }

    #[test]
    fn a_short_flag_means_one_long_flag_in_every_subcommand() {
        // The perftest letters.
        let letters: Vec<(&str, char, &str)> = ["pingpong", "write-read", "write-pingpong"]
            .into_iter()
            .flat_map(|demo| {
                [
                    ('s', "size"),
                    ('n', "iterations"),
                    ('x', "gid-index"),
                    ('e', "event"),
                    ('d', "device"),
                    ('i', "ib-port"),
                    ('p', "port"),
                    ('m', "mtu"),
                ]
                .map(|(short, long)| (demo, short, long))
            })
            .collect();
        rdma_demo::flags::check_short_flags(&Cli::command(), &letters);
    }

    #[test]
    fn old_spellings_name_the_new_flag() {
        let refused = [
            (
                "rdma-demo pingpong -s",
                "-s is now --size (as in perftest); run the server with --server",
            ),
            (
                "rdma-demo pingpong -s -d rxe0 -e",
                "run the server with --server",
            ),
            (
                "rdma-demo write-read -d rxe0 -s",
                "run the server with --server",
            ),
            (
                "rdma-demo atomic -s -d rxe0",
                "which atomic does not have; run the server with --server",
            ),
            ("rdma-demo atomic -s 64", "run the server with --server"),
            (
                "rdma-demo pingpong -g 1 10.9.0.1",
                "-g is now -x (--gid-index), as in perftest",
            ),
            (
                "rdma-demo pingpong --loopback -S 64",
                "-S is now -s (--size), as in perftest",
            ),
            (
                "rdma-demo pingpong --loopback -i 1000",
                "-i is now -n (--iterations), as in perftest",
            ),
            (
                "rdma-demo atomic --loopback -i 500",
                "-i is now -n (--iterations)",
            ),
        ];
        let accepted = [
            "rdma-demo pingpong --server -s 64",
            "rdma-demo pingpong --loopback -s 4096 -n 10 -x 1 -i 1",
            "rdma-demo devices -d rxe0",
            "rdma-demo write-pingpong --server -d rxe0 -i 2",
        ];
        rdma_demo::flags::check_renamed(&Cli::command(), RENAMED, &refused, &accepted);
    }

    #[test]
    fn iteration_and_size_bounds_are_the_shared_limits() {
        use rdma_demo::limits::{MAX_ITERATIONS, MAX_SIZE, MIN_SIZE};
        let parses = |args: &[&str]| {
            Cli::try_parse_from([&["rdma-demo"][..], args, &["--server"]].concat()).is_ok()
        };
        let n = |v: u32| v.to_string();
        for demo in ["pingpong", "write-read", "atomic"] {
            assert!(parses(&[demo, "-n", &n(MAX_ITERATIONS)]), "{demo}");
            assert!(!parses(&[demo, "-n", &n(MAX_ITERATIONS + 1)]), "{demo}");
        }
        for demo in ["pingpong", "write-read"] {
            assert!(parses(&[demo, "-s", &n(MIN_SIZE)]), "{demo}");
            assert!(!parses(&[demo, "-s", &n(MIN_SIZE - 1)]), "{demo}");
            assert!(parses(&[demo, "-s", &n(MAX_SIZE)]), "{demo}");
            assert!(!parses(&[demo, "-s", &n(MAX_SIZE + 1)]), "{demo}");
        }
    }

    #[test]
    fn stamps_are_off_unless_asked_for_and_bounded() {
        let stamps = |args: &[&str]| -> Option<u32> {
            let cli =
                Cli::try_parse_from([&["rdma-demo", "pingpong", "--loopback"][..], args].concat())
                    .ok()?;
            let Command::Pingpong(a) = cli.command else {
                panic!("not pingpong")
            };
            let (c, s) = (a.common.client_options(), a.common.server_options());
            assert_eq!(c.stamps, s.stamps, "both sides stamp");
            assert_eq!(a.common.params_json()["stamps"], c.stamps);
            Some(c.stamps)
        };
        assert_eq!(stamps(&[]), Some(0));
        assert_eq!(stamps(&["--stamps", "500"]), Some(500));
        let max = rdma_demo::limits::MAX_STAMPS;
        assert_eq!(stamps(&["--stamps", &max.to_string()]), Some(max));
        assert_eq!(stamps(&["--stamps", &(max + 1).to_string()]), None);
    }

    #[test]
    fn pingpong_flags() {
        let cli = Cli::try_parse_from([
            "rdma-demo",
            "pingpong",
            "-e",
            "-n",
            "5",
            "-s",
            "64",
            "10.9.0.1",
        ])
        .unwrap();
        let Command::Pingpong(a) = cli.command else {
            panic!("not pingpong")
        };
        assert_eq!(a.common.client_options().mode, Mode::Event);
        assert_eq!(a.common.host.as_deref(), Some("10.9.0.1"));
        assert_eq!(a.common.port, 18515);
        assert_eq!(a.common.bind, "0.0.0.0");
        assert_eq!(a.common.client_options().timeout, Duration::from_secs(10));
        assert_eq!((a.iterations, a.size), (5, 64));
        let Command::Pingpong(d) = Cli::try_parse_from(["rdma-demo", "pingpong", "--server"])
            .unwrap()
            .command
        else {
            panic!("not pingpong")
        };
        assert_eq!(d.size, rdma_demo::limits::DEFAULT_SIZE);
        // A client needs a server address; sizes and counts are bounded.
        for bad in [
            &["rdma-demo", "pingpong"][..],
            &["rdma-demo", "pingpong", "--server", "-s", "4"],
            &["rdma-demo", "pingpong", "--server", "-n", "0"],
            &["rdma-demo", "pingpong", "--server", "--timeout", "0"],
            &["rdma-demo", "pingpong", "--server", "--mtu", "1000"],
            &["rdma-demo", "pingpong", "--server", "host"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?} parsed");
        }
    }
}
