//! Reading `rdma-trace export`: start it, `GET` a page, parse the Prometheus text format.
//! Shared by the host tests (`tests/host.rs`) and the guest tests (`tests/guest.rs`), by path.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::{Child, Command, Stdio},
    time::Duration,
};

/// Starts `rdma-trace export` (binary `exe`) on an ephemeral local port, refreshing every
/// 0.2 s with `host` as its host label; returns it and its address once it serves.
pub fn start_exporter(exe: &str, host: &str) -> (Child, String) {
    let mut child = Command::new(exe)
        .args(["export", "--listen", "127.0.0.1:0", "--interval", "0.2"])
        .args(["--host", host])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rdma-trace export");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let addr = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                if let Some(rest) = line.split("serving http://").nth(1) {
                    break rest.split('/').next().unwrap().to_owned();
                }
            }
            Err(e) => {
                let _ = child.kill();
                panic!(
                    "export did not start listening: {e}; status {:?}",
                    child.try_wait()
                );
            }
        }
    };
    (child, addr)
}

/// `GET path` with a plain TcpStream; returns (status line, body).
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the exporter");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP header and body");
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

/// Every sample line is `name{labels} value` or `name value`; returns (series, value).
pub fn parse_exposition(body: &str) -> Vec<(String, f64)> {
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("no value: {l}"));
            let name_end = series.find('{').unwrap_or(series.len());
            let name = &series[..name_end];
            assert!(
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "bad metric name in {l}"
            );
            if name_end < series.len() {
                assert!(series.ends_with('}'), "unterminated labels in {l}");
                for pair in series[name_end + 1..series.len() - 1].split("\",") {
                    let (k, v) = pair
                        .split_once("=\"")
                        .unwrap_or_else(|| panic!("bad label {pair} in {l}"));
                    assert!(
                        k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                        "{l}"
                    );
                    assert!(!v.trim_end_matches('"').contains('\n'), "{l}");
                }
            }
            let v: f64 = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("bad value in {l}")),
            };
            (series.to_owned(), v)
        })
        .collect()
}

pub fn sample(samples: &[(String, f64)], prefix: &str) -> f64 {
    samples
        .iter()
        .find(|(s, _)| s.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix}"))
        .1
}
