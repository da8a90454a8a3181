//! The layout of `src/` keeps one direction. Every module's children are
//! floors, in the order its file declares them (`src/lib.rs`'s `pub mod`
//! list for the crate, a `mod.rs` or `name.rs` for a folder), the top floor
//! first: a file may import what a later sibling of its own (or of an
//! ancestor's) holds, never what an earlier one holds. And no file imports,
//! directly or through others, a file that imports it back, counting a
//! folder as one (so a module's own file and its children form no loop
//! either). This test reads every library file's paths (`crate::…`,
//! `super::…`, `self::…`, and a parent's paths into its child modules),
//! resolves each to the file that defines the module it names, and fails
//! with the import that runs back up, or the loop.
//!
//! Comments are not read (a doc link is no dependency); a module's `mod`
//! declaration of its children is not an import, but a parent's `use` of a
//! child is. Test modules (`#[cfg(test)] mod …`) are no floors: only the
//! loop checks read them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A library file and the module path it defines (`src/session/task.rs` →
/// `["session", "task"]`; `src/lib.rs` → `[]`).
struct File {
    path: String,
    module: Vec<String>,
    source: String,
}

fn library_files() -> Vec<File> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    collect(&src, &mut paths);
    paths
        .into_iter()
        .filter_map(|path| {
            let relative = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            // The binaries reach the library only through its public paths.
            if relative == "main.rs" || relative.starts_with("bin/") {
                return None;
            }
            let mut module: Vec<String> = relative
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_owned)
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            let source = std::fs::read_to_string(&path).unwrap();
            Some(File {
                path: format!("src/{relative}"),
                module,
                source: without_comments(&source),
            })
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source with `//` comments blanked (string literals are kept whole,
/// so a `//` inside one is not taken for a comment).
fn without_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let mut in_string = false;
        let mut escaped = false;
        let mut cut = line.len();
        let bytes = line.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if in_string => escaped = true,
                b'"' => in_string = !in_string,
                b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => {
                    cut = i;
                    break;
                }
                _ => {}
            }
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

/// Every path the source names that starts at `crate`, `super`, `self` or
/// a child module, with `use` trees expanded (`use crate::a::{b, c::d}` →
/// `crate::a::b`, `crate::a::c::d`), each made absolute: inside an inline
/// `mod tests { … }`, `super` is the file's own module.
fn named_modules(source: &str, module: &[String], children: &[String]) -> Vec<Vec<String>> {
    let tokens = tokenize(source);
    let mut paths = Vec::new();
    // Inline modules we are in, with the brace depth each opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < tokens.len() {
        let here: Vec<String> = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(name, _)| name.clone()))
            .collect();
        match tokens[i].as_str() {
            "mod" if tokens.get(i + 2).map(String::as_str) == Some("{") => {
                inline.push((tokens[i + 1].clone(), depth));
                depth += 1;
                i += 3;
                continue;
            }
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if inline.last().is_some_and(|(_, at)| *at == depth) {
                    inline.pop();
                }
            }
            _ => {}
        }
        let starts = matches!(tokens[i].as_str(), "crate" | "super" | "self")
            || (inline.is_empty() && children.contains(&tokens[i]));
        let after_path_sep = i > 0 && tokens[i - 1] == "::";
        if starts && !after_path_sep && tokens.get(i + 1).map(String::as_str) == Some("::") {
            let (found, next) = path_tree(&tokens, i, Vec::new());
            paths.extend(found.iter().map(|p| absolute(p, &here)));
            i = next;
        } else {
            i += 1;
        }
    }
    paths
}

/// Identifiers, `::`, braces and commas; string and character literals
/// and everything else become `;`.
fn tokenize(source: &str) -> Vec<String> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let ident: String = chars[start..i].iter().collect();
            if matches!(ident.as_str(), "r" | "br") && matches!(chars.get(i), Some('#' | '"')) {
                // A raw string: r#"…"#, ended by a quote and as many hashes.
                let hashes = chars[i..].iter().take_while(|c| **c == '#').count();
                i += hashes + 1;
                while i < chars.len()
                    && !(chars[i] == '"'
                        && chars[i + 1..]
                            .iter()
                            .take(hashes)
                            .filter(|c| **c == '#')
                            .count()
                            == hashes)
                {
                    i += 1;
                }
                i += 1 + hashes;
                tokens.push(";".into());
            } else {
                tokens.push(ident);
            }
            continue;
        }
        match c {
            ':' if chars.get(i + 1) == Some(&':') => {
                tokens.push("::".into());
                i += 2;
                continue;
            }
            '{' | '}' | ',' => tokens.push(c.to_string()),
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                tokens.push(";".into());
            }
            // A character literal ('x', '\n', '\''); else a lifetime's tick.
            '\'' if chars.get(i + 1) == Some(&'\\') => {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                tokens.push(";".into());
            }
            '\'' if chars.get(i + 2) == Some(&'\'') => {
                i += 2;
                tokens.push(";".into());
            }
            _ if !c.is_whitespace() => tokens.push(";".into()),
            _ => {}
        }
        i += 1;
    }
    tokens
}

