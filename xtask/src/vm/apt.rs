//! Downloading Debian packages with `apt-get download`: from the host's own lists, or from a private
//! sources list + lists folder in the cache (bookworm-backports, bullseye, trixie-backports). The
//! host's apt configuration is only ever read, never changed.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::packages::{self, KernelPackage, Origin};
use crate::util::{output, say};

/// Host apt sources, read to find the Debian mirror.
const SYSTEM_SOURCES_DIR: &str = "/etc/apt/sources.list.d";
const SYSTEM_SOURCES_LIST: &str = "/etc/apt/sources.list";
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// A Debian mirror found in the host's apt sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    pub uri: String,
    pub signed_by: Option<String>,
}

/// Which apt lists a command works on.
pub struct Apt {
    /// `None`: the host's lists. `Some(dir)`: the private list in `dir`.
    private: Option<PathBuf>,
}

impl Apt {
    pub fn system() -> Self {
        Apt { private: None }
    }

    /// The private list of `suite` in `dir` (created, and `apt-get update`d, on demand).
    pub fn private(dir: &Path, suite: &str) -> Result<Self> {
        let mirror = system_mirror();
        let apt = Apt {
            private: Some(dir.to_path_buf()),
        };
        for sub in ["sources.list.d", "lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let opts = match &mirror.signed_by {
            Some(key) => format!("[signed-by={key}] "),
            None => String::new(),
        };
        let list = format!(
            "# Written by cargo xtask vm; used only with apt-get -o Dir::Etc::SourceList=...\n\
             deb {opts}{} {} main\n",
            mirror.uri, suite
        );
        fs::write(dir.join("sources.list"), list).context("writing the private sources.list")?;
        say(format!(
            "apt-get update of a private list: {} {}",
            mirror.uri, suite
        ));
        output(apt.cmd("apt-get").args(["-q", "update"]))
            .context("apt-get update of the private list")?;
        Ok(apt)
    }

    fn for_origin(origin: Origin, cache: &Path) -> Result<Self> {
        match origin {
            Origin::System => Ok(Apt::system()),
            // bookworm-backports keeps the folder it had before other suites came.
            Origin::Suite("bookworm-backports") => {
                Apt::private(&cache.join("apt"), "bookworm-backports")
            }
            Origin::Suite(suite) => Apt::private(&cache.join(format!("apt-{suite}")), suite),
        }
    }

    /// `apt-get`/`apt-cache` with the options that select the lists.
    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        if let Some(dir) = &self.private {
            let o = |k: &str, v: &Path| format!("{k}={}", v.display());
            c.arg("-o")
                .arg(o("Dir::Etc::SourceList", &dir.join("sources.list")))
                .arg("-o")
                .arg(o("Dir::Etc::SourceParts", &dir.join("sources.list.d")))
                .arg("-o")
                .arg(o("Dir::State::Lists", &dir.join("lists")))
                .arg("-o")
                .arg(o("Dir::Cache", &dir.join("cache")));
        }
        c
    }

    /// True when apt has a downloadable version of `name`.
    fn has_candidate(&self, name: &str) -> bool {
        self.cmd("apt-cache")
            .args(["show", "--no-all-versions", name])
            .output()
            .map(|o| o.status.success() && !o.stdout.is_empty())
            .unwrap_or(false)
    }

    /// Package names apt knows that start with `prefix`.
    fn names_with_prefix(&self, prefix: &str) -> Result<Vec<String>> {
        let out = output(self.cmd("apt-cache").args(["pkgnames", prefix]))?;
        Ok(out.lines().map(str::to_owned).collect())
    }

    /// `apt-get download` the packages into `dir`, quietly. Running as root, apt would warn that
    /// the download is unsandboxed (its `_apt` user cannot write `dir`); the sandbox user is set to
    /// root so that warning does not appear.
    pub fn download(&self, dir: &Path, names: &[&str]) -> Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut c = self.cmd("apt-get");
        c.current_dir(dir)
            .args(["-q", "-o", "APT::Sandbox::User=root", "download"])
            .args(names);
        output(&mut c).with_context(|| {
            format!(
                "downloading {} (is the host's apt list current? `apt-get update`)",
                names.join(" ")
            )
        })?;
        Ok(())
    }
}

/// The kernel package to use: the pinned one while apt still has it, otherwise the newest package
/// of the same series (said on stderr). Downloads it into `debs` and returns its name.
pub fn fetch_kernel(pkg: &KernelPackage, cache: &Path, debs: &Path) -> Result<String> {
    let apt = Apt::for_origin(pkg.origin, cache)?;
    let name = if apt.has_candidate(pkg.pinned) {
        pkg.pinned.to_owned()
    } else {
        let names = apt.names_with_prefix(pkg.prefix)?;
        let newest = packages::matching_newest_first(
            names.iter().map(String::as_str),
            pkg.prefix,
            pkg.suffix,
        )
        .into_iter()
        .find(|n| apt.has_candidate(n))
        .map(str::to_owned);
        let Some(newest) = newest else {
            bail!(
                "kernel package {} is not available, nor any {}<N>{}",
                pkg.pinned,
                pkg.prefix,
                pkg.suffix
            );
        };
        say(format!(
            "NOTE: pinned kernel package {} is gone from the archive; falling back to the newest of its series, {newest}",
            pkg.pinned
        ));
        newest
    };
    say(format!("kernel package: {name} (downloading)"));
    apt.download(debs, &[&name])?;
    Ok(name)
}

/// Downloads the parts of a split kernel package (`names`) from the suite of `pkg` into `debs`.
pub fn fetch_parts(pkg: &KernelPackage, cache: &Path, debs: &Path, names: &[&str]) -> Result<()> {
    Apt::for_origin(pkg.origin, cache)?.download(debs, names)
}

