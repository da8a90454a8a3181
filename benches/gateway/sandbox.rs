//! What a conversation's box costs at agent start: conversations created
//! one after the other on one gateway process (SQLite or Postgres, agents
//! under shims as by default), alternately with a profile boxed
//! (`sandbox = "auto"`, Landlock enforced) and one not (`"off"`), each timed
//! from `POST /api/v1/conversations` sent to its 201 (the agent started and
//! its ACP session open), then deleted (its agent stopped), so that both
//! see the same machine. Prints p50 and p99 of each, and the difference.
//!
//! BENCH_SANDBOX_CONVERSATIONS (100 of each by default; 0 skips it).

use std::time::Instant;

use acp_gateway::config::AgentProfile;
use acp_gateway::sandbox::SandboxMode;
use serde_json::json;

use crate::common::*;
use crate::load::{quantile, sorted};

pub async fn run(backend: &str, db: &TestDb) {
    let n = env_or("BENCH_SANDBOX_CONVERSATIONS", 100);
    if n == 0 {
        return;
    }
    let Some(abi) = acp_gateway::sandbox::landlock::kernel_abi() else {
        println!("[{backend}] sandbox: skipped, this kernel has no Landlock");
        return;
    };
    let profile = |name: &str, sandbox| AgentProfile {
        sandbox,
        ..demo_profile(name, &[])
    };
    let agents = [
        profile("boxed", SandboxMode::Auto),
        profile("open", SandboxMode::Off),
    ];
    let extra = "max_agents = 1000\nmax_agents_per_user = 1000\n\
        rate_limits = { prompts_per_minute = 1000000, connections_per_minute = 1000000, \
        conversations_per_minute = 1000000 }";
    let gw = GatewayProcess::start_configured(db, &agents, "info,sqlx=warn", extra);
    let create = |agent: &'static str| {
        let gw = &gw;
        async move {
            let sent = Instant::now();
            let (status, body) = gw
                .post("/api/v1/conversations", json!({"agent": agent}))
                .await;
            let took = sent.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(status, 201, "{body}");
            let id = body["id"].as_str().unwrap().to_owned();
            let (status, body) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
            assert!(status < 300, "{body}");
            took
        }
    };
    // The first of each pays for what every later one shares (the home
    // made, pools, caches).
    create("boxed").await;
    create("open").await;
    let (mut boxed, mut open) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        boxed.push(create("boxed").await);
        open.push(create("open").await);
    }
    gw.stop();
    let (boxed, open) = (sorted(boxed), sorted(open));
    let (b50, o50) = (quantile(&boxed, 0.5), quantile(&open, 0.5));
    println!(
        "[{backend}] sandbox (Landlock ABI {abi}): conversation creation p50 {b50:.1} ms boxed, \
         {o50:.1} ms unboxed ({:+.1} ms, {:+.0} %); p99 {:.1} ms boxed, {:.1} ms unboxed ({n} of each)",
        b50 - o50,
        (b50 / o50 - 1.0) * 100.0,
        quantile(&boxed, 0.99),
        quantile(&open, 0.99),
    );
}
