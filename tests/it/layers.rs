//! Imports point one way (ARCHITECTURE.md, "Layers"): a module of `src/` may name `crate::x`
//! only when `x` is in its own folder or a lower layer, and no two folders import each other,
//! directly or around a loop. Inside every folder (the simulator's crate, `sim/src/`, too),
//! no two files import each other either.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layer of each top-level module of `src/`, from the inside out. The simulated host is a
/// crate of its own (`sim/`), which cargo keeps from naming the product.
const LAYERS: &[(&str, u8)] = &[
    ("domain", 0),
    ("config", 1),
    ("compose", 1),
    ("probe", 1),
    ("store", 1),
    ("telemetry", 1),
    ("engine", 2),
    ("api", 2),
    ("http", 3),
    ("doctor", 3),
    ("notify", 3),
    ("metrics", 3),
    ("cli", 4),
    ("app", 4),
    ("testing", 4),
];

/// Imports that break the rule on purpose, until the files they are in can be edited: each is
/// (file, the module it names, why). ARCHITECTURE.md lists them. An entry that no longer
/// occurs fails the test, so the list only shrinks.
const PENDING: &[(&str, &str, &str)] = &[];

/// Imports the layers would allow but the design does not: (from, to, why).
const FORBIDDEN: &[(&str, &str, &str)] = &[(
    "cli",
    "http",
    "the CLI reads the API's wire types from `api`, never the server's code",
)];

fn layer(module: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, l)| *l)
        .unwrap_or_else(|| panic!("module `{module}` has no layer: add it to LAYERS"))
}

/// One `crate::<module>` named in a file, at a line.
struct Import {
    file: String,
    line: usize,
    from: String,
    to: String,
}

impl std::fmt::Display for Import {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: {} imports crate::{}",
            self.file, self.line, self.from, self.to
        )
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable folder") {
        let path = entry.expect("readable entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for the crate roots).
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().nth(1)?.as_os_str().to_string_lossy();
    let name = first.trim_end_matches(".rs");
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// The modules named after `crate::` in one line of code (comments skipped), including the
/// first segment of each item of a grouped `crate::{a::X, b::Y}` written on one line.
fn named_modules(line: &str) -> Vec<String> {
    let code = line.trim_start();
    if code.starts_with("//") {
        return Vec::new();
    }
    let code = code.split(" // ").next().unwrap_or(code);
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `mycrate::`, not `crate::`
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            out.extend(group.split(',').map(|item| ident(item.trim())));
        } else {
            out.push(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty() && m != "self");
    out
}

fn imports(root: &Path) -> Vec<Import> {
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let rel = path.strip_prefix(root).expect("under the root");
        let Some(from) = module_of(rel) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).expect("readable source");
        for (n, line) in text.lines().enumerate() {
            for to in named_modules(line) {
                if to != from {
                    out.push(Import {
                        file: rel.display().to_string(),
                        line: n + 1,
                        from: from.clone(),
                        to,
                    });
                }
            }
        }
    }
    out
}

fn is_pending(i: &Import) -> bool {
    PENDING
        .iter()
        .any(|(file, to, _)| i.file == *file && i.to == *to)
}

/// Why an import breaks the layering, if it does.
fn violation(i: &Import) -> Option<String> {
    if let Some((_, _, why)) = FORBIDDEN
        .iter()
        .find(|(from, to, _)| i.from == *from && i.to == *to)
    {
        return Some(format!("{i} ({why})"));
    }
    let (from, to) = (layer(&i.from), layer(&i.to));
    (to > from).then(|| format!("{i} (layer {from} names layer {to})"))
}

