//! Agents that flood their stdout with what the gateway must drop or
//! ignore: garbage lines, bytes without a newline, a line over
//! `max_line_bytes`, a valid message nobody knows. Under shims, output
//! that makes no event is acknowledged as surely as output that does, so
//! the shim never fills with it and the conversation never wedges: each
//! turn ends `end_turn`, memory stays bounded, the next prompt works, also
//! across a gateway killed in the middle of a flood; and a cancel or a
//! `DELETE` of a conversation whose agent waits on a full shim works at
//! once. The agent is `tests/agents/flood.py`.

use std::time::Duration;

use serde_json::Value;

use crate::common::{
    agent_and_shim, eventually, flood_profile, proc_status_kib, shims_under, streamed_text,
    GatewayProcess, ProcessWatch, TestDb, Ws,
};

backend_tests!(
    output_that_makes_no_event_never_wedges_the_conversation,
    a_gateway_killed_in_the_middle_of_a_flood_carries_on_after_its_restart,
    cancel_and_delete_work_at_once_while_the_agent_waits_on_a_full_shim,
);

/// How long one flooded turn may take to end (each writes up to 1 GiB,
/// through the shim, on a machine running other tests).
const TURN_BOUND: Duration = Duration::from_secs(120);

/// Lines up to 32 MiB, so that a 20 MiB message is read and ignored (a
/// 100 MiB one is still too long).
const CONFIG: &str = "max_line_bytes = 33554432";

/// The floods, as `flood.py` takes them: each then answers `end_turn`.
const FLOODS: [&str; 4] = ["garbage 1024", "noeol 1024", "longline 100", "ignored 20"];

/// Reads until the turn ends (each frame within [`TURN_BOUND`]: a flood
/// makes no event for a while): the frames.
async fn until_turn_ended(ws: &mut Ws) -> Vec<Value> {
    ws.until_type_within("turn_ended", TURN_BOUND).await
}

/// The turn's frames ended `end_turn`, after the agent's "done <word>".
fn ended_as_the_agent_said(frames: &[Value], flood: &str) {
    let ended = frames.last().unwrap();
    assert_eq!(ended["data"]["stop_reason"], "end_turn", "{flood}: {ended}");
    let word = flood.split_whitespace().next().unwrap();
    assert!(
        streamed_text(frames, "agent_message_chunk").ends_with(&format!("done {word}")),
        "{flood}: {frames:?}"
    );
}

