//! An agent profile's processes: the environment they start with, and
//! whether they can start at all (what `GET /api/v1/agents` reports as
//! `unavailable_reason`).

use crate::config::AgentProfile;
use crate::sys::capabilities::CapSet;
use crate::sys::SystemUser;

use super::spawn::{self, Environment};

/// The environment its agents (and their terminal commands) start with
/// when they run as `user` (`None`: the gateway's own): see
/// [`spawn::environment`].
pub fn environment(profile: &AgentProfile, user: Option<&SystemUser>) -> Environment {
    spawn::environment(&profile.env, &profile.pass_env, user)
}

/// Why the profile's command cannot be run, or `None` if it looks runnable
/// (by the profile's `user`, when it names one): the program, and the
/// interpreter of a script (see [`crate::sys::runnable_by`]), and the
/// capabilities its agents keep, which the gateway must hold.
/// A remote agent (`url`) has no command here: `None` (whether it can be
/// reached is [`crate::acp::remote::unavailable_reason`]'s to say).
pub fn unavailable_reason(profile: &AgentProfile) -> Option<String> {
    if profile.url.is_some() {
        return None;
    }
    let user = match profile.user.as_deref().map(crate::sys::lookup_user) {
        Some(Ok(user)) => Some(user),
        Some(Err(reason)) => return Some(reason),
        None => None,
    };
    let environment = environment(profile, user.as_ref());
    let path = spawn::path_of(&environment);
    let program = match crate::sys::resolve_command(&profile.command, path) {
        Ok(program) => program,
        Err(reason) => return Some(reason),
    };
    if let Err(reason) = crate::sys::runnable_by(&program, user.as_ref(), path) {
        return Some(reason);
    }
    let kept = profile.kept_capabilities();
    let missing = match CapSet::held() {
        Ok(held) => kept.without(held),
        Err(_) => kept,
    };
    (!missing.is_empty()).then(|| {
        format!(
            "its agents keep {} but the gateway does not hold it",
            missing.names().join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const GOOD: &str = r#"
[[agents]]
name = "demo"
command = "sh"
cwd = "/tmp"
"#;

    #[test]
    fn a_command_in_path_is_available() {
        let config = Config::parse(GOOD).unwrap();
        assert!(unavailable_reason(&config.agent("demo").unwrap()).is_none());
    }

    #[test]
    fn missing_commands_are_reported_unavailable() {
        let mut config = Config::parse(GOOD).unwrap();
        config.agents[0].command = "definitely-not-a-command-xyz".into();
        let reason = unavailable_reason(&config.agents[0]).unwrap();
        assert!(reason.contains("not found"), "{reason}");
    }
}
