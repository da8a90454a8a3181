//! The database goes away in the middle of a streaming turn: the agent and
//! the WebSocket stay connected, live events keep flowing, writes wait in
//! memory, `/readyz` says 503, and once the database is back every chunk is
//! stored once, in order, with `seq` gap-free.
//!
//! The outage is a real one for this gateway only: its Postgres connection
//! goes through a TCP proxy that the test cuts (dropping every connection
//! and refusing new ones) and restores; or the database ends the backends
//! of chosen queries, as a restart or failover ends them all.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::common::*;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy to Postgres that can be cut and restored.
struct Proxy {
    port: u16,
    open: Arc<AtomicBool>,
    /// Bumped to drop every proxied connection.
    cuts: watch::Sender<u64>,
    /// How many connections were refused while cut.
    refused: watch::Sender<usize>,
}

impl Proxy {
    async fn to(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let (cuts, _) = watch::channel(0u64);
        let (refused, _) = watch::channel(0usize);
        let (accept_open, accept_cuts, accept_refused) =
            (open.clone(), cuts.clone(), refused.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if !accept_open.load(Ordering::SeqCst) {
                    drop(client);
                    accept_refused.send_modify(|n| *n += 1);
                    continue;
                }
                let mut cut = accept_cuts.subscribe();
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Proxy {
            port,
            open,
            cuts,
            refused,
        }
    }

    /// Waits (bounded) until `n` connections were refused since the cut.
    async fn until_refused(&self, n: usize) {
        let mut refused = self.refused.subscribe();
        tokio::time::timeout(WAIT, refused.wait_for(|seen| *seen >= n))
            .await
            .expect("the gateway tries to reach the database")
            .unwrap();
    }

    /// The database is unreachable from now on.
    fn cut(&self) {
        self.refused.send_replace(0);
        self.open.store(false, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

fn chunks(frames: &[serde_json::Value]) -> usize {
    streamed_text(frames, "agent_message_chunk")
        .split_whitespace()
        .count()
}

/// A gateway whose database connection goes through a proxy of its own.
async fn behind_a_proxy(
    db: &TestDb,
    write_buffer_events: usize,
    agent_args: &[&str],
) -> (TestGateway, Proxy) {
    let (mut config, proxy) = proxied_config(db, agent_args).await;
    config.write_buffer_events = write_buffer_events;
    (TestGateway::start_with(config).await, proxy)
}

/// The config of a gateway behind a proxy of its own, and the proxy.
async fn proxied_config(db: &TestDb, agent_args: &[&str]) -> (acp_gateway::config::Config, Proxy) {
    let (host_port, rest) = db
        .url
        .trim_start_matches("postgres://postgres@")
        .split_once('/')
        .unwrap();
    let proxy = Proxy::to(host_port.to_owned()).await;
    let mut config = Config::for_tests(db, vec![demo_profile("demo", agent_args)]);
    config.database_url = Some(format!(
        "postgres://postgres@127.0.0.1:{}/{rest}",
        proxy.port
    ));
    (config, proxy)
}

/// The search backlog (what was written before search existed) waits out
/// an outage: a pass that cannot reach the database fails as an outage and
/// takes nothing out of the backlog; with the database back, a pass
/// indexes all of it.
#[tokio::test]
async fn the_search_backlog_waits_out_an_outage() {
    use acp_gateway::store::search_backlog::{index_pass, Pass};
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (gw, proxy) = behind_a_proxy(&db, 10_000, &["--chunk-delay-ms", "0"]).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&id, "long 300").await;
    ws.until_type("turn_ended").await;
    let proxied = gw.stop().await.database_url.unwrap();
    // As a database from before search holds it.
    db.execute(
        "delete from search_texts; insert into search_backlog select id, conversation_id from messages;",
        "",
    )
    .await;
    let store = acp_gateway::store::open(&proxied).await.unwrap();

    proxy.cut();
    let cut = index_pass(&*store).await.unwrap_err();
    assert!(cut.is_outage(), "{cut}");
    assert_eq!(db.number("select count(*) from search_backlog").await, 2);

    proxy.restore();
    // A connection the cut broke may fail one more try, as after any outage.
    let mut tries = 0;
    let pass = loop {
        match index_pass(&*store).await {
            Ok(pass) => break pass,
            Err(e) if e.is_outage() && tries < 3 => tries += 1,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        pass,
        Pass {
            indexed: 2,
            failed: 0
        }
    );
    assert_eq!(db.number("select count(*) from search_backlog").await, 0);
    let found = store
        .search_conversations("w299", 10, None, None)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
}

#[tokio::test]
async fn a_database_outage_during_a_streaming_turn_loses_nothing() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (gw, proxy) = behind_a_proxy(&db, 10_000, &[]).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    // 120 chunks, 50 ms apart: six seconds of streaming, three without the
    // database.
    gw.prompt(&id, "slow 120").await;
    let mut seen = ws
        .until(|e| e["data"]["update"]["content"]["text"] == "s10 ")
        .await;

    proxy.cut();
    let (status, _) = gw.get("/readyz").await;
    assert_eq!(status, 503, "not ready without the database");
    // Live events keep flowing while nothing can be written.
    let before = chunks(&seen);
    seen.extend(
        ws.until(|e| e["data"]["update"]["content"]["text"] == "s40 ")
            .await,
    );
    assert!(
        chunks(&seen) > before + 20,
        "chunks flowed during the outage"
    );
    let (status, _) = gw.get("/readyz").await;
    assert_eq!(status, 503);
    let metrics = reqwest::get(gw.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let held: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("acp_gateway_write_buffer_events "))
        .expect("the write buffer gauge")
        .parse()
        .unwrap();
    assert!(held >= 1.0, "events wait in the write buffer: {held}");

    proxy.restore();
    seen.extend(ws.until_type("turn_ended").await);
    let ended = seen.last().unwrap();
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    // What the client saw: once each, in order.
    assert_consecutive(&seen, seen[0]["seq"].as_i64().unwrap() - 1);
    let expected: String = (0..120).map(|i| format!("s{i} ")).collect();
    assert_eq!(streamed_text(&seen, "agent_message_chunk"), expected);
    // What was stored: the same events, gap-free, each chunk once.
    let events = gw.events(&id).await;
    assert_consecutive(&events, 0);
    assert_eq!(streamed_text(&events, "agent_message_chunk"), expected);
    for frame in &seen {
        let seq = frame["seq"].as_i64().unwrap();
        assert_eq!(&events[seq as usize - 1], frame, "stored as published");
    }
    let (status, _) = gw.get("/readyz").await;
    assert_eq!(status, 200);
}

/// With its buffer full the gateway stops reading the agent (whose output
/// waits in the pipe) instead of holding more or dropping anything.
#[tokio::test]
async fn a_full_write_buffer_holds_the_agent_back_and_loses_nothing() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    // 300 chunks, 20 ms apart.
    let (gw, proxy) = behind_a_proxy(&db, 2, &["--chunk-delay-ms", "20"]).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&id, "long 300").await;
    let mut seen = ws.until(|e| e["type"] == "session_update").await;
    proxy.cut();
    // A second of the outage: without backpressure some fifty events would
    // arrive; with two held, the agent is read no further.
    let mut during = Vec::new();
    while let Ok(frame) = tokio::time::timeout(std::time::Duration::from_secs(1), ws.next()).await {
        during.push(frame);
    }
    assert!(during.len() <= 3, "held beyond the buffer: {during:#?}");
    seen.extend(during);

    proxy.restore();
    seen.extend(ws.until_type("turn_ended").await);
    assert_eq!(seen.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert_consecutive(&seen, seen[0]["seq"].as_i64().unwrap() - 1);
    let text = streamed_text(&seen, "agent_message_chunk");
    let expected: String = (0..300).map(|i| format!("w{i} ")).collect();
    assert_eq!(text, expected, "every chunk once, in order");
    let events = gw.events(&id).await;
    assert_consecutive(&events, 0);
    assert_eq!(streamed_text(&events, "agent_message_chunk"), expected);
}

/// A client that reconnects during an outage (refused: 503, the page
/// retries) and just after it, to a conversation that fell silent: the
/// events published before they could be committed reach it once the
/// database holds them (not at some later event), each once, in order.
#[tokio::test]
async fn a_websocket_reconnecting_during_an_outage_sees_every_event_once_in_order() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (gw, proxy) = behind_a_proxy(&db, 10_000, &[]).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    // 30 chunks, 50 ms apart.
    gw.prompt(&id, "slow 30").await;
    let seen = ws
        .until(|e| e["data"]["update"]["content"]["text"] == "s5 ")
        .await;
    // Everything up to here was committed before it was published.
    let committed = seen.last().unwrap()["seq"].as_i64().unwrap();

    proxy.cut();
    // The turn ends while nothing can be written: its events go out early.
    let live = ws.until_type("turn_ended").await;
    assert_eq!(live.last().unwrap()["data"]["stop_reason"], "end_turn");
    // A client reconnecting meanwhile is told to come back.
    let (status, problem) = gw
        .get(&format!(
            "/api/v1/conversations/{id}/events?after={committed}"
        ))
        .await;
    assert_eq!(status, 503, "{problem}");

    // It does as soon as the database answers, likely before the journal
    // has committed what it published early (it retries with a backoff).
    proxy.restore();
    let mut again = gw.conversation_ws(&id, committed).await;
    let caught_up = again.until_type("turn_ended").await;
    assert_consecutive(&caught_up, committed);
    assert_eq!(caught_up, live, "the same events, once each, in order");
    let events = gw.events(&id).await;
    assert_consecutive(&events, 0);
}

/// A gateway stopping (cancelling its turns) while the database is away,
/// with a request waiting: its ending waits for the database, up to
/// `shutdown_timeout`, instead of giving up at the first refusal, so once
/// the database is back the request is recorded cancelled and the turn
/// ended, and nothing is left behind as if it still waited.
#[tokio::test]
async fn a_stop_during_an_outage_with_a_request_waiting_records_its_end_once_the_database_is_back()
{
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (mut config, proxy) = proxied_config(&db, &[]).await;
    // Longer than the three tries the test waits for.
    config.shutdown_timeout = std::time::Duration::from_secs(60);
    let gw = TestGateway::start_with(config).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&id, "tool").await;
    let requested = ws.until_type("permission_requested").await.pop().unwrap();
    let request_id: uuid::Uuid = requested["data"]["id"].as_str().unwrap().parse().unwrap();
    proxy.cut();
    let stopping = tokio::spawn(gw.stop());
    // The ending meets the outage, and keeps trying.
    proxy.until_refused(3).await;
    proxy.restore();
    stopping.await.unwrap();

    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let request = store.get_permission(request_id).await.unwrap().unwrap();
    assert_eq!(request.status.as_str(), "cancelled", "{request:?}");
    let events = store
        .list_events(id.parse().unwrap(), 0, 1_000)
        .await
        .unwrap();
    let types: Vec<String> = events
        .iter()
        .map(|e| {
            serde_json::to_value(e).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(
        types.iter().any(|t| t == "permission_resolved"),
        "{types:?}"
    );
    assert_eq!(
        types.last().map(String::as_str),
        Some("agent_status"),
        "{types:?}"
    );
    assert!(types.iter().any(|t| t == "turn_ended"), "{types:?}");
}

/// Events a node published early, during its outage, reach a WebSocket on
/// another node once they are committed: the turn that ended while node A
/// could not write is seen ending on node B, in order and once each, with
/// nothing after it to carry it along.
#[tokio::test]
async fn events_published_during_an_outage_reach_another_nodes_websocket_once_committed() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, proxy) = behind_a_proxy(&db, 10_000, &[]).await;
    let b = GatewayProcess::start_configured(&db, &[demo_profile("demo", &[])], "info", "");
    let (id, mut on_a) = a.open_conversation("demo").await;
    let mut on_b = b.conversation_ws(&id, 0).await;
    on_b.until_type("agent_status").await;
    // 30 chunks, 50 ms apart.
    a.prompt(&id, "slow 30").await;
    let seen = on_b
        .until(|e| e["data"]["update"]["content"]["text"] == "s5 ")
        .await;
    let before = seen.last().unwrap()["seq"].as_i64().unwrap();
    on_a.until(|e| e["seq"] == before).await;

