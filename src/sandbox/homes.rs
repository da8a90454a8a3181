//! A home per gateway user and profile: `<state_dir>/homes/<user>/<profile>/`,
//! made on first use from the profile's `home_template` (credentials,
//! settings the operator put there once), and the agent's `HOME`,
//! `XDG_*_HOME` and `TMPDIR` (`<home>/.tmp`; also `CLAUDE_CODE_TMPDIR`,
//! where Claude Code looks instead). What an agent keeps (Claude
//! Code's `~/.claude`, Codex's `~/.codex`: transcripts, caches) so stays
//! with the user whose it is, inside that user's box.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::sys::SystemUser;

/// One (user, profile) home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    pub dir: PathBuf,
    /// Its private temporary directory (`TMPDIR`).
    pub tmp: PathBuf,
}

impl Home {
    /// The home at `dir` (nothing is made).
    pub fn at(dir: &Path) -> Home {
        Home {
            dir: dir.to_path_buf(),
            tmp: dir.join(".tmp"),
        }
    }

    /// The home of `user`'s conversations with `profile`, beneath `homes`.
    pub fn of(homes: &Path, user: Option<&str>, profile: &str) -> Home {
        Home::at(&homes.join(path_component(user)).join(profile))
    }

    /// The variables that point an agent there.
    pub fn variables(&self) -> Vec<(OsString, OsString)> {
        let at = |rel: &str| self.dir.join(rel).into_os_string();
        vec![
            ("HOME".into(), self.dir.clone().into_os_string()),
            ("XDG_CONFIG_HOME".into(), at(".config")),
            ("XDG_DATA_HOME".into(), at(".local/share")),
            ("XDG_STATE_HOME".into(), at(".local/state")),
            ("XDG_CACHE_HOME".into(), at(".cache")),
            ("TMPDIR".into(), self.tmp.clone().into_os_string()),
            // Claude Code's tools take their temporary directory from here,
            // not from TMPDIR (else /tmp, outside every box).
            (
                "CLAUDE_CODE_TMPDIR".into(),
                self.tmp.clone().into_os_string(),
            ),
        ]
    }