/// A loop of folders importing each other, as one import per edge.
fn find_cycle<'a>(edges: &BTreeMap<(&'a str, &'a str), &'a Import>) -> Option<Vec<&'a Import>> {
    let nodes: BTreeSet<&str> = edges.keys().flat_map(|(a, b)| [*a, *b]).collect();
    fn visit<'a>(
        node: &'a str,
        edges: &BTreeMap<(&'a str, &'a str), &'a Import>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node);
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node);
        for (_, to) in edges.keys().filter(|(from, _)| *from == node) {
            if let Some(cycle) = visit(to, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node);
        None
    }
    let mut done = BTreeSet::new();
    for node in nodes {
        if let Some(cycle) = visit(node, edges, &mut Vec::new(), &mut done) {
            return Some(cycle.windows(2).map(|w| edges[&(w[0], w[1])]).collect());
        }
    }
    None
}

#[test]
fn no_module_imports_a_higher_layer_and_no_folders_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let all = imports(root);

    let wrong: Vec<String> = all
        .iter()
        .filter(|i| !is_pending(i))
        .filter_map(violation)
        .collect();
    assert!(
        wrong.is_empty(),
        "imports against the layers (ARCHITECTURE.md, \"Layers\"):\n{}",
        wrong.join("\n")
    );

    let mut edges = BTreeMap::new();
    for i in all.iter().filter(|i| !is_pending(i)) {
        edges.entry((i.from.as_str(), i.to.as_str())).or_insert(i);
    }
    if let Some(cycle) = find_cycle(&edges) {
        let lines: Vec<String> = cycle.iter().map(|i| i.to_string()).collect();
        panic!("folders import each other:\n{}", lines.join("\n"));
    }

    for (file, to, why) in PENDING {
        assert!(
            all.iter().any(|i| i.file == *file && i.to == *to),
            "{file} no longer names crate::{to}: remove it from PENDING and ARCHITECTURE.md ({why})"
        );
    }
}

#[test]
fn the_import_reader_sees_plain_and_grouped_paths_and_skips_comments() {
    assert_eq!(
        named_modules("use crate::store::{AuditEvent, Store};"),
        ["store"]
    );
    assert_eq!(
        named_modules("    x: Option<&Arc<crate::metrics::Metrics>>, // crate::http"),
        ["metrics"]
    );
    assert_eq!(
        named_modules("use crate::{config::Role, engine::Engine};"),
        ["config", "engine"]
    );
    assert!(named_modules("//! the notifier (`crate::notify`)").is_empty());
    assert!(named_modules("use mycrate::notify;").is_empty());
}

/// The sibling modules of `folder` (a path under `src/`, `""` for `src/` itself, which only
/// the simulator's crate checks: the product's top-level modules are the folders above) that
/// each of its files names (`super::x`, `super::super::x` from a subfolder,
/// `crate::<folder>::x`, grouped paths too, comments skipped), as imports from the file's
/// module to the sibling. `lib.rs` and `main.rs` are roots every file may name (`mod.rs` too,
/// which `no_module_is_a_mod_rs` keeps out).
fn file_imports(root: &Path, folder: &str) -> Vec<Import> {
    let dir = root.join("src").join(folder);
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    files.sort();
    let module = |path: &Path| -> String {
        let rel = path.strip_prefix(&dir).expect("under the folder");
        let first = rel.components().next().expect("a file");
        first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned()
    };
    let is_root = |m: &str| matches!(m, "mod" | "lib" | "main");
    let siblings: BTreeSet<String> = files
        .iter()
        .map(|f| module(f))
        .filter(|m| !is_root(m))
        .collect();
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let in_crate = match folder {
        "" => "crate::".to_owned(),
        _ => format!("crate::{}::", folder.replace('/', "::")),
    };
    let mut out = Vec::new();
    for path in &files {
        let from = module(path);
        if is_root(&from) {
            continue;
        }
        let depth = path.strip_prefix(&dir).expect("under").components().count();
        let prefixes = ["super::".repeat(depth), in_crate.clone()];
        let text = std::fs::read_to_string(path).expect("readable source");
        let code: Vec<&str> = text
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("//") {
                    ""
                } else {
                    l
                }
            })
            .collect();
        let code = code.join("\n");
        for prefix in &prefixes {
            for (at, _) in code.match_indices(prefix.as_str()) {
                let before = code[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue; // `mycrate::`, or the tail of a longer `super::super::`
                }
                let rest = &code[at + prefix.len()..];
                let named: Vec<String> = match rest.strip_prefix('{') {
                    Some(group) => group[..group.find('}').unwrap_or(group.len())]
                        .split(',')
                        .map(ident)
                        .collect(),
                    None => vec![ident(rest)],
                };
                for to in named {
                    if to != from && siblings.contains(&to) {
                        let line = code[..at].matches('\n').count() + 1;
                        out.push(Import {
                            file: path
                                .strip_prefix(root)
                                .expect("under")
                                .display()
                                .to_string(),
                            line,
                            from: from.clone(),
                            to,
                        });
                    }
                }
            }
        }
    }
    out
}

