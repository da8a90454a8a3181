//! The demo agent's command line.

use std::collections::HashSet;
use std::time::Duration;

use super::scenarios::Scenario;

pub(super) const USAGE: &str = "\
usage: acp-demo-agent [--chunk-delay-ms N] [--fail-on METHOD] [--hang-on METHOD]
                      [--exit-on METHOD] [--stdout-banner] [--scenario WORD] [--resumable]
A scripted ACP agent speaking JSON-RPC on stdin/stdout. The first word of each prompt picks
a scenario: tool, write, execute, codex, gemini, read, edit, parallel, plan, long, slow, crash, garbage,
unknown, hang, child, refuse, error, withdraw, stderr, cost, cost-wait; any other text is echoed.";

/// Why the command line was not accepted.
pub(super) enum ArgsError {
    /// `--help` was given.
    Help,
    /// An unknown flag, a missing value or a malformed value.
    Invalid(String),
}

/// The command-line flags.
#[derive(Debug, Default)]
pub(super) struct Options {
    /// Pause before each streamed update of a turn but the first.
    pub(super) chunk_delay: Duration,
    /// Requests answered with an error.
    pub(super) fail_on: HashSet<String>,
    /// Requests never answered.
    pub(super) hang_on: HashSet<String>,
    /// Methods that make the process exit.
    pub(super) exit_on: HashSet<String>,
    /// Print a non-JSON line on stdout at startup.
    pub(super) stdout_banner: bool,
    /// Play this scenario for every prompt instead of looking at the first word.
    pub(super) scenario: Option<Scenario>,
    /// Offer `session/resume`, asking again what still waits for an answer.
    pub(super) resumable: bool,
}

impl Options {
    /// Parses the arguments after the program name.
    pub(super) fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, ArgsError> {
        let mut options = Options::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            // Accept both `--flag value` and `--flag=value`.
            let (flag, inline_value) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => {
                    (flag.to_owned(), Some(value.to_owned()))
                }
                _ => (arg, None),
            };
            let mut value = || {
                inline_value
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| ArgsError::Invalid(format!("{flag} needs a value")))
            };
            match flag.as_str() {
                "--chunk-delay-ms" => {
                    let value = value()?;
                    let ms = value.parse().map_err(|_| {
                        ArgsError::Invalid(format!("--chunk-delay-ms: `{value}` is not a number"))
                    })?;
                    options.chunk_delay = Duration::from_millis(ms);
                }
                "--fail-on" => {
                    options.fail_on.insert(value()?);
                }
                "--hang-on" => {
                    options.hang_on.insert(value()?);
                }
                "--exit-on" => {
                    options.exit_on.insert(value()?);
                }
                "--scenario" => {
                    let word = value()?;
                    let scenario = Scenario::from_word(&word.to_lowercase()).ok_or_else(|| {
                        ArgsError::Invalid(format!("--scenario: unknown scenario `{word}`"))
                    })?;
                    options.scenario = Some(scenario);
                }
                "--stdout-banner" if inline_value.is_none() => options.stdout_banner = true,
                "--resumable" if inline_value.is_none() => options.resumable = true,
                "-h" | "--help" => return Err(ArgsError::Help),
                _ => {
                    return Err(ArgsError::Invalid(format!(
                        "unknown argument `{}`",
                        inline_value.map_or(flag.clone(), |v| format!("{flag}={v}"))
                    )))
                }
            }
        }
        Ok(options)
    }
}
