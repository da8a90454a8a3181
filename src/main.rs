//! The `acp-gateway` executable: parses the command line, sets up logging,
//! and dispatches to the library (see [`acp_gateway::cli`]).

use clap::Parser;

use acp_gateway::cli::{self, Cli, Cmd};

/// Runs the command; a failure is one clear line on stderr (the error and
/// its causes, no backtrace) and exit code 1.
fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Cmd::Shim(args) = cli.command {
        // One thread: a machine runs one shim an agent. Its stdout says only
        // that it is ready: no logging set up here.
        let code = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(acp_gateway::shim::run(args)),
            Err(_) => 1,
        };
        return std::process::ExitCode::from(code);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Cmd::Openapi = cli.command {
        return cli::openapi();
    }
    if let Cmd::DemoAgent { args } = cli.command {
        // Its stdout is the protocol: no logging set up here.
        acp_gateway::demo_agent::run(args).await;
        return Ok(());
    }
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,sqlx=warn,tower_http=info".into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match cli.log_format {
        cli::LogFormat::Json => logs.json().with_current_span(true).init(),
        cli::LogFormat::Text => logs.with_ansi(std::io::stdout().is_terminal()).init(),
    }
    match cli.command {
        Cmd::Serve { config } => {
            // First of all: processes of the same user (agents running as
            // the gateway's user) cannot read our environment or memory.
            if let Err(e) = acp_gateway::sys::forbid_inspection() {
                tracing::warn!(error = %e, "cannot make the gateway non-dumpable: processes of its user can read its memory");
            }
            // What agents and terminal commands leave behind is ours to kill.
            if let Err(e) = acp_gateway::process::spawn::adopt_orphans() {
                tracing::warn!(error = %e, "cannot adopt orphans: what an agent leaves after it exits may outlive it");
            }
            acp_gateway::sys::return_large_allocations_to_the_system();
            let config = acp_gateway::Config::load(config.as_deref())?;
            // Listened for before the gateway says where it listens: a
            // signal sent once it has said so is never missed.
            use anyhow::Context;
            use tokio::signal::unix::{signal, SignalKind};
            let term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
            let interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
            let gateway = acp_gateway::Gateway::build(config).await?;
            let plan = gateway.shutdown_plan();
            gateway.run(shutdown_signal(term, interrupt, plan)).await
        }
        Cmd::Migrate { config } => cli::migrate(config.as_deref()).await,
        Cmd::Export { config, to } => cli::export(config.as_deref(), &to).await,
        Cmd::Token { command, config } => cli::token(config.as_deref(), command).await,
        Cmd::DemoAgent { .. } | Cmd::Shim(_) | Cmd::Openapi => unreachable!("handled above"),
    }
}

/// Resolves on SIGTERM (a service manager's stop: `on_shutdown` decides)
/// or SIGINT (Ctrl-C at a terminal: the person wants everything stopped,
/// agents included).
async fn shutdown_signal(
    mut term: tokio::signal::unix::Signal,
    mut interrupt: tokio::signal::unix::Signal,
    plan: acp_gateway::config::ShutdownPlan,
) {
    tokio::select! {
        _ = interrupt.recv() => {
            plan.cancel();
            tracing::info!("stopping (SIGINT: turns are cancelled and agents stopped)");
        }
        _ = term.recv() => tracing::info!(detach = plan.detaches(), "stopping (SIGTERM)"),
    }
}
