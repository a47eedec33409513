//! Command-line conventions that `rdma-demo` and `rdma-trace` share.
//!
//! * [`Renamed`] and [`deprecated`]: a flag spelling that changed meaning (to follow perftest
//!   in the demo, bpftrace/BCC in the tracer) ends the program with one line naming the new
//!   flag, exit code 2, for one release. Each binary keeps its rules in one table, checked over
//!   argv before clap parses it.
//! * [`short_flag_clashes`]: a short flag means one long flag in every subcommand that has it,
//!   and a long flag has the same short everywhere (or none anywhere). The binaries' tests run it
//!   over their clap `Command`.
//! * [`refuse_renamed`]: the check each binary's `main` runs first; [`check_renamed`] and
//!   [`check_exit_codes_help`]: what each binary's tests assert over its own table and help.

use std::collections::BTreeMap;
use std::io::{self, Write as _};
use std::process::ExitCode;

use crate::error::exit;

/// Which uses of an old spelling a [`Renamed`] rule refuses. A flag that has a new meaning
/// may still be valid with a value of that meaning (rdma-demo's `-s 64` is a size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Any use.
    Always,
    /// With no value: the end of the line or another flag next (a switch that became an
    /// option taking a value, e.g. `probes --json`).
    NoValue,
    /// With no value, or one that is not a whole number (`-s` alone was the server switch;
    /// `-s 64` is a size).
    NotANumber,
    /// With no value, or a number outside `lo..=hi` (`-i 1000` was the iteration count;
    /// `-i 1` is an IB port).
    NotIn(u64, u64),
}

impl When {
    fn refuses(self, value: Option<&str>) -> bool {
        let number = value.and_then(|v| v.parse::<u64>().ok());
        match self {
            When::Always => true,
            When::NoValue => value.is_none(),
            When::NotANumber => number.is_none(),
            When::NotIn(lo, hi) => number.is_none_or(|n| !(lo..=hi).contains(&n)),
        }
    }
}

/// An old flag spelling, refused with `message` in the listed subcommands.
#[derive(Clone, Copy, Debug)]
pub struct Renamed {
    /// The subcommands (first word after the program name) the rule applies to.
    pub subcommands: &'static [&'static str],
    /// The old spelling: `-i`, `--json`.
    pub old: &'static str,
    /// The flag to use now (long form), which each listed subcommand has: tests check it.
    pub new: &'static str,
    pub when: When,
    /// The one line printed (after the program's name).
    pub message: &'static str,
}

/// The first rule of `table` that refuses `args` (argv, program name first). The subcommand is
/// the first word not starting with `-`; the words after it are read up to a `--` (what follows
/// belongs to a command or to the demo). A flag's value is the rest of its word (`-i100`,
/// `--json=x`) or the next word, unless that is another flag (`-` alone is a value: stdout).
pub fn deprecated<'t>(args: &[String], table: &'t [Renamed]) -> Option<&'t Renamed> {
    let mut words = args.iter().skip(1).map(String::as_str);
    let sub = words.by_ref().find(|w| !w.starts_with('-'))?;
    let words: Vec<&str> = words.take_while(|w| *w != "--").collect();
    let next_value = |i: usize| {
        words
            .get(i + 1)
            .copied()
            .filter(|w| !(w.starts_with('-') && w.len() > 1))
    };
    for (i, w) in words.iter().enumerate() {
        for rule in table.iter().filter(|r| r.subcommands.contains(&sub)) {
            let value = if *w == rule.old {
                next_value(i)
            } else if let Some(rest) = w.strip_prefix(rule.old)
                && (rule.old.starts_with("--") && rest.starts_with('=')
                    || !rule.old.starts_with("--") && !w.starts_with("--"))
            {
                Some(rest.strip_prefix('=').unwrap_or(rest))
            } else {
                continue;
            };
            if rule.when.refuses(value) {
                return Some(rule);
            }
        }
    }
    None
}

/// For the binaries' tests: `cmd` has no [`short_flag_clashes`], and in each
/// `(subcommand, short, long)` of `letters` the short letter is that long flag. Returns `cmd`
/// built, for further checks.
pub fn check_short_flags(cmd: &clap::Command, letters: &[(&str, char, &str)]) -> clap::Command {
    assert_eq!(short_flag_clashes(cmd), Vec::<String>::new());
    let mut cmd = cmd.clone();
    cmd.build();
    for &(sub, short, long) in letters {
        let arg = cmd
            .find_subcommand(sub)
            .unwrap_or_else(|| panic!("no subcommand {sub}"))
            .get_arguments()
            .find(|a| a.get_short() == Some(short));
        assert_eq!(arg.and_then(|a| a.get_long()), Some(long), "{sub} -{short}");
    }
    cmd
}

