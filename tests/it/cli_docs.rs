//! docs/cli.md names every subcommand and every flag that `canaryd --help` lists, read from the
//! CLI's own definition (clap), so the page cannot drift from the binary.

use clap::CommandFactory;

/// (command path, its long flags), for every command and subcommand.
fn commands() -> Vec<(String, Vec<String>)> {
    fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<(String, Vec<String>)>) {
        let flags = cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long())
            .filter(|l| !matches!(*l, "help" | "version"))
            .map(|l| format!("--{l}"))
            .collect();
        out.push((path.to_owned(), flags));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_name() == "help" {
                continue;
            }
            walk(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }
    let mut out = Vec::new();
    walk(&canaryd::cli::Cli::command(), "canaryd", &mut out);
    out
}

/// Flags documented once for many commands, in a sentence of their own.
const SHARED_FLAGS: &[&str] = &["--server", "--log-format"];

/// The lines of `page` that document `words` (`rollout start`): its table row
/// (`canaryd rollout start ...`), a group row (`canaryd release watch|show ID`) or its bullet
/// (`` `check plan FILE ...` ``).
fn lines_of<'p>(page: &'p str, words: &str) -> Vec<&'p str> {
    let (group, last) = words.rsplit_once(' ').unwrap_or(("", words));
    page.lines()
        .filter(|l| {
            l.contains(&format!("canaryd {words}"))
                || l.contains(&format!("`{words} "))
                || (!group.is_empty()
                    && l.contains(&format!("canaryd {group} "))
                    && l.split(['`', ' ', '|', '\\']).any(|w| w == last))
        })
        .collect()
}

#[test]
fn docs_cli_names_every_subcommand_and_each_of_its_flags_where_it_is_documented() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md"))
        .expect("docs/cli.md");
    let mut missing = Vec::new();
    for (path, flags) in commands() {
        if path == "canaryd" {
            continue;
        }
        let words = path.trim_start_matches("canaryd ").to_owned();
        let lines = lines_of(&page, &words);
        let is_group = commands()
            .iter()
            .any(|(p, _)| p.starts_with(&format!("{path} ")));
        if lines.is_empty() && !is_group {
            missing.push(format!("command `{path}`"));
            continue;
        }
        for flag in flags {
            let documented = if SHARED_FLAGS.contains(&flag.as_str()) {
                page.contains(&flag)
            } else {
                lines.iter().any(|l| {
                    l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                        .any(|w| w == flag)
                })
            };
            if !documented {
                missing.push(format!("`{flag}` of `{path}`"));
            }
        }
    }
    assert!(missing.is_empty(), "docs/cli.md lacks: {missing:#?}");
}
