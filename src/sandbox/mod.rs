//! Each conversation's box: what its agent, the terminal commands the
//! gateway runs for it and the files the gateway reaches for it may touch.
//!
//! - **The wall** is Landlock ([`landlock`]): rules the kernel enforces on a
//!   process and everything it starts, which no later code of theirs can
//!   lift. A box is read-write on the conversation's `cwd`, its user's home
//!   and a private `TMPDIR` (and a profile's `read_write_paths`), read and
//!   execute on the system (`/usr`, `/lib*`, `/bin`, `/sbin`, `/etc`,
//!   `/opt`, what `/proc` and `/sys` show, the agent command's installation,
//!   where the command is an interpreter the installation of the script it
//!   runs ([`scripts`]), and a profile's `read_only_paths`), and nothing else; where the kernel
//!   can, TCP connections go only to a profile's `allowed_tcp_ports`, and
//!   signals and abstract Unix sockets do not reach beyond the box. The
//!   rules are built here, from the profile and the conversation
//!   ([`Rules::for_conversation`], pure), and applied between fork and exec.
//! - **A home per user** ([`homes`]): `<state_dir>/homes/<user>/<profile>/`,
//!   made from the profile's `home_template` on first use, is the agent's
//!   `HOME` and `XDG_*_HOME`; so what an agent keeps of its sessions stays
//!   with the user whose sessions they are.
//! - **No capabilities** ([`capabilities`]): every agent, its shim and its
//!   terminal commands start with none (but those a profile keeps), and
//!   with `no_new_privs`, whatever user they run as.
//!
//! A profile's boxes are built in [`profile`]: the profile as one user's
//! conversations get it, and its agent's rules.
//!
//! Below the agent link and the workspace, which start the processes and
//! reach the files; above the processes (a box's program is found in its
//! agents' environment), the configuration and `sys`.

pub mod profile;
pub mod landlock;
pub mod capabilities;
pub mod homes;
pub mod scripts;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::config::profile::SandboxMode;
pub use crate::sys::{installation_of, KERNEL_VIEWS, SYSTEM};
pub use homes::Home;

/// The first Landlock ABI that limits TCP connections.
pub const NET_ABI: u32 = 4;

/// The devices every box may read and write.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// One box's rules (also what a shim is told on its command line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    /// Everything may be done beneath these.
    pub read_write: Vec<PathBuf>,
    /// Read, list and execute beneath these.
    pub read_only: Vec<PathBuf>,
    /// Directories stored resolved (the conversation's own): each must be
    /// reached with no symlink on its path, or the box is not made. Its
    /// rule is for the directory so reached, never for where a symlink
    /// swapped in since leads (another user's workspace, say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resolved: Vec<PathBuf>,
    /// The only TCP ports it may connect to (`None`: any).
    pub tcp_ports: Option<Vec<u16>>,
}

/// A conversation's box as its processes get it: the home its variables
/// point to, and the rules they are confined by (`None`: unconfined).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentBox {
    pub home: Option<Home>,
    pub rules: Option<Rules>,
}

impl AgentBox {
    /// The variables that point a process to its home (none without).
    pub fn variables(&self) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        self.home.as_ref().map(Home::variables).unwrap_or_default()
    }
}

/// What a conversation's box is made from.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub cwd: &'a Path,
    pub home: &'a Home,
    /// The agent's program, as resolved (its installation is readable).
    pub program: Option<&'a Path>,
    /// The installations of the scripts it runs (see [`scripts`]).
    pub scripts: &'a [PathBuf],
    /// The profile's `read_only_paths` and `read_write_paths`.
    pub read_only_paths: &'a [PathBuf],
    pub read_write_paths: &'a [PathBuf],
    pub allowed_tcp_ports: Option<&'a [u16]>,
}