/// Bytes the process has written so far (`/proc/<pid>/io`).
fn written(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until the agent has written `bytes` more than `from` (polled,
/// bounded: nothing announces how far an agent has written).
async fn until_written(pid: i32, from: u64, bytes: u64) {
    eventually(TURN_BOUND, async || {
        (written(pid) >= from + bytes).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the agent wrote {} of {bytes} bytes in time",
            written(pid) - from
        )
    });
}

/// MiB in a `/proc/<pid>/status` figure.
fn mib(pid: i32, field: &str) -> u64 {
    proc_status_kib(pid, field) / 1024
}

async fn output_that_makes_no_event_never_wedges_the_conversation(db: TestDb) {
    let gw = GatewayProcess::start_configured(&db, &[flood_profile("flood")], "info", CONFIG);
    let id = gw.create("flood").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    let (_, shim) = agent_and_shim(&db, &id).await;
    for flood in FLOODS {
        let started = std::time::Instant::now();
        gw.prompt(&id, flood).await;
        let frames = until_turn_ended(&mut ws).await;
        ended_as_the_agent_said(&frames, flood);
        eprintln!(
            "{flood}: ended in {:.1} s; peak memory so far: gateway {} MiB, shim {} MiB",
            started.elapsed().as_secs_f64(),
            mib(gw.child.id() as i32, "VmHWM:"),
            mib(shim, "VmHWM:"),
        );
    }
    // The conversation is as usable as ever.
    gw.prompt(&id, "hello").await;
    let frames = until_turn_ended(&mut ws).await;
    ended_as_the_agent_said(&frames, "hello");
    assert_eq!(gw.conversation(&id).await["status"], "idle");
    // Memory stayed bounded: the shim holds at most its 64 MiB buffer;
    // the gateway at most a line (32 MiB here) and what reading it takes,
    // never the gigabytes that went through.
    let (gateway, shim) = (mib(gw.child.id() as i32, "VmHWM:"), mib(shim, "VmHWM:"));
    assert!(gateway < 400, "the gateway peaked at {gateway} MiB");
    assert!(shim < 100, "the shim peaked at {shim} MiB");
    // The log says a few skipped lines, not a million.
    let skipped = gw.log_text().matches("skipping line").count();
    assert!(skipped < 200, "{skipped} lines about skipped lines");
}

async fn a_gateway_killed_in_the_middle_of_a_flood_carries_on_after_its_restart(db: TestDb) {
    let mut gw = GatewayProcess::start_configured(&db, &[flood_profile("flood")], "info", CONFIG);
    let id = gw.create("flood").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    let (agent, _) = agent_and_shim(&db, &id).await;
    let agent_watch = ProcessWatch::new(agent);
    for flood in FLOODS {
        let mib: u64 = flood.split_whitespace().nth(1).unwrap().parse().unwrap();
        let before = written(agent);
        gw.prompt(&id, flood).await;
        // Half-way through its flood, the gateway dies.
        until_written(agent, before, mib * 1024 * 1024 / 2).await;
        let seen = gw.events(&id).await;
        gw.kill();
        assert!(!agent_watch.has_ended(), "the agent outlives the gateway");
        gw = GatewayProcess::start_configured(&db, &[flood_profile("flood")], "info", CONFIG);
        let last = seen.last().unwrap()["seq"].as_i64().unwrap();
        ws = gw.conversation_ws(&id, last).await;
        let frames = until_turn_ended(&mut ws).await;
        ended_as_the_agent_said(&frames, flood);
        // Every event once, in order.
        let all = gw.events(&id).await;
        crate::common::assert_consecutive(&all, 0);
    }
    gw.prompt(&id, "hello").await;
    let frames = until_turn_ended(&mut ws).await;
    ended_as_the_agent_said(&frames, "hello");
    // Still the same agent: the shim carried it through every restart.
    assert_eq!(agent_and_shim(&db, &id).await.0, agent);
}

async fn cancel_and_delete_work_at_once_while_the_agent_waits_on_a_full_shim(db: TestDb) {
    // A small shim: the flooding agent waits on it most of the time.
    let config = "shim_buffer = 65536\nmax_line_bytes = 4096";
    let gw = GatewayProcess::start_configured(&db, &[flood_profile("flood")], "info", config);
    let id = gw.create("flood").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    let (agent, shim) = agent_and_shim(&db, &id).await;

    // A cancel ends the turn: the agent hears it while it floods.
    let before = written(agent);
    gw.prompt(&id, "forever").await;
    until_written(agent, before, 4 * 1024 * 1024).await;
    gw.cancel_turn(&mut ws, &id).await;
    gw.prompt(&id, "hello").await;
    let frames = until_turn_ended(&mut ws).await;
    ended_as_the_agent_said(&frames, "hello");

    // An agent that ignores the cancel and floods for ever: DELETE ends it,
    // its shim with it.
    let (agent_watch, shim_watch) = (ProcessWatch::killing(agent), ProcessWatch::killing(shim));
    let before = written(agent);
    gw.prompt(&id, "stubborn").await;
    until_written(agent, before, 4 * 1024 * 1024).await;
    let (status, body) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204, "{body}");
    assert!(agent_watch.ended().await, "the agent is gone");
    assert!(shim_watch.ended().await, "its shim is gone");
    assert!(shims_under(db.state_dir()).is_empty());
}
