//! The `acp-gateway` command: `serve`, `migrate`, `export`, and the built-in
//! demo agent.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "acp-gateway",
    version,
    about = "ACP agents behind REST + WebSocket"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
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
    /// Run the scripted demo agent on stdin/stdout (what the built-in "demo"
    /// profile starts). Arguments are the demo agent's own.
    #[command(hide = true)]
    DemoAgent {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
enum TokenCmd {
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
enum RoleArg {
    User,
    Operator,
}

/// Runs the command; a failure is one clear line on stderr (the error and
/// its causes, no backtrace) and exit code 1.
fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Cmd::DemoAgent { args } = cli.command {
        // Its stdout is the protocol: no logging set up here.
        acp_gateway::demo_agent::run(args).await;
        return Ok(());
    }
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_ansi(std::io::stdout().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn,tower_http=info".into()),
        )
        .init();
    match cli.command {
        Cmd::Serve { config } => {
            return_large_allocations_to_the_system();
            let config = acp_gateway::Config::load(config.as_deref())?;
            let gateway = acp_gateway::Gateway::build(config).await?;
            gateway.run(shutdown_signal()).await
        }
        Cmd::Migrate { config } => {
            let config = acp_gateway::Config::load(config.as_deref())?;
            acp_gateway::store::open(&config.database_url()).await?;
            println!("migrations applied");
            Ok(())
        }
        Cmd::Export { config, to } => {
            let config = acp_gateway::Config::load(config.as_deref())?;
            let from = acp_gateway::store::open(&config.database_url()).await?;
            let target = acp_gateway::store::open(&to).await?;
            let stats = acp_gateway::store::export::copy_all(&*from, &*target).await?;
            println!(
                "exported {} conversations ({} already there): {} events, {} messages, \
                 {} tool calls, {} permission requests, {} rules",
                stats.conversations,
                stats.skipped,
                stats.events,
                stats.messages,
                stats.tool_calls,
                stats.permission_requests,
                stats.rules
            );
            Ok(())
        }
        Cmd::Token { command, config } => {
            let config = acp_gateway::Config::load(config.as_deref())?;
            let store = acp_gateway::store::open(&config.database_url()).await?;
            token_command(&*store, command).await
        }
        Cmd::DemoAgent { .. } => unreachable!("handled above"),
    }
}

async fn token_command(
    store: &dyn acp_gateway::store::Store,
    command: TokenCmd,
) -> anyhow::Result<()> {
    use acp_gateway::auth::{hash_token, new_token, Role};
    match command {
        TokenCmd::Create { user, role, label } => {
            let role = match role {
                RoleArg::User => Role::User,
                RoleArg::Operator => Role::Operator,
            };
            let token = new_token();
            let info = store
                .create_token(&user, role, label.as_deref(), &hash_token(&token))
                .await?;
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

/// glibc raises its mmap threshold each time a large block is freed, up to
/// 32 MiB, after which big blocks (a long agent line, its JSON) come from the
/// heap and their memory is kept after use. A fixed threshold keeps every
/// block over 256 KiB in its own mapping, returned to the system when freed.
fn return_large_allocations_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before the
    // gateway starts its work.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("stopping");
}