/// The check a binary's `main` runs before clap parses the line: when a rule of `table`
/// refuses this process's arguments, prints `program: message` to stderr and returns the exit
/// code (2, usage) to end with.
pub fn refuse_renamed(program: &str, table: &[Renamed]) -> Option<ExitCode> {
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let rule = deprecated(&argv, table)?;
    // Not eprintln!: it panics if stderr is gone.
    let _ = writeln!(io::stderr(), "{program}: {}", rule.message);
    Some(ExitCode::from(exit::USAGE))
}

/// For the binaries' tests: every rule of `table` names a flag its subcommands have
/// ([`stale_rules`]); each `(line, says)` of `refused` is refused with a message containing
/// `says`; each line of `accepted` passes the table and clap. Lines are split at spaces.
pub fn check_renamed(
    cmd: &clap::Command,
    table: &[Renamed],
    refused: &[(&str, &str)],
    accepted: &[&str],
) {
    assert_eq!(stale_rules(cmd, table), Vec::<String>::new());
    let refusal = |line: &str| {
        let argv: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        deprecated(&argv, table).map(|r| r.message)
    };
    for (line, says) in refused {
        assert_eq!(
            refusal(line).map(|m| m.contains(says)),
            Some(true),
            "{line}"
        );
    }
    for line in accepted {
        assert_eq!(refusal(line), None, "{line}");
        if let Err(e) = cmd.clone().try_get_matches_from(line.split_whitespace()) {
            panic!("{line}: {e}");
        }
    }
}

/// For the binaries' tests: `help` lists every exit code of [`exit::ALL`] at the start of a
/// line, and the signal codes.
pub fn check_exit_codes_help(help: &str) {
    for (code, name) in exit::ALL {
        assert!(
            help.lines().any(|l| l.starts_with(&format!("  {code} "))),
            "{name} ({code}) is not in --help:\n{help}"
        );
    }
    assert!(help.contains("128+N  stopped by signal N"), "{help}");
}