/// Reads a path (and any brace tree after it) from `tokens[at]`; returns
/// the paths and the index after them.
fn path_tree(tokens: &[String], mut at: usize, prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let mut path = prefix;
    loop {
        match tokens.get(at).map(String::as_str) {
            Some("{") => {
                let mut found = Vec::new();
                at += 1;
                while at < tokens.len() && tokens[at] != "}" {
                    if tokens[at] == "," {
                        at += 1;
                        continue;
                    }
                    let (inner, next) = path_tree(tokens, at, path.clone());
                    found.extend(inner);
                    at = next;
                }
                return (found, at + 1);
            }
            Some(t) if t != "::" && t != "}" && t != "," && t != ";" => {
                path.push(t.to_owned());
                at += 1;
                if tokens.get(at).map(String::as_str) == Some("::") {
                    at += 1;
                } else {
                    return (vec![path], at);
                }
            }
            _ => return (vec![path], at),
        }
    }
}

/// The module path a file's path names, absolute (`super` and `self`
/// resolved from `here`, children of `here` when it starts with one).
fn absolute(path: &[String], here: &[String]) -> Vec<String> {
    let mut out: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") | Some("super") => here.to_vec(),
        _ => {
            let mut out = here.to_vec();
            out.push(path[0].clone());
            return out.into_iter().chain(path[1..].iter().cloned()).collect();
        }
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        out.pop();
    }
    while rest.first().map(String::as_str) == Some("super") {
        out.pop();
        rest = &rest[1..];
    }
    out.extend(rest.iter().cloned());
    out
}

fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let files = library_files();
    let by_module: BTreeMap<Vec<String>, &File> =
        files.iter().map(|f| (f.module.clone(), f)).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let children: Vec<String> = by_module
            .keys()
            .filter(|m| m.len() == file.module.len() + 1 && m.starts_with(&file.module))
            .map(|m| m.last().unwrap().clone())
            .collect();
        let mut targets = BTreeSet::new();
        for mut module in named_modules(&file.source, &file.module, &children) {
            // The longest prefix that is a file of its own.
            while !by_module.contains_key(&module) {
                module.pop();
            }
            let target = &by_module[&module].path;
            if *target != file.path {
                targets.insert(target.clone());
            }
        }
        graph.insert(file.path.clone(), targets);
    }
    graph
}

/// A loop in the graph, if there is one (depth-first, colouring files).
fn find_loop(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, bool>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_owned(), true);
        stack.push(node.to_owned());
        for next in &graph[node] {
            match state.get(next) {
                Some(true) => {
                    let start = stack.iter().position(|n| n == next).unwrap();
                    let mut found = stack[start..].to_vec();
                    found.push(next.clone());
                    return Some(found);
                }
                Some(false) => {}
                None => {
                    if let Some(found) = visit(next, graph, state, stack) {
                        return Some(found);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_owned(), false);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node) {
            if let Some(found) = visit(node, graph, &mut state, &mut Vec::new()) {
                return Some(found);
            }
        }
    }
    None
}

/// Each module that has children: the file that declares them, and their
/// names in the order it declares them, the top floor first.
fn floors(files: &[File]) -> BTreeMap<Vec<String>, (String, Vec<String>)> {
    files
        .iter()
        .map(|f| {
            (
                f.module.clone(),
                (f.path.clone(), declared_children(&f.source)),
            )
        })
        .filter(|(_, (_, children))| !children.is_empty())
        .collect()
}

