//! Script agents' installations: a profile `command = "node"`, `args =
//! ["/opt/agents/x/dist/index.js"]` runs `node`'s installation *and* the
//! script's, which is a package of its own. A box grants the command's
//! installation ([`super::installation_of`]); this finds the scripts'.
//!
//! Only where the command is an interpreter ([`is_interpreter`]: node,
//! python, ruby, perl, a shell, … by the program's name) do its arguments
//! count, and of those only the absolute paths of existing regular files
//! (`--require=/x/hook.js` counts as `/x/hook.js`): for any other program an
//! argument naming a file is data the operator chose to give it, not code,
//! and guessing what else it needs would grant too much; the operator says
//! it with `read_only_paths`. Each such file's installation
//! ([`package_root`]) is granted read-only, never `/` and never one that
//! holds the gateway's state or lies within it.

use std::path::{Component, Path, PathBuf};

/// Programs that run a script named among their arguments (compared with a
/// program's file name, its version digits left off: `python3.12` is
/// `python`).
pub const INTERPRETERS: &[&str] = &[
    "node", "nodejs", "deno", "bun", "tsx", "ts-node", "python", "pypy", "ruby", "perl", "php",
    "lua", "luajit", "java", "sh", "bash", "dash", "zsh", "Rscript",
];

/// Whether `program` (as named, or as its symlinks resolve) is an
/// interpreter of scripts.
pub fn is_interpreter(program: &Path) -> bool {
    let named = |path: &Path| {
        path.file_name()
            .and_then(|name| name.to_str())
            .map(|name| name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.'))
            .is_some_and(|name| INTERPRETERS.contains(&name))
    };
    named(program) || std::fs::canonicalize(program).is_ok_and(|real| named(&real))
}

/// The installations of the scripts `program` is given in `args` (none
/// where it is no interpreter), except any that holds or lies within one of
/// `keep_out` (the gateway's state).
pub fn installations(program: &Path, args: &[String], keep_out: &[&Path]) -> Vec<PathBuf> {
    if !is_interpreter(program) {
        return Vec::new();
    }
    let mut found: Vec<PathBuf> = Vec::new();
    for arg in args {
        // `--flag=/path`: the path.
        let named = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with('-') => value,
            _ => arg.as_str(),
        };
        let file = Path::new(named);
        if !file.is_absolute() || !std::fs::metadata(file).is_ok_and(|m| m.is_file()) {
            continue;
        }
        // A symlinked script (`node_modules/.bin/x`) counts at both ends.
        let mut roots = vec![package_root(file)];
        if let Ok(real) = std::fs::canonicalize(file) {
            roots.push(package_root(&real));
        }
        for root in roots {
            let touches_state = keep_out
                .iter()
                .any(|state| state.starts_with(&root) || root.starts_with(state));
            if root != Path::new("/") && !touches_state && !found.contains(&root) {
                found.push(root);
            }
        }
    }
    found
}