/// Every flag of `cmd` and its subcommands (recursively, global flags included) whose short
/// letter names different long flags in different subcommands, or whose long name has
/// different short letters (or one here and none there); one line per clash, e.g.
/// `-d: --duration (softirqs), --device (run)`. Empty: one meaning per flag.
pub fn short_flag_clashes(cmd: &clap::Command) -> Vec<String> {
    let mut cmd = cmd.clone();
    cmd.build();
    // short → long → where; long → short (or none) → where.
    let mut by_short: BTreeMap<char, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut by_long: BTreeMap<String, BTreeMap<Option<char>, Vec<String>>> = BTreeMap::new();
    collect(&cmd, cmd.get_name(), &mut by_short, &mut by_long);
    let list = |m: Vec<(String, Vec<String>)>| {
        m.into_iter()
            .map(|(what, at)| format!("{what} ({})", at.join(", ")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut clashes = Vec::new();
    for (short, longs) in by_short {
        if longs.len() > 1 {
            clashes.push(format!("-{short}: {}", list(longs.into_iter().collect())));
        }
    }
    for (long, shorts) in by_long {
        if shorts.len() > 1 {
            let m = shorts
                .into_iter()
                .map(|(s, at)| (s.map_or("no short".to_owned(), |c| format!("-{c}")), at))
                .collect();
            clashes.push(format!("--{long}: {}", list(m)));
        }
    }
    clashes
}

type ByShort = BTreeMap<char, BTreeMap<String, Vec<String>>>;
type ByLong = BTreeMap<String, BTreeMap<Option<char>, Vec<String>>>;

fn collect(cmd: &clap::Command, path: &str, by_short: &mut ByShort, by_long: &mut ByLong) {
    for arg in cmd.get_arguments().filter(|a| !a.is_positional()) {
        let long = arg
            .get_long()
            .map_or_else(|| arg.get_id().to_string(), str::to_owned);
        if let Some(short) = arg.get_short() {
            by_short
                .entry(short)
                .or_default()
                .entry(format!("--{long}"))
                .or_default()
                .push(path.to_owned());
        }
        if arg.get_long().is_some() {
            by_long
                .entry(long)
                .or_default()
                .entry(arg.get_short())
                .or_default()
                .push(path.to_owned());
        }
    }
    for sub in cmd.get_subcommands() {
        let mut sub = sub.clone();
        sub.build();
        collect(
            &sub,
            &format!("{path} {}", sub.get_name()),
            by_short,
            by_long,
        );
    }
}

/// The rules of `table` whose `new` flag a listed subcommand lacks, or whose subcommand does
/// not exist: for the binaries' tests (`rule: why`).
pub fn stale_rules(cmd: &clap::Command, table: &[Renamed]) -> Vec<String> {
    let mut cmd = cmd.clone();
    cmd.build();
    let mut stale = Vec::new();
    for rule in table {
        for name in rule.subcommands {
            let Some(sub) = cmd.find_subcommand(name) else {
                stale.push(format!("{} in {name}: no such subcommand", rule.old));
                continue;
            };
            let new = rule.new.trim_start_matches('-');
            if !sub.get_arguments().any(|a| a.get_long() == Some(new)) {
                stale.push(format!(
                    "{} in {name}: {name} has no {}",
                    rule.old, rule.new
                ));
            }
        }
    }
    stale
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[Renamed] = &[
        Renamed {
            subcommands: &["pingpong"],
            old: "-s",
            new: "--size",
            when: When::NotANumber,
            message: "-s is now --size",
        },
        Renamed {
            subcommands: &["pingpong"],
            old: "-i",
            new: "--iterations",
            when: When::NotIn(1, 255),
            message: "-i is now -n",
        },
        Renamed {
            subcommands: &["probes"],
            old: "--json",
            new: "--json",
            when: When::NoValue,
            message: "--json takes a path",
        },
        Renamed {
            subcommands: &["softirqs"],
            old: "-d",
            new: "--duration",
            when: When::Always,
            message: "-d is now --duration",
        },
    ];

    fn check(line: &str) -> Option<&'static str> {
        let args: Vec<String> = line.split(' ').map(str::to_owned).collect();
        deprecated(&args, TABLE).map(|r| r.message)
    }

    #[test]
    fn old_uses_are_refused_and_new_ones_pass() {
        for old in [
            "p pingpong -s",
            "p pingpong -s -d rxe0",
            "p pingpong -d rxe0 -s 10.9.0.1",
            "p pingpong -sx",
            "p pingpong -i 1000",
            "p pingpong -i1000",
            "p pingpong -i 0",
            "p pingpong -i",
            "p probes --json",
            "p probes --json --check",
            "p -v softirqs -d 5",
            "p softirqs -d5",
        ] {
            assert!(check(old).is_some(), "{old}");
        }
        for new in [
            "p pingpong -s 64",
            "p pingpong -s64",
            "p pingpong -i 1",
            "p pingpong -i 255",
            "p probes --json -",
            "p probes --json out.json",
            "p probes --json=out.json",
            "p softirqs --duration 5",
            // Other subcommands, and what follows `--`, are not ours.
            "p run -d rxe0",
            "p pingpong --size 64 -- -s",
            "p softirqs -- -d 5",
            "p",
        ] {
            assert_eq!(check(new), None, "{new}");
        }
    }

    #[test]
    fn a_short_flag_with_two_meanings_is_found() {
        use clap::{Arg, ArgAction, Command};
        let flag = |id: &'static str, short: char| {
            Arg::new(id)
                .long(id)
                .short(short)
                .action(ArgAction::SetTrue)
        };
        let good = Command::new("t")
            .subcommand(Command::new("a").arg(flag("device", 'd')))
            .subcommand(Command::new("b").arg(flag("device", 'd')));
        assert_eq!(short_flag_clashes(&good), Vec::<String>::new());
        let bad = Command::new("t")
            .subcommand(Command::new("a").arg(flag("duration", 'd')))
            .subcommand(Command::new("b").arg(flag("device", 'd')))
            .subcommand(
                Command::new("c").arg(Arg::new("device").long("device").action(ArgAction::SetTrue)),
            );
        assert_eq!(
            short_flag_clashes(&bad),
            [
                "-d: --device (t b), --duration (t a)",
                "--device: no short (t c), -d (t b)"
            ]
        );
    }
}
