//! `acp-demo-agent`: the scripted ACP agent of [`acp_gateway::demo_agent`],
//! for tests and demos. `acp-gateway demo-agent` runs the same agent.

#[tokio::main]
async fn main() {
    acp_gateway::demo_agent::run(std::env::args().skip(1)).await;
}
