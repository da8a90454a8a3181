//! A profile's boxes: the profile as one user's conversations get it (each
//! `{user}` in its paths filled in), and the rules of its agent's box in a
//! conversation, from its command's installation and scripts.

use std::path::{Path, PathBuf};

use super::homes::with_user;
use super::{scripts, Home, Inputs, Rules};
use crate::config::AgentProfile;

/// `profile` as `user`'s conversations get it: each `{user}` in its `cwd`,
/// `repository`,
/// `allowed_roots`, `read_only_paths` and `read_write_paths` is the user's
/// name (see [`with_user`]).
pub fn for_user(profile: &AgentProfile, user: Option<&str>) -> AgentProfile {
    let each = |paths: &[PathBuf]| paths.iter().map(|p| with_user(p, user)).collect();
    AgentProfile {
        cwd: profile.cwd.as_deref().map(|cwd| with_user(cwd, user)),
        repository: profile.repository.as_deref().map(|r| with_user(r, user)),
        allowed_roots: each(&profile.allowed_roots),
        read_only_paths: each(&profile.read_only_paths),
        read_write_paths: each(&profile.read_write_paths),
        ..profile.clone()
    }
}

/// The rules of `profile`'s agent's box in `cwd` with `home` (see
/// [`Rules::for_conversation`]): with its command's installation, and where
/// the command is an interpreter its scripts' (see [`scripts`]), none of
/// which may hold or lie in `state_dir`. TCP ports are limited where
/// `limit_tcp`.
pub fn rules(
    profile: &AgentProfile,
    cwd: &Path,
    home: &Home,
    state_dir: &Path,
    limit_tcp: bool,
) -> Rules {
    let user = profile
        .user
        .as_deref()
        .and_then(|name| crate::sys::lookup_user(name).ok());
    let environment = crate::process::profile::environment(profile, user.as_ref());
    let path = crate::process::spawn::path_of(&environment);
    let program = crate::sys::resolve_command(&profile.command, path).ok();
    let state = std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let state = std::fs::canonicalize(&state).unwrap_or(state);
    let scripts = program
        .as_deref()
        .map(|program| scripts::installations(program, &profile.args, &[state.as_path()]))
        .unwrap_or_default();
    Rules::for_conversation(&Inputs {
        cwd,
        home,
        program: program.as_deref(),
        scripts: &scripts,
        read_only_paths: &profile.read_only_paths,
        read_write_paths: &profile.read_write_paths,
        allowed_tcp_ports: profile.allowed_tcp_ports.as_deref().filter(|_| limit_tcp),
    })
}
