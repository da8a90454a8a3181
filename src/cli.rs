//! The `acp-gateway` command line: `serve`, `migrate`, `export`, `token`,
//! and the built-in demo agent. `main.rs` parses and dispatches; the
//! commands that are not the server itself live here.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use crate::auth::issue_token;
use crate::config::Config;
use crate::model::Role;
use crate::store::{self, Store};

#[derive(Parser)]
#[command(
    name = "acp-gateway",
    version,
    about = "ACP agents behind REST + WebSocket"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
    /// How log lines are written: `text` for people, `json` (one object a
    /// line, with the span fields such as `conversation_id`) for collectors.
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run the gateway.
    Serve {
        /// Config file (default: acp-gateway.toml in the working directory, if present;
        /// without one: the embedded database and the built-in demo agent).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Apply database migrations and exit.
    Migrate {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Copy the whole history of the configured database into another one
    /// (e.g. from the embedded SQLite file into Postgres).
    Export {
        #[arg(long)]
        config: Option<PathBuf>,
        /// The target database URL (postgres://… or sqlite://PATH).
        #[arg(long)]
        to: String,
    },
    /// Create, list and revoke bearer tokens.
    Token {
        #[command(subcommand)]
        command: TokenCmd,
        #[arg(long, global = true)]
        config: Option<PathBuf>,
    },
    /// Print the API's OpenAPI document (YAML): what `openapi/openapi.yaml`
    /// holds and `GET /api/v1/openapi.json` serves.
    Openapi,
    /// Run an agent under a shim that outlives the gateway (the gateway
    /// starts it; see `shim`).
    #[command(hide = true)]
    Shim(crate::shim::ShimArgs),
    /// Run the scripted demo agent on stdin/stdout (what the built-in "demo"
    /// profile starts). Arguments are the demo agent's own.
    #[command(hide = true)]
    DemoAgent {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Create a token for a user (created if new); the token is printed once.
    Create {
        #[arg(long)]
        user: String,
        #[arg(long, value_enum, default_value = "user")]
        role: RoleArg,
        /// What the token is for, e.g. "alice's phone".
        #[arg(long)]
        label: Option<String>,
    },
    /// List tokens (never their values).
    List,
    /// Revoke a token by id; with --user, every token of that user (removing
    /// the user). Open WebSockets of a revoked token close within seconds.
    Revoke {
        #[arg(required_unless_present = "user", conflicts_with = "user")]
        id: Option<uuid::Uuid>,
        #[arg(long)]
        user: Option<String>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum RoleArg {
    User,
    Operator,
}

/// `migrate`: applies the database migrations.
pub async fn migrate(config: Option<&Path>) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    store::open(&config.database_url()).await?;
    println!("migrations applied");
    Ok(())
}

/// `export`: copies the configured database's whole history into `to`.
pub async fn export(config: Option<&Path>, to: &str) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    let from = store::open(&config.database_url()).await?;
    let target = store::open(to).await?;
    let stats = store::export::copy_all(&*from, &*target).await?;
    println!(
        "exported {} conversations ({} already there): {} events, {} messages, \
         {} tool calls, {} permission requests, {} rules, {} members, {} usage records, \
         {} notification targets, {} budget exceptions, {} budget notices, {} share links",
        stats.conversations,
        stats.skipped,
        stats.events,
        stats.messages,
        stats.tool_calls,
        stats.permission_requests,
        stats.rules,
        stats.members,
        stats.usage_records,
        stats.notification_targets,
        stats.budget_exceptions,
        stats.budget_notices,
        stats.share_links
    );
    if !stats.vapid_same {
        println!(
            "warning: {to_name} has a VAPID key of its own, kept: browsers that subscribed \
             for Web Push here must subscribe again there",
            to_name = crate::store::redact_url(to)
        );
    }
    Ok(())
}

/// `token create|list|revoke`.
pub async fn token(config: Option<&Path>, command: TokenCmd) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    let store = store::open(&config.database_url()).await?;
    token_command(&*store, command).await
}

async fn token_command(store: &dyn Store, command: TokenCmd) -> anyhow::Result<()> {
    match command {
        TokenCmd::Create { user, role, label } => {
            let role = match role {
                RoleArg::User => Role::User,
                RoleArg::Operator => Role::Operator,
            };
            let (info, token) = issue_token(store, &user, role, label.as_deref()).await?;
            eprintln!(
                "created token {} for {} ({}); it is shown only now:",
                info.id,
                info.user,
                info.role.as_str()
            );
            println!("{token}");
        }
        TokenCmd::List => {
            for t in store.list_tokens().await? {
                let state = match t.revoked_at {
                    Some(at) => format!("revoked {at}"),
                    None => "active".into(),
                };
                println!(
                    "{}  {:<20} {:<8} {:<10} created {}  {}",
                    t.id,
                    t.user,
                    t.role.as_str(),
                    state,
                    t.created_at,
                    t.label.unwrap_or_default()
                );
            }
        }
        TokenCmd::Revoke { id: Some(id), .. } => {
            if !store.revoke_token(id).await? {
                anyhow::bail!("no active token {id}");
            }
            println!("revoked {id}");
        }
        TokenCmd::Revoke {
            user: Some(user), ..
        } => {
            if !store.remove_user(&user).await? {
                anyhow::bail!("no user {user:?}");
            }
            println!("removed {user}: every token of theirs is revoked");
        }
        TokenCmd::Revoke { .. } => unreachable!("clap requires an id or --user"),
    }
    Ok(())
}

/// `openapi`: the document, as YAML, on stdout.
pub fn openapi() -> anyhow::Result<()> {
    print!("{}", crate::api::openapi_yaml()?);
    Ok(())
}
