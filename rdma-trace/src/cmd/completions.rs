//! `rdma-trace completions SHELL` and the hidden `rdma-trace man --out DIR` (what
//! `cargo xtask man` runs): both generated from the clap definitions.

use std::path::Path;

use anyhow::{Context as _, Result};

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
                        rdma-trace completions bash > /etc/bash_completion.d/rdma-trace\n  \
                        rdma-trace completions zsh > \"${fpath[1]}/_rdma-trace\"\n  \
                        rdma-trace completions fish > ~/.config/fish/completions/rdma-trace.fish")]
pub struct Args {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Directory for the pages (created when missing).
    #[arg(long, value_name = "DIR")]
    pub out: std::path::PathBuf,
}

/// The completion script for `shell`, to stdout.
pub fn completions(mut cmd: clap::Command, shell: clap_complete::Shell) -> Result<()> {
    let name = cmd.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut script);
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(&script).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("writing the completion script")
        }
        _ => Ok(()),
    }
}

/// `NAME.1` and `NAME-SUB.1` for every visible subcommand of `cmd`, into `dir`; returns the
/// file names.
pub fn man_pages(mut cmd: clap::Command, dir: &Path) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    cmd.build();
    let top = cmd.get_name().to_owned();
    let mut pages: Vec<(String, clap::Command)> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| (format!("{top}-{}", s.get_name()), s.clone()))
        .collect();
    pages.push((top, cmd));
    let mut written = Vec::new();
    for (name, page) in pages {
        let file = format!("{name}.1");
        let path = dir.join(&file);
        let mut text = Vec::new();
        // clap wants a 'static name; this runs once per page in a short-lived process.
        let page = page.name(&*Box::leak(name.into_boxed_str()));
        clap_mangen::Man::new(page)
            .render(&mut text)
            .with_context(|| format!("rendering {file}"))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(file);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    fn visible_subcommands() -> Vec<String> {
        crate::Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| s.get_name().to_owned())
            .collect()
    }

    #[test]
    fn completion_scripts_name_every_subcommand() {
        let subs = visible_subcommands();
        assert!(subs.iter().any(|s| s == "verify") && subs.iter().any(|s| s == "export"));
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut crate::Cli::command(), "rdma-trace", &mut script);
            let script = String::from_utf8(script).unwrap();
            for s in &subs {
                assert!(script.contains(s.as_str()), "{shell}: no {s}");
            }
        }
    }

    #[test]
    fn every_help_has_examples() {
        let mut cmd = crate::Cli::command();
        cmd.build();
        let top = cmd.render_long_help().to_string();
        assert!(top.contains("Examples:"), "{top}");
        for sub in cmd.get_subcommands_mut().filter(|s| !s.is_hide_set()) {
            if sub.get_name() == "help" {
                continue;
            }
            let help = sub.render_long_help().to_string();
            assert!(
                help.contains("Examples:\n  ") && help.contains("rdma-trace "),
                "{}:\n{help}",
                sub.get_name()
            );
        }
    }

    #[test]
    fn one_man_page_per_subcommand() {
        let dir = std::env::temp_dir().join(format!("rdma-trace-man-{}", std::process::id()));
        let pages = man_pages(crate::Cli::command(), &dir).unwrap();
        let mut want: Vec<String> = visible_subcommands()
            .iter()
            .map(|s| format!("rdma-trace-{s}.1"))
            .collect();
        want.push("rdma-trace.1".into());
        let mut got = pages.clone();
        got.sort();
        want.sort();
        assert_eq!(got, want);
        let verify = std::fs::read_to_string(dir.join("rdma-trace-verify.1")).unwrap();
        assert!(
            verify.contains(".TH") && verify.contains("data phase"),
            "{verify}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