/// The modules a file declares at its top level (`mod name;`, `pub mod
/// name;`, `pub(crate) mod name;` …), in order; test modules (under
/// `#[cfg(test)]`) are left out.
fn declared_children(source: &str) -> Vec<String> {
    let mut children = Vec::new();
    let mut for_tests = false;
    for line in source.lines() {
        if line.starts_with("#[") {
            for_tests |= line.starts_with("#[cfg(test)]");
            continue;
        }
        let mut rest = line;
        if let Some(after) = rest.strip_prefix("pub") {
            rest = match after.strip_prefix('(') {
                Some(scoped) => scoped.split_once(')').map_or("", |(_, r)| r),
                None => after,
            }
            .trim_start();
        }
        if let Some(name) = rest.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            if !for_tests {
                children.push(name.trim().to_owned());
            }
        }
        if !line.trim().is_empty() {
            for_tests = false;
        }
    }
    children
}

/// The length of the module path two files share, and the modules below
/// it that hold each (`None`: the shared module's own file).
fn split_at_shared<'a>(
    a: &'a [String],
    b: &'a [String],
) -> (usize, Option<&'a String>, Option<&'a String>) {
    let shared = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    (shared, a.get(shared), b.get(shared))
}

/// Every import from a file to one that a sibling declared above its own
/// module holds (siblings of the file's or of an ancestor's): an import
/// that runs back up, with why.
fn imports_back_up(files: &[File], graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let module_of: BTreeMap<&str, &[String]> = files
        .iter()
        .map(|f| (f.path.as_str(), f.module.as_slice()))
        .collect();
    let floors = floors(files);
    let mut found = Vec::new();
    for (from, targets) in graph {
        for to in targets {
            let (shared, Some(here), Some(there)) =
                split_at_shared(module_of[from.as_str()], module_of[to.as_str()])
            else {
                // A module's own file and what lies beneath it: the loop
                // checks keep them one way.
                continue;
            };
            let Some((declared_in, order)) = floors.get(&module_of[from.as_str()][..shared]) else {
                continue;
            };
            let at = |name: &String| order.iter().position(|n| n == name);
            if let (Some(i), Some(j)) = (at(here), at(there)) {
                if i > j {
                    found.push(format!(
                        "{from} imports {to}, but {declared_in} declares `{there}` above `{here}`"
                    ));
                }
            }
        }
    }
    found
}

/// For each module with children, the imports between its own file and
/// its children, each child standing for every file beneath it (a folder
/// is one room): `src/acp/` holds `src/acp/mod.rs`, `src/acp/rpc/` (for
/// `rpc.rs` and `rpc/*`), `src/acp/chunk.rs` ….
fn folder_graphs(
    files: &[File],
    graph: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    let by_module: BTreeMap<&[String], &File> =
        files.iter().map(|f| (f.module.as_slice(), f)).collect();
    let module_of: BTreeMap<&str, &[String]> = files
        .iter()
        .map(|f| (f.path.as_str(), f.module.as_slice()))
        .collect();
    let has_children = |module: &[String]| {
        files
            .iter()
            .any(|f| f.module.len() == module.len() + 1 && f.module.starts_with(module))
    };
    let room = |module: &[String]| -> String {
        let path = &by_module[module].path;
        if !has_children(module) || module.is_empty() {
            return path.clone();
        }
        let dir = path
            .strip_suffix("/mod.rs")
            .or_else(|| path.strip_suffix(".rs"));
        format!("{}/", dir.unwrap_or(path))
    };
    let mut folders: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, targets) in graph {
        for to in targets {
            let (a, b) = (module_of[from.as_str()], module_of[to.as_str()]);
            let (shared, _, _) = split_at_shared(a, b);
            let parent = &a[..shared];
            let node = |m: &[String]| {
                if m.len() == shared {
                    by_module[m].path.clone()
                } else {
                    room(&m[..shared + 1])
                }
            };
            let folder = folders.entry(parent.to_vec()).or_default();
            folder.entry(node(b)).or_default();
            folder.entry(node(a)).or_default().insert(node(b));
        }
    }
    folders
}

