//! Where the state goes when nothing says where ([`data_dir`]).

use std::path::{Path, PathBuf};

/// Where the gateway keeps its state when nothing says where (no
/// `database_url`, no `state_dir`): `$XDG_DATA_HOME/acp-gateway`, else
/// `$HOME/.local/share/acp-gateway` (the XDG convention), each only where the
/// variable is an absolute path, the directory is there or can be made, and
/// the built-in demo agent's box does not reach it; else `./data`. A
/// `./data/acp-gateway.db` already there (made by an earlier version, whose
/// default that was) is kept. Chosen once per process.
pub fn data_dir() -> PathBuf {
    static CHOSEN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CHOSEN
        .get_or_init(|| {
            // A database an earlier version made in ./data/ stays where it
            // is: moving the default must not start anyone afresh.
            if Path::new("data/acp-gateway.db").is_file() {
                tracing::info!("keeping the database in ./data/, where an earlier version made it (new ones go to the XDG data directory)");
                return PathBuf::from("data");
            }
            // Not where the built-in demo agent's box reads: the system's
            // directories, or this executable's installation (a gateway in
            // ~/.local/bin gets ~/.local).
            let exe = std::env::current_exe().ok();
            let granted: Vec<PathBuf> = crate::sys::SYSTEM
                .iter()
                .chain(crate::sys::KERNEL_VIEWS)
                .map(PathBuf::from)
                .chain(
                    exe.iter()
                        .flat_map(|exe| crate::sys::installation_of(exe)),
                )
                .collect();
            data_dir_from(
                std::env::var_os("XDG_DATA_HOME"),
                std::env::var_os("HOME"),
                |dir| {
                    !granted.iter().any(|grant| dir.starts_with(grant))
                        && std::fs::create_dir_all(dir).is_ok()
                        && dir.is_dir()
                },
            )
        })
        .clone()
}

/// [`data_dir`] from those variables, `usable` telling whether a directory
/// is there or can be made.
pub(super) fn data_dir_from(
    xdg_data_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
    usable: impl Fn(&Path) -> bool,
) -> PathBuf {
    // The XDG spec: an empty variable is unset, a relative one invalid.
    let absolute =
        |var: Option<std::ffi::OsString>| var.map(PathBuf::from).filter(|dir| dir.is_absolute());
    [
        absolute(xdg_data_home),
        absolute(home).map(|home| home.join(".local/share")),
    ]
    .into_iter()
    .flatten()
    .map(|base| base.join("acp-gateway"))
    .find(|dir| usable(dir))
    .unwrap_or_else(|| PathBuf::from("data"))
}
