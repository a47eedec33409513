//! The layers of `src/`, lowest first, and the lint that keeps imports running downwards.
//!
//! | layer | what it holds |
//! |---|---|
//! | root files | errors, signals, output files, start-up steps, stoppable threads, verbosity |
//! | `kernel/` | kernel facts, the probe table, the plan |
//! | `bpf/` | the eBPF object: loader, session, map reads, histograms, statistics, calibration, aya-log |
//! | `waterfall/` | the completion waterfall: its programs' loader, model and selection |
//! | `model/` | what a run measured: window, baseline, samples, reports, overhead, budget |
//! | `load/` | what generates completions: the demo, a command, pids, the whole system |
//! | `views/` | how a run is shown: live view, timeline, Prometheus text |
//! | `run/` | the `run` pipeline: config → plan → attach → drive → collect → render |
//! | `cmd/` | one thin file per subcommand: clap arguments in, a pipeline or a loop out |
//! | `main.rs` | the command line |
//!
//! A file may import from its own layer and the layers below it, never from one above, and no
//! two files import each other, directly or round a circle. The test below reads every
//! `crate::`, `super::` and `self::` path outside the files' `#[cfg(test)]` modules (tests may
//! reach anywhere) and checks both rules.

#[cfg(test)]
mod tests {
    use std::{
        collections::{BTreeMap, BTreeSet},
        path::{Path, PathBuf},
    };

    /// Layers in order, lowest first; `""` is the root files.
    const LAYERS: &[&str] = &[
        "",
        "kernel",
        "bpf",
        "waterfall",
        "model",
        "load",
        "views",
        "run",
        "cmd",
        "main",
    ];