    proxy.cut();
    // The turn ends on A while nothing can be written there.
    let live = on_a.until_type("turn_ended").await;
    proxy.restore();
    let relayed = on_b.until_type("turn_ended").await;
    assert_eq!(relayed, live, "the same events, once each, in order");
    drop(b);
}

/// The backend running a query like `pattern` while it waits for a lock,
/// once there is one (polled, bounded: nothing announces a lock wait).
async fn waiting_for_a_lock(db: &TestDb, pattern: &str) -> i32 {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    eventually(WAIT, async || {
        sqlx::query_scalar(
            "select pid from pg_stat_activity
             where datname = current_database() and wait_event_type = 'Lock' and query like $1
             limit 1",
        )
        .bind(pattern)
        .fetch_optional(&mut conn)
        .await
        .unwrap()
    })
    .await
    .unwrap_or_else(|_| panic!("{pattern:?} waits for its lock in time"))
}

/// Ends a backend as a database going away does (its client's query fails).
async fn terminate(db: &TestDb, pid: i32) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let ended: bool = sqlx::query_scalar("select pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(ended);
}

/// The notifier meets the database failing when it takes in a request of a
/// conversation it has not read yet: it was behind (handing over another
/// notification) when the request and its turn's start came, and the
/// database dropped its connection each time it asked for the conversation
/// (as a restart or failover does). The request still reaches the user's
/// webhook, once the database answers; before, the notifier forgot it for
/// good (nothing reads the store's pending requests again but a start or
/// falling behind on the bus, and during an outage the request is not even
/// in the store when its event comes).
#[tokio::test]
async fn a_request_the_notifier_met_during_a_database_failure_is_notified_once_it_answers() {
    use sqlx::Connection;
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.notifications.allow_private_targets = true;
    config.notifications.grace = std::time::Duration::from_millis(200);
    let gw = TestGateway::start_with(config).await;
    let mut receiver = crate::notifications::Receiver::start(None, &[]).await;
    let (status, created) = gw
        .call(
            "POST",
            "/api/v1/notification-targets",
            Some(serde_json::json!({"kind": "webhook", "url": receiver.url("/")})),
        )
        .await;
    assert_eq!(status, 201, "{created}");

    // The notifier falls behind: handing over the first request waits for
    // a lock on what it records.
    let mut keys = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("begin; lock table notification_keys in share mode")
        .execute(&mut keys)
        .await
        .unwrap();
    let (first, mut first_ws) = gw.open_conversation("demo").await;
    gw.prompt(&first, "tool").await;
    let first_request = first_ws
        .until_type("permission_requested")
        .await
        .pop()
        .unwrap();
    waiting_for_a_lock(&db, "insert into notification_keys %").await;

    // Meanwhile a second conversation's turn starts and asks.
    let (second, mut second_ws) = gw.open_conversation("demo").await;
    gw.prompt(&second, "tool").await;
    let second_request = second_ws
        .until_type("permission_requested")
        .await
        .pop()
        .unwrap();

    // The notifier goes on to those events; each time it asks for the
    // second conversation, the database drops its connection.
    let mut conversations = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("begin; lock table conversations in access exclusive mode")
        .execute(&mut conversations)
        .await
        .unwrap();
    sqlx::raw_sql("commit").execute(&mut keys).await.unwrap();
    let got = receiver.next().await;
    assert_eq!(
        got["body"]["request"]["id"], first_request["data"]["id"],
        "{got}"
    );
    // For the turn's start, then for the request (or, deferred, a retry).
    for _ in 0..2 {
        // The conversation read with what it spent (`get_conversation`).
        let reading = "select c.*, % as spend from conversations c%where c.id = $1";
        let pid = waiting_for_a_lock(&db, reading).await;
        terminate(&db, pid).await;
    }

    // The database answers again: the request is notified.
    sqlx::raw_sql("commit")
        .execute(&mut conversations)
        .await
        .unwrap();
    let got = receiver.next().await;
    assert_eq!(got["body"]["event"], "permission_waiting", "{got}");
    assert_eq!(
        got["body"]["request"]["id"], second_request["data"]["id"],
        "{got}"
    );
    assert_eq!(got["body"]["conversation"]["id"], second.as_str(), "{got}");
    drop((first_ws, second_ws));
    gw.stop().await;
}

