//! A gateway running inside the test's process on a free port, and the
//! config it starts from.

use acp_gateway::config::AgentProfile;
pub use acp_gateway::config::Config;
use acp_gateway::Gateway;
use tokio_util::sync::CancellationToken;

use super::{demo_profile, Client, TestDb, Ws, WAIT};

/// `Config::for_tests(db, agents)`: the config tests start from.
pub trait ForTests {
    fn for_tests(db: &TestDb, agents: Vec<AgentProfile>) -> Self;
}

impl ForTests for Config {
    /// What an empty config file gives, but on a free port, the test's
    /// database and state directory, its agents, and small limits; a key
    /// the tests do not name keeps its default.
    fn for_tests(db: &TestDb, agents: Vec<AgentProfile>) -> Config {
        let mut config = Config::parse("").expect("the defaults parse");
        config.listen = "127.0.0.1:0".into();
        config.database_url = Some(db.url.clone());
        config.max_line_bytes = 1024 * 1024;
        config.max_body_bytes = 64 * 1024;
        config.agents = agents;
        config.state_dir = Some(db.state_dir().to_path_buf());
        config.shim_program = Some(env!("CARGO_BIN_EXE_acp-gateway").into());
        // In-process gateways stop as `cancel` has them: their tests
        // restart a gateway to see what a stop leaves. What `detach`
        // (the default) leaves is seen with real processes
        // (`tests/suite/restart.rs`).
        config.on_shutdown = acp_gateway::config::OnShutdown::Cancel;
        config
    }
}

/// A gateway with the demo agent, one conversation, and a WebSocket on it
/// from the start: the setup most tests begin with.
pub async fn demo_conversation(db: &TestDb) -> (TestGateway, String, Ws) {
    let gw = TestGateway::start(db, vec![demo_profile("demo", &[])]).await;
    let (id, ws) = gw.open_conversation("demo").await;
    (gw, id, ws)
}

/// A gateway serving on a free port.
pub struct TestGateway {
    /// Its API, as every harness offers it.
    pub client: Client,
    pub config: Config,
    /// What its WebSockets hold for their clients.
    pub ws_budget: acp_gateway::api::SendBudget,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// The notifications' outbox (tests enqueue what the rules would).
    pub outbox: std::sync::Arc<acp_gateway::notify::outbox::Outbox>,
}

impl TestGateway {
    pub async fn start(db: &TestDb, agents: Vec<AgentProfile>) -> TestGateway {
        Self::start_with(Config::for_tests(db, agents)).await
    }

    pub async fn start_with(config: Config) -> TestGateway {
        Self::start_notifying(config, None).await
    }

    /// A gateway whose notifier hands what is due to `enqueue` (none
    /// without one).
    pub async fn start_notifying(
        config: Config,
        enqueue: Option<std::sync::Arc<dyn acp_gateway::notify::Enqueue>>,
    ) -> TestGateway {
        config.validate().expect("valid test config");
        let gateway = Gateway::build_with(config.clone(), enqueue)
            .await
            .expect("gateway builds");
        let base = format!("http://{}", gateway.local_addr());
        let ws_budget = gateway.websocket_budget();
        let outbox = gateway.outbox();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(gateway.run(async move { token.cancelled().await }));
        TestGateway {
            client: Client::new(base),
            config,
            ws_budget,
            stop,
            task: Some(task),
            outbox,
        }
    }

    /// Stops the gateway (closing its agents) and waits until it has.
    pub async fn stop(mut self) -> Config {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task)
                .await
                .expect("gateway stops in time")
                .unwrap()
                .unwrap();
        }
        self.config.clone()
    }

    /// Stops this gateway and starts a new one on the same database.
    pub async fn restart(self) -> TestGateway {
        let config = self.stop().await;
        TestGateway::start_with(config).await
    }
}

impl std::ops::Deref for TestGateway {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