    fn src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
    }

    /// Every `.rs` file below `dir`, as module paths relative to `src/` (`bpf/loader.rs`).
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read src") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p.strip_prefix(src()).expect("below src").to_path_buf());
            }
        }
    }

    /// The module path of a file: `bpf/loader.rs` → [bpf, loader], `bpf/mod.rs` → [bpf].
    fn module_of(file: &Path) -> Vec<String> {
        let mut m: Vec<String> = file
            .iter()
            .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_owned())
            .collect();
        if matches!(m.last().map(String::as_str), Some("mod" | "main")) {
            m.pop();
        }
        m
    }

    fn layer_of(file: &Path) -> usize {
        let first = file.iter().next().map(|c| c.to_string_lossy().into_owned());
        let name = match first.as_deref() {
            Some("main.rs") => "main",
            Some(f) if f.ends_with(".rs") => "",
            Some(d) => d,
            None => "",
        };
        LAYERS
            .iter()
            .position(|l| *l == name)
            .unwrap_or_else(|| panic!("{}: folder {name:?} is not a layer", file.display()))
    }

    /// The file that defines module path `m`'s deepest existing prefix.
    fn file_of(m: &[String]) -> Option<PathBuf> {
        let mut best = None;
        for n in 0..=m.len() {
            let base: PathBuf = m[..n].iter().collect();
            let candidates = if n == 0 {
                vec![PathBuf::from("main.rs")]
            } else {
                vec![base.with_extension("rs"), base.join("mod.rs")]
            };
            match candidates.into_iter().find(|c| src().join(c).is_file()) {
                Some(c) => best = Some(c),
                None => break,
            }
        }
        best
    }

    /// Source without comments and without `#[cfg(test)]` items.
    fn code(text: &str) -> String {
        let mut out = String::new();
        let mut skip_depth: Option<i64> = None;
        let mut depth = 0i64;
        let mut pending_cfg_test = false;
        for line in text.lines() {
            let t = line.trim_start();
            if t.starts_with("//") {
                continue;
            }
            if skip_depth.is_none() && t.starts_with("#[cfg(test)]") {
                pending_cfg_test = true;
                continue;
            }
            let opens = line.matches('{').count() as i64;
            let closes = line.matches('}').count() as i64;
            if pending_cfg_test {
                pending_cfg_test = false;
                if opens > closes {
                    skip_depth = Some(depth);
                }
                depth += opens - closes;
                continue;
            }
            depth += opens - closes;
            if let Some(d) = skip_depth {
                if depth <= d {
                    skip_depth = None;
                }
                continue;
            }
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    /// Expands one path at `s` (after `crate::`), with `{a, b::{c, d}}` groups, into `out`.
    fn expand(s: &[u8], mut i: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
        let mut path = prefix;
        loop {
            while i < s.len() && s[i].is_ascii_whitespace() {
                i += 1;
            }
            if i < s.len() && s[i] == b'{' {
                i += 1;
                loop {
                    i = expand(s, i, path.clone(), out);
                    while i < s.len() && (s[i].is_ascii_whitespace() || s[i] == b',') {
                        i += 1;
                    }
                    if i >= s.len() || s[i] == b'}' {
                        return i + 1;
                    }
                }
            }
            let start = i;
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_') {
                i += 1;
            }
            if start == i {
                out.push(path);
                return i;
            }
            path.push(String::from_utf8_lossy(&s[start..i]).into_owned());
            if s[i..].starts_with(b"::") {
                i += 2;
            } else {
                out.push(path);
                return i;
            }
        }
    }

    /// Module paths a file refers to, made absolute.
    fn references(file: &Path, text: &str) -> Vec<Vec<String>> {
        let code = code(text);
        let s = code.as_bytes();
        let here = module_of(file);
        // Child modules this file declares (`mod workload;`), named without a prefix.
        let children: Vec<&str> = code
            .lines()
            .filter_map(|l| {
                let l = l
                    .trim_start()
                    .trim_start_matches("pub ")
                    .trim_start_matches("pub(crate) ");
                l.strip_prefix("mod ")?.strip_suffix(';')
            })
            .collect();
        let mut out = Vec::new();
        for (at, _) in code.match_indices("::") {
            let word_start = s[..at]
                .iter()
                .rposition(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
                .map_or(0, |p| p + 1);
            let word = &code[word_start..at];
            if word_start > 0 && s[word_start - 1] == b':' {
                continue; // the middle of a longer path
            }
            let prefix = match word {
                "crate" => Vec::new(),
                "super" => {
                    let mut m = here.clone();
                    m.pop();
                    m
                }
                "self" => here.clone(),
                w if children.contains(&w) => {
                    let mut m = here.clone();
                    m.push(w.to_owned());
                    expand(s, at + 2, m, &mut out);
                    continue;
                }
                _ => continue,
            };
            expand(s, at + 2, prefix, &mut out);
        }
        out
    }

    /// File → the other files it imports from.
    fn graph() -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
        let mut all = Vec::new();
        files(&src(), &mut all);
        let mut g = BTreeMap::new();
        for f in all {
            let text = std::fs::read_to_string(src().join(&f)).expect("read a source file");
            let targets: BTreeSet<PathBuf> = references(&f, &text)
                .iter()
                .filter_map(|m| file_of(m))
                .filter(|t| *t != f)
                .collect();
            g.insert(f, targets);
        }
        g
    }

    #[test]
    fn no_import_runs_upward() {
        let mut upward = Vec::new();
        for (f, targets) in graph() {
            for t in targets {
                if layer_of(&t) > layer_of(&f) {
                    upward.push(format!(
                        "{} ({}) imports {} ({})",
                        f.display(),
                        LAYERS[layer_of(&f)],
                        t.display(),
                        LAYERS[layer_of(&t)]
                    ));
                }
            }
        }
        assert!(
            upward.is_empty(),
            "imports that run upward:\n{}",
            upward.join("\n")
        );
    }

    #[test]
    fn no_import_circle() {
        let g = graph();
        // Depth-first search; a back edge closes a circle.
        fn visit(
            f: &PathBuf,
            g: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
            stack: &mut Vec<PathBuf>,
            done: &mut BTreeSet<PathBuf>,
            circles: &mut Vec<String>,
        ) {
            if let Some(i) = stack.iter().position(|s| s == f) {
                let names: Vec<String> = stack[i..]
                    .iter()
                    .chain(std::iter::once(f))
                    .map(|p| p.display().to_string())
                    .collect();
                circles.push(names.join(" → "));
                return;
            }
            if !done.insert(f.clone()) {
                return;
            }
            stack.push(f.clone());
            for t in g.get(f).into_iter().flatten() {
                visit(t, g, stack, done, circles);
            }
            stack.pop();
        }
        let (mut done, mut circles) = (BTreeSet::new(), Vec::new());
        for f in g.keys() {
            visit(f, &g, &mut Vec::new(), &mut done, &mut circles);
        }
        assert!(
            circles.is_empty(),
            "import circles:\n{}",
            circles.join("\n")
        );
    }

    /// The lint itself: it must see an upward import, a grouped one, a `super::` one, and
    /// nothing in a test module or a comment.
    #[test]
    fn the_lint_reads_grouped_relative_and_skips_tests() {
        let text = "use crate::{\n    bpf::{loader::Bpf, stats::ProgramStat},\n    views::tui::Live,\n};\n\
                    // crate::cmd::run\n\
                    fn f() { super::facts::Kernel::live(); }\n\
                    #[cfg(test)]\nmod tests {\n    use crate::cmd::run;\n}\n";
        let refs = references(Path::new("kernel/plan.rs"), text);
        let joined: Vec<String> = refs.iter().map(|r| r.join("::")).collect();
        assert_eq!(
            joined,
            [
                "bpf::loader::Bpf",
                "bpf::stats::ProgramStat",
                "views::tui::Live",
                "kernel::facts::Kernel::live"
            ]
        );
        let files: Vec<PathBuf> = refs.iter().filter_map(|m| file_of(m)).collect();
        assert_eq!(
            files,
            [
                PathBuf::from("bpf/loader.rs"),
                PathBuf::from("bpf/stats.rs"),
                PathBuf::from("views/tui/mod.rs"),
                PathBuf::from("kernel/facts.rs")
            ]
        );
        assert!(layer_of(&files[2]) > layer_of(Path::new("kernel/plan.rs")));
    }
}