/// A request asked while the database is away is in the snapshot of an
/// inbox that connects once the database is back but before the journal
/// has committed it (its event went out early, before that socket was
/// open): the phone that reconnects then sees it at once.
#[tokio::test]
async fn an_inbox_connecting_before_an_outages_requests_are_stored_shows_them() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    // The agent waits 400 ms before it announces its tool call and asks.
    let (gw, proxy) = behind_a_proxy(&db, 10_000, &["--chunk-delay-ms", "400"]).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&id, "tool").await;
    ws.until_type("turn_started").await;
    proxy.cut();
    let requested = ws.until_type("permission_requested").await.pop().unwrap();
    proxy.restore();
    // As a phone would: again at once while the gateway answers 503 (a
    // pooled connection the cut broke fails its first query).
    let url = gw.url("/api/v1/ws").replacen("http://", "ws://", 1);
    let mut tries = 0;
    let mut inbox = loop {
        match tokio_tungstenite::connect_async(url.as_str()).await {
            Ok((stream, _)) => break Ws { stream },
            Err(e) if tries < 5 => {
                tries += 1;
                eprintln!("the inbox did not connect ({e}); again");
            }
            Err(e) => panic!("the inbox does not connect: {e}"),
        }
    };
    let snapshot = inbox.next().await;
    assert_eq!(snapshot["type"], "snapshot");
    let ids: Vec<&serde_json::Value> = snapshot["pending_permissions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["id"])
        .collect();
    assert_eq!(ids, [&requested["data"]["id"]], "{snapshot}");
}