#[test]
fn every_import_points_down_the_floors_its_modules_are_declared_in() {
    let files = library_files();
    let found = imports_back_up(&files, &import_graph());
    assert!(
        found.is_empty(),
        "imports that run back up ({}):\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn no_folder_imports_itself_through_others() {
    let files = library_files();
    for (module, folder) in folder_graphs(&files, &import_graph()) {
        if let Some(found) = find_loop(&folder) {
            panic!(
                "import loop inside `{}`: {}",
                module.join("::"),
                found.join(" -> ")
            );
        }
    }
}

#[test]
fn the_floors_are_read_from_the_declarations_and_an_import_up_is_found() {
    let files = library_files();
    let floors = floors(&files);
    let (declared_in, crate_floors) = &floors[&Vec::new()];
    assert_eq!(declared_in, "src/lib.rs");
    assert_eq!(*crate_floors, top_level_modules());
    assert_eq!(
        declared_children("pub mod a;\n#[cfg(test)]\nmod tests;\npub(crate) mod b;\nmod c {\n}\n"),
        ["a", "b"]
    );
    // An import from the bottom floor to the top one.
    let mut graph = import_graph();
    let top = files
        .iter()
        .find(|f| f.module.len() == 1 && f.module[0] == crate_floors[0])
        .unwrap();
    let bottom = files
        .iter()
        .find(|f| f.module.len() == 1 && f.module[0] == *crate_floors.last().unwrap())
        .unwrap();
    let before = imports_back_up(&files, &graph);
    graph
        .get_mut(&bottom.path)
        .unwrap()
        .insert(top.path.clone());
    let found: Vec<String> = imports_back_up(&files, &graph)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with(&format!("{} imports {}", bottom.path, top.path)));
    // A loop through a folder is one even when no file loops: `src/a/x.rs`
    // imports `src/b.rs`, which imports `src/a/y.rs`.
    let file = |path: &str, module: &[&str]| File {
        path: path.into(),
        module: module.iter().map(|m| m.to_string()).collect(),
        source: String::new(),
    };
    let files = [
        file("src/lib.rs", &[]),
        file("src/a/mod.rs", &["a"]),
        file("src/a/x.rs", &["a", "x"]),
        file("src/a/y.rs", &["a", "y"]),
        file("src/b.rs", &["b"]),
    ];
    let mut graph: BTreeMap<String, BTreeSet<String>> = files
        .iter()
        .map(|f| (f.path.clone(), BTreeSet::new()))
        .collect();
    graph
        .get_mut("src/a/x.rs")
        .unwrap()
        .insert("src/b.rs".into());
    graph
        .get_mut("src/b.rs")
        .unwrap()
        .insert("src/a/y.rs".into());
    assert!(find_loop(&graph).is_none());
    let folders = folder_graphs(&files, &graph);
    assert_eq!(
        find_loop(&folders[&Vec::new()]),
        Some(vec![
            "src/a/".to_owned(),
            "src/b.rs".to_owned(),
            "src/a/".to_owned()
        ])
    );
}

#[test]
fn no_file_of_src_imports_itself_through_others() {
    let graph = import_graph();
    if let Some(found) = find_loop(&graph) {
        panic!("import loop in src/: {}", found.join(" -> "));
    }
}

#[test]
fn the_import_reader_sees_the_arrows_that_make_the_layers() {
    let graph = import_graph();
    let has = |from: &str, to: &str| graph[from].contains(to);
    // Through `use` trees, `super::`, a parent's child modules and the
    // crate root's re-exports alike.
    assert!(has("src/api/mod.rs", "src/api/state.rs"));
    assert!(has("src/api/conversations.rs", "src/api/state.rs"));
    assert!(has("src/session/mod.rs", "src/session/task.rs"));
    assert!(has("src/session/task.rs", "src/session/journal.rs"));
    assert!(has("src/session/task.rs", "src/acp/client.rs"));
    assert!(has("src/permissions/policy.rs", "src/permissions/shell.rs"));
    assert!(has("src/lib.rs", "src/app.rs"));
    // And it finds a loop where there is one.
    let mut looped = graph.clone();
    looped
        .get_mut("src/model/mod.rs")
        .unwrap()
        .insert("src/session/task.rs".into());
    assert!(find_loop(&looped).is_some());
}

/// The crate's top-level modules, as `src/lib.rs` declares them
/// (`pub mod name;`).
pub(crate) fn top_level_modules() -> Vec<String> {
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|line| line.strip_prefix("pub mod ")?.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

/// `lib.rs`'s `//!` map names every top-level module (as a link), so a
/// newcomer finds each part from it.
#[test]
fn the_crate_map_names_every_module() {
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    let map: String = lib
        .lines()
        .filter(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let modules = top_level_modules();
    assert!(modules.len() > 20, "src/lib.rs declares {modules:?}");
    for name in modules {
        assert!(
            map.contains(&format!("[`{name}`]")),
            "src/lib.rs's map does not name `{name}`"
        );
    }
}
