//! An agent flooding its stdout with what the gateway drops or ignores
//! (`tests/agents/flood.py`), under its shim as by default: for each flood,
//! the time from the prompt to the turn's end on a WebSocket (every byte
//! went through the shim and was dealt with), its rate, and the peak memory
//! (VmHWM) of the gateway process and of the shim by then.
//!
//! BENCH_FLOOD_MIB (1024 by default: the MiB of the garbage and
//! newline-less floods; the long line is a tenth of it, the ignored message
//! 20 MiB; 0 skips it).

use std::time::{Duration, Instant};

use crate::common::*;

pub async fn run(backend: &str, db: &TestDb) {
    let mib = env_or("BENCH_FLOOD_MIB", 1024u64);
    if mib == 0 {
        return;
    }
    let floods = [
        ("garbage lines", format!("garbage {mib}"), mib),
        ("no newline", format!("noeol {mib}"), mib),
        ("one long line", format!("longline {}", mib / 10), mib / 10),
        ("an ignored message", "ignored 20".to_owned(), 20),
    ];
    // Lines up to 32 MiB: the 20 MiB message is read (and ignored).
    let gw = GatewayProcess::start_configured(
        db,
        &[flood_profile("flood")],
        "info,sqlx=warn",
        "max_line_bytes = 33554432",
    );
    let id = gw.create("flood").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    let (_, shim) = agent_and_shim(db, &id).await;
    for (what, prompt, size) in floods {
        let sent = Instant::now();
        gw.prompt(&id, &prompt).await;
        let frames = ws
            .until_type_within("turn_ended", Duration::from_secs(600))
            .await;
        let took = sent.elapsed().as_secs_f64();
        assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
        println!(
            "[{backend}] flood, {what}: {size} MiB in {took:.2} s = {:.0} MiB/s; peak memory: gateway {} MiB, shim {} MiB",
            size as f64 / took,
            proc_status_kib(gw.child.id(), "VmHWM:") / 1024,
            proc_status_kib(shim, "VmHWM:") / 1024,
        );
    }
}