    /// Makes it where it is not yet (a copy of `template`, if any) and its
    /// `TMPDIR`, owned by `owner` when the gateway is root and the agent runs
    /// as another user; the directories above it only the gateway may list.
    /// Two conversations starting at once make it once: the copy is made
    /// aside and renamed into place.
    pub fn make(&self, template: Option<&Path>, owner: Option<&SystemUser>) -> io::Result<()> {
        let owner = owner.filter(|_| crate::sys::running_as_root());
        if !self.dir.exists() {
            let parent = self
                .dir
                .parent()
                .ok_or_else(|| io::Error::other("a home needs a parent directory"))?;
            // Traversable by the agents' users, listable by no one but us.
            for dir in [parent.parent(), Some(parent)].into_iter().flatten() {
                make_dir(dir, 0o711)?;
            }
            let aside = parent.join(format!(
                ".new-{}-{}",
                self.dir.file_name().unwrap_or_default().to_string_lossy(),
                uuid::Uuid::new_v4().simple()
            ));
            let made = (|| {
                std::fs::DirBuilder::new().mode(0o700).create(&aside)?;
                if let Some(template) = template {
                    copy_tree(template, &aside, owner)?;
                }
                chown(&aside, owner)?;
                std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o700))
            })();
            let placed = made.and_then(|()| std::fs::rename(&aside, &self.dir));
            if placed.is_err() {
                let _ = std::fs::remove_dir_all(&aside);
            }
            // Another start made it first: theirs stands.
            if let Err(e) = placed {
                if !self.dir.is_dir() {
                    return Err(e);
                }
            }
        }
        if !self.tmp.is_dir() {
            match std::fs::DirBuilder::new().mode(0o700).create(&self.tmp) {
                Ok(()) => chown(&self.tmp, owner)?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A gateway user's name as one path component, a different one for each
/// name: names are `[A-Za-z0-9._@-]+`, so `.`-led ones (`.`, `..`) get a
/// `_` in front and a conversation with no owner gets `_`; names that
/// themselves start with `_` (`_`, `_.bob`), which would then share those,
/// get a `+` in front, which no name has.
pub fn path_component(user: Option<&str>) -> String {
    match user {
        None | Some("") => "_".into(),
        Some(name) if name.starts_with('.') || name.contains('/') => {
            format!("_{}", name.replace('/', "_"))
        }
        Some(name) if name.starts_with('_') => format!("+{name}"),
        Some(name) => name.into(),
    }
}

/// Puts `user` (as a path component) in for each `{user}` of `path`.
pub fn with_user(path: &Path, user: Option<&str>) -> PathBuf {
    let text = path.to_string_lossy();
    if !text.contains("{user}") {
        return path.to_path_buf();
    }
    PathBuf::from(text.replace("{user}", &path_component(user)))
}

fn make_dir(dir: &Path, mode: u32) -> io::Result<()> {
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

fn chown(path: &Path, owner: Option<&SystemUser>) -> io::Result<()> {
    match owner {
        Some(owner) => std::os::unix::fs::lchown(path, Some(owner.uid), Some(owner.gid)),
        None => Ok(()),
    }
}

/// Copies what is beneath `from` into `to` (which exists): directories,
/// files and symlinks, modes kept, owned by `owner`; nothing else (a FIFO, a
/// socket) is copied.
fn copy_tree(from: &Path, to: &Path, owner: Option<&SystemUser>) -> io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            let mode = entry.metadata()?.permissions().mode() & 0o7777;
            std::fs::DirBuilder::new().mode(0o700).create(&target)?;
            copy_tree(&source, &target, owner)?;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&source)?, &target)?;
        } else if kind.is_file() {
            std::fs::copy(&source, &target)?;
        } else {
            continue;
        }
        chown(&target, owner)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_names_are_path_components_that_never_climb() {
        assert_eq!(path_component(Some("alice")), "alice");
        assert_eq!(path_component(Some("a.b@example.com")), "a.b@example.com");
        assert_eq!(path_component(Some("..")), "_..");
        assert_eq!(path_component(Some(".")), "_.");
        assert_eq!(path_component(None), "_");
        // Names that start with `_` share no place with those above.
        assert_eq!(path_component(Some("_")), "+_");
        assert_eq!(path_component(Some("_.bob")), "+_.bob");
        assert_ne!(path_component(Some("_.bob")), path_component(Some(".bob")));
        assert_eq!(
            with_user(Path::new("/srv/work/{user}"), Some("..")),
            PathBuf::from("/srv/work/_..")
        );
        assert_eq!(
            with_user(Path::new("/srv/{user}/work/{user}"), Some("bob")),
            PathBuf::from("/srv/bob/work/bob")
        );
        assert_eq!(
            with_user(Path::new("/srv/work"), Some("bob")),
            PathBuf::from("/srv/work")
        );
        let home = Home::of(Path::new("/state/homes"), Some(".."), "claude");
        assert_eq!(home.dir, PathBuf::from("/state/homes/_../claude"));
    }

    #[test]
    fn a_home_is_made_once_from_its_template_and_points_every_variable_there() {
        let state = tempfile::tempdir().unwrap();
        let template = tempfile::tempdir().unwrap();
        std::fs::create_dir(template.path().join(".claude")).unwrap();
        std::fs::write(template.path().join(".claude/settings.json"), "{}").unwrap();
        std::os::unix::fs::symlink(".claude", template.path().join("link")).unwrap();
        let home = Home::of(&state.path().join("homes"), Some("alice"), "claude");
        home.make(Some(template.path()), None).unwrap();
        assert_eq!(
            std::fs::read_to_string(home.dir.join(".claude/settings.json")).unwrap(),
            "{}"
        );
        assert!(home.dir.join("link").is_symlink());
        assert!(home.tmp.is_dir());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&home.dir), 0o700);
        assert_eq!(mode(&home.tmp), 0o700);
        assert_eq!(mode(&state.path().join("homes")), 0o711);
        // What the agent changed stays: the template is not copied again.
        std::fs::write(home.dir.join(".claude/settings.json"), "changed").unwrap();
        home.make(Some(template.path()), None).unwrap();
        assert_eq!(
            std::fs::read_to_string(home.dir.join(".claude/settings.json")).unwrap(),
            "changed"
        );
        // Nothing made aside is left.
        let left: Vec<_> = std::fs::read_dir(home.dir.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from("claude")]);
        let vars: std::collections::BTreeMap<_, _> = home.variables().into_iter().collect();
        assert_eq!(vars[&OsString::from("HOME")], home.dir.as_os_str());
        assert_eq!(vars[&OsString::from("TMPDIR")], home.tmp.as_os_str());
        assert!(vars.values().all(|v| Path::new(v).starts_with(&home.dir)));
    }
}
