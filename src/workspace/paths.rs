//! Where a path an agent names really is, and whether that is inside.

use std::path::{Component, Path, PathBuf};

/// `path` resolved as the kernel would reach it (`..` taken, symlinks of its
/// existing part followed; the rest, which does not exist yet, appended),
/// provided it is absolute and lands inside `cwd` and, when there are any,
/// inside one of `roots`. The error says why not.
pub fn resolve_inside(path: &Path, cwd: &Path, roots: &[PathBuf]) -> Result<PathBuf, String> {
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    let real = resolve(path)?;
    let within = |root: &Path| {
        std::fs::canonicalize(root)
            .map(|root| real.starts_with(root))
            .unwrap_or(false)
    };
    if !within(cwd) {
        return Err(format!(
            "{} resolves to {}, outside the conversation's directory {}",
            path.display(),
            real.display(),
            cwd.display()
        ));
    }
    if !roots.is_empty() && !roots.iter().any(|root| within(root)) {
        return Err(format!(
            "{} resolves to {}, outside the agent's allowed_roots",
            path.display(),
            real.display()
        ));
    }
    Ok(real)
}

/// The real place of each of `paths` (absolute): symlinks of its existing
/// part resolved, the rest appended; one that cannot be looked at is kept
/// as given. For the policies, which judge a tool call's paths both as
/// given and as they really are.
pub fn real_paths(paths: &[PathBuf]) -> Vec<PathBuf> {
    paths
        .iter()
        .map(|path| resolve(path).unwrap_or_else(|_| path.clone()))
        .collect()
}

/// The real place of an absolute path, which need not exist.
pub fn resolve(path: &Path) -> Result<PathBuf, String> {
    resolve_following(path, 0)
}

fn resolve_following(path: &Path, links: usize) -> Result<PathBuf, String> {
    // Its longest existing ancestor is resolved by the kernel (symlinks,
    // `..` after a symlink); the part that does not exist cannot hold a
    // symlink, and its `..` are taken by hand. A dangling symlink leads
    // where it points: writing through it makes that.
    let mut existing = path.to_path_buf();
    let mut missing: Vec<std::ffi::OsString> = Vec::new();
    let mut base = loop {
        match std::fs::canonicalize(&existing) {
            Ok(real) => break real,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Ok(target) = std::fs::read_link(&existing) {
                    if links >= 40 {
                        return Err(format!("{}: too many symbolic links", path.display()));
                    }
                    let parent = existing.parent().unwrap_or(Path::new("/"));
                    break resolve_following(&parent.join(target), links + 1)?;
                }
                match existing.components().next_back() {
                    Some(Component::Normal(name)) => missing.push(name.to_owned()),
                    Some(Component::ParentDir) => missing.push("..".into()),
                    _ => return Err(format!("{}: {e}", path.display())),
                }
                existing.pop();
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    };
    for name in missing.iter().rev() {
        if name == ".." {
            base.pop();
        } else {
            base.push(name);
        }
    }
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_inside_pass_and_escapes_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(cwd.join("src")).unwrap();
        std::os::unix::fs::symlink("/etc", cwd.join("etc-link")).unwrap();
        std::os::unix::fs::symlink(cwd.join("src"), cwd.join("src-link")).unwrap();

        let ok = |p: PathBuf| resolve_inside(&p, &cwd, &[]).unwrap();
        assert_eq!(ok(cwd.join("src/a.rs")), cwd.join("src/a.rs"));
        assert_eq!(ok(cwd.join("new/dir/b.rs")), cwd.join("new/dir/b.rs"));
        assert_eq!(ok(cwd.join("src/../c.rs")), cwd.join("c.rs"));
        assert_eq!(ok(cwd.join("src-link/d.rs")), cwd.join("src/d.rs"));
        assert_eq!(ok(cwd.join("new/../e.rs")), cwd.join("e.rs"));

        let refused = |p: PathBuf| resolve_inside(&p, &cwd, &[]).unwrap_err();
        assert!(refused(cwd.join("../x")).contains("outside the conversation's directory"));
        assert!(refused(cwd.join("etc-link/passwd")).contains("resolves to /etc/passwd"));
        assert!(refused(cwd.join("new/../../y")).contains("outside"));
        assert!(refused(PathBuf::from("relative.txt")).contains("not an absolute path"));

        // A dangling link leads where it points.
        std::os::unix::fs::symlink("src/later.rs", cwd.join("dangling")).unwrap();
        assert_eq!(ok(cwd.join("dangling")), cwd.join("src/later.rs"));
        std::os::unix::fs::symlink("/etc/nothing-here", cwd.join("dangling-out")).unwrap();
        assert!(refused(cwd.join("dangling-out")).contains("/etc/nothing-here"));

        let root = cwd.join("src");
        assert!(resolve_inside(&cwd.join("src/f"), &cwd, std::slice::from_ref(&root)).is_ok());
        let outside = resolve_inside(&cwd.join("g"), &cwd, &[root]).unwrap_err();
        assert!(outside.contains("allowed_roots"), "{outside}");
    }
}
