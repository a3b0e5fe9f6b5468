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

#[test]
fn docs_cli_names_every_subcommand_and_flag_of_the_binary() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md"))
        .expect("docs/cli.md");
    let mut missing = Vec::new();
    for (path, flags) in commands() {
        // `canaryd rollout start` is written so, or as `rollout start` in a table row.
        let words = path.trim_start_matches("canaryd ").to_owned();
        if path != "canaryd" && !page.contains(&format!("canaryd {words}")) {
            // A group written with its members (`canaryd release watch|show ID`).
            let (group, last) = words.rsplit_once(' ').unwrap_or(("", words.as_str()));
            let grouped = page.lines().any(|l| {
                l.contains(&format!("canaryd {group}"))
                    && l.split(['`', ' ', '|', '\\']).any(|w| w == last)
            });
            if !grouped {
                missing.push(format!("command `{path}`"));
            }
        }
        for flag in flags {
            if !page.contains(&flag) {
                missing.push(format!("`{flag}` of `{path}`"));
            }
        }
    }
    assert!(missing.is_empty(), "docs/cli.md lacks: {missing:#?}");
}