impl Rules {
    /// The box of a conversation (pure: paths are named, not looked at).
    pub fn for_conversation(inputs: &Inputs<'_>) -> Rules {
        let mut read_write = vec![
            inputs.cwd.to_path_buf(),
            inputs.home.dir.clone(),
            inputs.home.tmp.clone(),
        ];
        read_write.extend(DEVICES.iter().map(PathBuf::from));
        read_write.extend(inputs.read_write_paths.iter().cloned());
        let mut read_only: Vec<PathBuf> = SYSTEM
            .iter()
            .chain(KERNEL_VIEWS)
            .map(PathBuf::from)
            .collect();
        if let Some(program) = inputs.program {
            read_only.extend(installation_of(program));
        }
        read_only.extend(inputs.scripts.iter().cloned());
        read_only.extend(inputs.read_only_paths.iter().cloned());
        dedup(&mut read_write);
        dedup(&mut read_only);
        Rules {
            read_write,
            read_only,
            resolved: vec![inputs.cwd.to_path_buf()],
            tcp_ports: inputs.allowed_tcp_ports.map(<[u16]>::to_vec),
        }
    }
}

/// Keeps the first of each path, and none that is beneath another kept one.
fn dedup(paths: &mut Vec<PathBuf>) {
    let all = std::mem::take(paths);
    for path in &all {
        let covered = all
            .iter()
            .any(|other| other != path && path.starts_with(other))
            || paths.contains(path);
        if !covered {
            paths.push(path.clone());
        }
    }
}

/// How a profile's agents are boxed on this kernel, as `GET /api/v1/agents`
/// shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Effective {
    /// The profile's `sandbox`.
    pub mode: SandboxMode,
    /// Whether its agents run confined.
    pub enforced: bool,
    /// The kernel's Landlock ABI version (absent: no Landlock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub landlock_abi: Option<u32>,
    /// Whether TCP connections are limited to `allowed_tcp_ports` (only
    /// when the profile names some).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_ports_enforced: Option<bool>,
    /// Why not enforced, or enforced only in part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// What its box may read and execute (only where enforced): the
    /// system, the command's installation and its scripts', the profile's
    /// `read_only_paths`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<Vec<String>>,
    /// What its box may read and write (only where enforced): `{cwd}` is
    /// the conversation's directory, `{home}` its user's home for the
    /// profile (with its `TMPDIR`); then the devices and the profile's
    /// `read_write_paths` (`{user}`: the conversation's owner).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_write: Option<Vec<String>>,
}

impl Effective {
    /// What a box of `rules` grants, shown (where it is enforced).
    pub fn granting(mut self, rules: &Rules) -> Effective {
        if self.enforced {
            let shown = |paths: &[PathBuf]| -> Vec<String> {
                paths.iter().map(|p| p.display().to_string()).collect()
            };
            self.read_only = Some(shown(&rules.read_only));
            self.read_write = Some(shown(&rules.read_write));
        }
        self
    }

    /// [`effective`], shown: where agents must not start, how and why
    /// (the reason is also the second value).
    pub fn of(
        mode: SandboxMode,
        limits_tcp: bool,
        abi: Option<u32>,
    ) -> (Effective, Option<String>) {
        match effective(mode, limits_tcp, abi) {
            Ok(effective) => (effective, None),
            Err(why) => (
                Effective {
                    mode,
                    enforced: false,
                    landlock_abi: abi,
                    tcp_ports_enforced: Some(false).filter(|_| limits_tcp),
                    detail: Some(why.clone()),
                    read_only: None,
                    read_write: None,
                },
                Some(why),
            ),
        }
    }
}

