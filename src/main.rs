//! The `acp-gateway` command: `serve` and `migrate`.

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
        /// Config file (default: acp-gateway.toml in the working directory, if present).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Apply database migrations and exit.
    Migrate {
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn,tower_http=info".into()),
        )
        .init();
    match Cli::parse().command {
        Cmd::Serve { config } => {
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