/// Every folder under `src/` of the crate at `root` (as paths relative to `src/`), `src/`
/// itself included when `with_src`.
fn folders(root: &Path, with_src: bool) -> Vec<String> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("readable folder")
            .map(|e| e.expect("readable entry").path())
            .filter(|p| p.is_dir())
            .collect();
        entries.sort();
        for path in entries {
            let name = path
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .to_string();
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            out.push(rel.clone());
            walk(&path, &rel, out);
        }
    }
    let mut out = if with_src {
        vec![String::new()]
    } else {
        Vec::new()
    };
    walk(&root.join("src"), "", &mut out);
    out
}

#[test]
fn no_two_files_of_a_folder_import_each_other_directly_or_in_a_circle() {
    let product = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sim = product.join("sim");
    let crates = [
        (product, folders(product, false)),
        (sim.as_path(), folders(&sim, true)),
    ];
    let mut circles = Vec::new();
    for (root, folders) in &crates {
        for folder in folders {
            let all = file_imports(root, folder);
            let mut edges = BTreeMap::new();
            for i in &all {
                edges.entry((i.from.as_str(), i.to.as_str())).or_insert(i);
            }
            if let Some(cycle) = find_cycle(&edges) {
                let lines: Vec<String> = cycle.iter().map(|i| format!("  {i}")).collect();
                circles.push(format!(
                    "{}/src/{folder}:\n{}",
                    root.display(),
                    lines.join("\n")
                ));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files of a folder import each other:\n{}",
        circles.join("\n")
    );
    let engine = file_imports(product, "engine");
    assert!(!engine.is_empty(), "the reader found no import in engine/");
}

#[test]
fn the_file_import_reader_sees_super_and_crate_paths_and_finds_a_loop() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("src/f");
    std::fs::create_dir_all(src.join("a")).expect("mkdir");
    let write = |rel: &str, text: &str| std::fs::write(src.join(rel), text).expect("write");
    write("mod.rs", "mod a;\nmod b;\nmod c;\n");
    write(
        "a.rs",
        "use super::{\n    b::X,\n    Engine,\n};\n// super::c::Y\n",
    );
    write("a/tests.rs", "use super::super::c::Y;\n");
    write("b.rs", "use crate::f::c::Z;\n");
    write("c.rs", "fn f() { super::a::g() }\n");
    let all = file_imports(dir.path(), "f");
    let mut edges: Vec<(&str, &str)> = all
        .iter()
        .map(|i| (i.from.as_str(), i.to.as_str()))
        .collect();
    edges.sort_unstable();
    assert_eq!(edges, [("a", "b"), ("a", "c"), ("b", "c"), ("c", "a")]);
    let mut map = BTreeMap::new();
    for i in &all {
        map.entry((i.from.as_str(), i.to.as_str())).or_insert(i);
    }
    assert!(find_cycle(&map).is_some(), "a -> c -> a");
}

/// One module style: a module with children is `x.rs` beside its folder `x/`, never
/// `x/mod.rs`, in the product, the simulator and the benches.
#[test]
fn no_module_is_a_mod_rs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "sim/src", "benches"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "the reader found {} files", files.len());
    let mod_rs: Vec<String> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n == "mod.rs"))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        mod_rs.is_empty(),
        "write these as `x.rs` beside `x/`: {mod_rs:?}"
    );
}