/// Where the script `file` is installed: the outermost `node_modules` on
/// its path (a dependency of a project, its own dependencies hoisted
/// beside it), else the prefix of the `site-packages` (or
/// `dist-packages`) it is in (a virtualenv's root), else the nearest
/// directory above it holding `package.json` and `node_modules` (an npm
/// package) or `pyvenv.cfg` (a virtualenv), else its own directory.
pub fn package_root(file: &Path) -> PathBuf {
    let dir = file.parent().unwrap_or(Path::new("/"));
    let parts: Vec<Component<'_>> = dir.components().collect();
    let prefix = |n: usize| parts[..n].iter().collect::<PathBuf>();
    if let Some(at) = parts.iter().position(|c| c.as_os_str() == "node_modules") {
        return prefix(at + 1);
    }
    let packages = parts
        .iter()
        .position(|c| c.as_os_str() == "site-packages" || c.as_os_str() == "dist-packages");
    if let Some(at) = packages {
        // `<root>/lib/python3.12/site-packages`: the root.
        let versioned = at >= 2
            && parts[at - 1]
                .as_os_str()
                .to_str()
                .is_some_and(|v| v.starts_with("python"))
            && parts[at - 2]
                .as_os_str()
                .to_str()
                .is_some_and(|lib| lib.starts_with("lib"));
        return prefix(if versioned { at - 2 } else { at });
    }
    for above in dir.ancestors().filter(|d| *d != Path::new("/")) {
        let npm = above.join("package.json").is_file() && above.join("node_modules").is_dir();
        if npm || above.join("pyvenv.cfg").is_file() {
            return above.to_path_buf();
        }
    }
    dir.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "").unwrap();
    }

    #[test]
    fn interpreters_are_known_by_name_whatever_their_version() {
        for name in [
            "node",
            "python3",
            "python3.12",
            "/usr/bin/python",
            "bash",
            "ruby3.2",
        ] {
            assert!(is_interpreter(Path::new(name)), "{name}");
        }
        for name in ["/opt/agent/bin/agent", "claude", "gemini", "nodemon"] {
            assert!(!is_interpreter(Path::new(name)), "{name}");
        }
    }

    #[test]
    fn a_scripts_installation_is_its_package_or_its_virtualenv_or_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        // An npm package: its script deep in dist/.
        let npm = base.join("agents/claude");
        touch(&npm.join("package.json"));
        std::fs::create_dir_all(npm.join("node_modules/zod")).unwrap();
        touch(&npm.join("dist/cli/index.js"));
        // One with a package.json of its own in dist (`"type": "module"`).
        touch(&npm.join("dist/package.json"));
        assert_eq!(package_root(&npm.join("dist/cli/index.js")), npm);
        // A dependency of a project: the project's node_modules.
        let dep = base.join("app/node_modules/@zed/acp/dist/index.js");
        touch(&dep);
        assert_eq!(package_root(&dep), base.join("app/node_modules"));
        // A virtualenv: a script in it, a module in its site-packages.
        let venv = base.join("venvs/agent");
        touch(&venv.join("pyvenv.cfg"));
        touch(&venv.join("bin/agent"));
        assert_eq!(package_root(&venv.join("bin/agent")), venv);
        let module = venv.join("lib/python3.12/site-packages/agent/__main__.py");
        touch(&module);
        assert_eq!(package_root(&module), venv);
        // A lone script: its directory.
        let lone = base.join("scripts/agent.py");
        touch(&lone);
        assert_eq!(package_root(&lone), base.join("scripts"));
    }

    #[test]
    fn only_an_interpreters_existing_absolute_files_count_and_never_the_gateways_state() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let (script, hook) = (base.join("x/dist/index.js"), base.join("hooks/hook.js"));
        touch(&script);
        touch(&hook);
        let state = base.join("state");
        touch(&state.join("gateway.db"));
        let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let given = args(&[
            "--experimental",
            &format!("--require={}", hook.display()),
            script.to_str().unwrap(),
            "relative.js",
            "/nonexistent/agent.js",
            base.to_str().unwrap(),
            state.join("gateway.db").to_str().unwrap(),
        ]);
        assert_eq!(
            installations(Path::new("node"), &given, &[state.as_path()]),
            [base.join("hooks"), base.join("x/dist")]
        );
        // Not an interpreter: its arguments are its own business.
        assert!(installations(Path::new("/opt/agent/bin/agent"), &given, &[]).is_empty());
        // Never the whole file system, nor a directory holding the state.
        touch(&base.join("top.js"));
        let top = args(&[base.join("top.js").to_str().unwrap()]);
        assert!(installations(Path::new("python3"), &top, &[state.as_path()]).is_empty());
        assert!(
            !installations(Path::new("sh"), &args(&["/init"]), &[]).contains(&PathBuf::from("/"))
        );
    }
}
