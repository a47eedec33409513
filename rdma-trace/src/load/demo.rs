//! The bundled rdma-demo as a command rdma-trace knows how to find and read: where its binary
//! is, what its exit status means, and its output read while it runs.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _},
    process::Child,
    task::JoinHandle,
};

/// The demo's stdout and stderr, each read to the end by a task of its own while the demo runs
/// (so it never blocks on a full pipe).
pub struct Output {
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

impl Output {
    /// Starts reading the piped stdout and stderr of `child`.
    pub fn capture(child: &mut Child) -> Result<Output> {
        let stdout = child.stdout.take().context("demo stdout")?;
        let stderr = child.stderr.take().context("demo stderr")?;
        Ok(Output {
            stdout: tokio::spawn(read_all(stdout)),
            stderr: tokio::spawn(read_all(stderr)),
        })
    }

    /// What the demo wrote to stdout and to stderr (as far as it could be read).
    pub async fn finish(self) -> (String, String) {
        let stdout = self.stdout.await.unwrap_or_default();
        let stderr = self.stderr.await.unwrap_or_default();
        (stdout, stderr)
    }
}

async fn read_all(mut pipe: impl AsyncRead + Unpin) -> String {
    let mut s = String::new();
    let _ = pipe.read_to_string(&mut s).await;
    s
}

/// The rdma-demo binary: `given`, else next to rdma-trace, else on PATH. Says on stderr which
/// one (one line: `rdma-trace: using rdma-demo at PATH`); callers start it right after.
pub fn binary(given: Option<&Path>) -> Result<PathBuf> {
    let demo = find(
        given,
        std::env::current_exe().ok().as_deref(),
        std::env::var_os("PATH"),
    )?;
    eprintln!("rdma-trace: using rdma-demo at {}", demo.display());
    Ok(demo)
}

/// [`binary`] without the message, for rdma-trace at `exe` and this `path`.
fn find(
    given: Option<&Path>,
    exe: Option<&Path>,
    path: Option<std::ffi::OsString>,
) -> Result<PathBuf> {
    if let Some(p) = given {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("--demo-binary {}: no such file", p.display());
    }
    let beside = exe.and_then(|e| e.parent().map(|d| d.join("rdma-demo")));
    if let Some(p) = beside.filter(|p| p.is_file()) {
        return Ok(p);
    }
    path.iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("rdma-demo"))
        .find(|p| p.is_file())
        .context("rdma-demo not found next to rdma-trace nor on PATH: build it (cargo build) or pass --demo-binary PATH")
}

/// What an rdma-demo exit status means (rdma-demo's `--help` lists them).
pub fn status_meaning(status: Option<i32>) -> &'static str {
    use rdma_demo::error::exit as e;
    let Some(s) = status else {
        return "it did not exit";
    };
    [
        (e::FAILURE, "failure"),
        (e::USAGE, "bad usage"),
        (e::NO_DEVICE, "no or unknown RDMA device"),
        (e::PORT, "port or GID"),
        (e::CONNECT, "no TCP connection"),
        (e::EXCHANGE, "bad exchange"),
        (e::TIMEOUT, "completion timeout"),
        (e::WC_STATUS, "completion error"),
        (e::VERIFY, "verification failed"),
    ]
    .iter()
    .find(|(code, _)| i32::from(*code) == s)
    .map_or(
        if s > crate::signals::SIGNAL_STATUS_BASE {
            "killed by a signal"
        } else {
            "unknown"
        },
        |(_, m)| m,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_beside_rdma_trace_comes_before_path() {
        let base =
            std::env::temp_dir().join(format!("rdma-trace-demo-find-{}", std::process::id()));
        let (bin, on_path) = (base.join("bin"), base.join("path"));
        for d in [&bin, &on_path] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(on_path.join("rdma-demo"), "").unwrap();
        let exe = bin.join("rdma-trace");
        let path = Some(on_path.clone().into_os_string());
        assert_eq!(
            find(None, Some(&exe), path.clone()).unwrap(),
            on_path.join("rdma-demo")
        );
        std::fs::write(bin.join("rdma-demo"), "").unwrap();
        assert_eq!(find(None, Some(&exe), path).unwrap(), bin.join("rdma-demo"));
        assert!(find(None, Some(&exe), None).is_ok());
        std::fs::remove_file(bin.join("rdma-demo")).unwrap();
        let err = find(None, Some(&exe), None).unwrap_err().to_string();
        assert!(err.contains("nor on PATH"), "{err}");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