/// What a profile with `mode` (limiting TCP where `limits_tcp`) gets on a
/// kernel answering `abi` (pure); `Err` where it must not start at all.
pub fn effective(
    mode: SandboxMode,
    limits_tcp: bool,
    abi: Option<u32>,
) -> Result<Effective, String> {
    let tcp = |enforced: bool| Some(enforced).filter(|_| limits_tcp);
    match (mode, abi) {
        (SandboxMode::Off, _) => Ok(Effective {
            mode,
            enforced: false,
            landlock_abi: abi,
            tcp_ports_enforced: None,
            detail: Some("sandbox = \"off\"".into()),
            read_only: None,
            read_write: None,
        }),
        (_, None) => {
            let why = "this kernel does not offer Landlock (Linux 5.13 or later, with \
                       landlock in the lsm= boot parameter)";
            if mode == SandboxMode::Required {
                Err(format!("sandbox = \"required\" but {why}"))
            } else {
                Ok(Effective {
                    mode,
                    enforced: false,
                    landlock_abi: None,
                    tcp_ports_enforced: tcp(false),
                    detail: Some(why.into()),
                    read_only: None,
                    read_write: None,
                })
            }
        }
        (_, Some(abi)) if limits_tcp && abi < NET_ABI => {
            let why = format!(
                "this kernel's Landlock (ABI {abi}) cannot limit TCP ports (ABI {} can)",
                NET_ABI
            );
            if mode == SandboxMode::Required {
                Err(format!(
                    "sandbox = \"required\" with allowed_tcp_ports but {why}"
                ))
            } else {
                Ok(Effective {
                    mode,
                    enforced: true,
                    landlock_abi: Some(abi),
                    tcp_ports_enforced: tcp(false),
                    detail: Some(why),
                    read_only: None,
                    read_write: None,
                })
            }
        }
        (_, Some(abi)) => Ok(Effective {
            mode,
            enforced: true,
            landlock_abi: Some(abi),
            tcp_ports_enforced: tcp(true),
            detail: None,
            read_only: None,
            read_write: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home() -> Home {
        Home::at(Path::new("/state/homes/alice/claude"))
    }

    #[test]
    fn a_box_is_its_cwd_home_and_tmp_read_write_and_the_system_read_only() {
        let home = home();
        let rules = Rules::for_conversation(&Inputs {
            cwd: Path::new("/srv/work/alice"),
            home: &home,
            program: Some(Path::new("/opt/agent/bin/agent")),
            scripts: &[PathBuf::from("/srv/agents/x")],
            read_only_paths: &[PathBuf::from("/srv/shared"), PathBuf::from("/usr/share")],
            read_write_paths: &[PathBuf::from("/srv/cache")],
            allowed_tcp_ports: Some(&[443]),
        });
        assert_eq!(
            &rules.read_write[..2],
            [
                PathBuf::from("/srv/work/alice"),
                PathBuf::from("/state/homes/alice/claude")
            ]
        );
        assert!(rules.read_write.contains(&PathBuf::from("/srv/work/alice")));
        assert!(rules
            .read_write
            .contains(&PathBuf::from("/state/homes/alice/claude")));
        assert!(rules.read_write.contains(&PathBuf::from("/srv/cache")));
        assert!(rules.read_write.contains(&PathBuf::from("/dev/null")));
        // The TMPDIR is inside the home: one rule covers both.
        assert!(!rules.read_write.iter().any(|p| p.ends_with(".tmp")));
        for system in [
            "/usr",
            "/etc",
            "/bin",
            "/proc",
            "/opt",
            "/srv/shared",
            "/srv/agents/x",
        ] {
            assert!(rules.read_only.contains(&PathBuf::from(system)), "{system}");
        }
        // Beneath /usr already: not named twice.
        assert!(!rules.read_only.contains(&PathBuf::from("/usr/share")));
        assert!(!rules.read_only.iter().any(|p| p.starts_with("/tmp")));
        assert!(!rules.read_write.iter().any(|p| p == Path::new("/tmp")));
        assert_eq!(rules.tcp_ports, Some(vec![443]));
    }

    #[test]
    fn what_a_kernel_gives_each_mode() {
        use SandboxMode::*;
        assert!(effective(Auto, false, Some(7)).unwrap().enforced);
        assert_eq!(
            effective(Auto, true, Some(7)).unwrap().tcp_ports_enforced,
            Some(true)
        );
        assert_eq!(
            effective(Auto, false, Some(7)).unwrap().tcp_ports_enforced,
            None
        );
        let old = effective(Auto, true, Some(3)).unwrap();
        assert!(old.enforced && old.tcp_ports_enforced == Some(false) && old.detail.is_some());
        assert!(effective(Required, true, Some(3))
            .unwrap_err()
            .contains("TCP"));
        let none = effective(Auto, false, None).unwrap();
        assert!(!none.enforced && none.detail.unwrap().contains("Landlock"));
        assert!(effective(Required, false, None)
            .unwrap_err()
            .contains("required"));
        assert!(effective(Required, false, Some(1)).unwrap().enforced);
        let off = effective(Off, true, Some(7)).unwrap();
        assert!(!off.enforced && off.tcp_ports_enforced.is_none());
    }
}