/// The host's bookworm mirror (and its key), from its deb822 or one-line sources; Debian's
/// default mirror when none is found.
pub fn system_mirror() -> Mirror {
    let mut deb822 = Vec::new();
    let mut one_line = vec![PathBuf::from(SYSTEM_SOURCES_LIST)];
    if let Ok(rd) = fs::read_dir(SYSTEM_SOURCES_DIR) {
        let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            match p.extension().and_then(|e| e.to_str()) {
                Some("sources") => deb822.push(p),
                Some("list") => one_line.push(p),
                _ => {}
            }
        }
    }
    let from_deb822 = deb822
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .find_map(|t| mirror_from_deb822(&t, "bookworm"));
    let found = from_deb822.or_else(|| {
        one_line
            .iter()
            .filter_map(|p| fs::read_to_string(p).ok())
            .find_map(|t| mirror_from_one_line(&t, "bookworm"))
    });
    found.unwrap_or_else(|| {
        say(format!(
            "no bookworm mirror in the host's apt sources; using {DEFAULT_MIRROR}"
        ));
        Mirror {
            uri: DEFAULT_MIRROR.to_owned(),
            signed_by: None,
        }
    })
}

/// The first enabled `Types: deb` stanza of a deb822 sources file whose `Suites` has `suite`.
pub fn mirror_from_deb822(text: &str, suite: &str) -> Option<Mirror> {
    let mut stanza: Vec<(String, String)> = Vec::new();
    let mut stanzas = Vec::new();
    for line in text.lines().chain(std::iter::once("")) {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            if !stanza.is_empty() {
                stanzas.push(std::mem::take(&mut stanza));
            }
            continue;
        }
        if trimmed.starts_with('#') {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            // Continuation line (multi-line field such as an inline Signed-By key).
            if let Some(last) = stanza.last_mut() {
                last.1.push('\n');
                last.1.push_str(trimmed);
            }
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            stanza.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    stanzas.into_iter().find_map(|fields| {
        let get = |k: &str| {
            fields
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        let words = |k: &str| get(k).unwrap_or("").split_whitespace().collect::<Vec<_>>();
        if get("enabled").is_some_and(|v| v.eq_ignore_ascii_case("no")) {
            return None;
        }
        if !words("types").contains(&"deb") || !words("suites").contains(&suite) {
            return None;
        }
        let uri = words("uris").first()?.to_string();
        // Only a key file path can go into a one-line list; an inline key cannot.
        let signed_by = get("signed-by")
            .filter(|v| v.starts_with('/') && !v.contains('\n'))
            .map(str::to_owned);
        Some(Mirror { uri, signed_by })
    })
}

/// The first `deb [options] URI suite components...` line of a one-line sources file for `suite`.
pub fn mirror_from_one_line(text: &str, suite: &str) -> Option<Mirror> {
    text.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or("").trim();
        let rest = line.strip_prefix("deb")?;
        if !rest.starts_with([' ', '\t']) {
            return None; // deb-src
        }
        let rest = rest.trim_start();
        let (options, rest) = match rest.strip_prefix('[') {
            Some(r) => {
                let (opts, after) = r.split_once(']')?;
                (opts, after)
            }
            None => ("", rest),
        };
        let mut words = rest.split_whitespace();
        let uri = words.next()?;
        if words.next()? != suite {
            return None;
        }
        let signed_by = options
            .split_whitespace()
            .find_map(|o| o.strip_prefix("signed-by="))
            .map(str::to_owned);
        Some(Mirror {
            uri: uri.to_owned(),
            signed_by,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "\
Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
Components: main

Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

    #[test]
    fn deb822_picks_the_bookworm_stanza() {
        assert_eq!(
            mirror_from_deb822(DEB822, "bookworm"),
            Some(Mirror {
                uri: "http://deb.debian.org/debian".into(),
                signed_by: Some("/usr/share/keyrings/debian-archive-keyring.gpg".into()),
            })
        );
        assert_eq!(
            mirror_from_deb822(DEB822, "bookworm-security").map(|m| m.uri),
            Some("http://deb.debian.org/debian-security".into())
        );
        assert_eq!(mirror_from_deb822(DEB822, "trixie"), None);
    }

    #[test]
    fn deb822_skips_disabled_and_inline_keys() {
        let text = "Types: deb\nURIs: http://a/debian\nSuites: bookworm\nEnabled: no\n\n\
                    Types: deb\nURIs: http://b/debian http://c/debian\nSuites: bookworm\n\
                    Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n";
        assert_eq!(
            mirror_from_deb822(text, "bookworm"),
            Some(Mirror {
                uri: "http://b/debian".into(),
                signed_by: None
            })
        );
    }

    #[test]
    fn one_line_format() {
        let text = "\
# deb http://commented/debian bookworm main
deb-src http://src/debian bookworm main
deb http://security.debian.org/debian-security bookworm-security main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.example/debian bookworm main contrib
deb http://other/debian bookworm main
";
        assert_eq!(
            mirror_from_one_line(text, "bookworm"),
            Some(Mirror {
                uri: "http://mirror.example/debian".into(),
                signed_by: Some("/usr/share/keyrings/k.gpg".into()),
            })
        );
        assert_eq!(
            mirror_from_one_line(
                "deb\thttp://x/debian  bookworm main # comment\n",
                "bookworm"
            ),
            Some(Mirror {
                uri: "http://x/debian".into(),
                signed_by: None
            })
        );
        assert_eq!(mirror_from_one_line("", "bookworm"), None);
    }
}
