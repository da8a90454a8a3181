//! What agents spend: every usage report an agent sends is kept with the
//! cost increase it stands for (counted from the cumulative figures agents
//! report), summed per user, agent, conversation or day and per currency
//! (`GET /api/v1/usage`: a user's own, an operator's everyone's), and shown
//! on each conversation; on both databases, across a restart and across
//! nodes.

use acp_gateway::model::{self, GroupBy, UsageQuery, UsageRecord};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::*;

/// A usage record as the journal writes one.
fn record(
    conversation: Uuid,
    owner: &str,
    agent: &str,
    turn: Option<Uuid>,
    at: &str,
    cost: Option<(f64, &str)>,
    delta: f64,
) -> UsageRecord {
    UsageRecord {
        id: model::new_id(),
        conversation_id: conversation,
        turn_id: turn,
        owner: Some(owner.into()),
        agent: agent.into(),
        at: at.parse().unwrap(),
        seq: Some(1),
        used: Some(10),
        size: Some(100),
        cost_amount: cost.map(|c| c.0),
        cost_currency: cost.map(|c| c.1.to_owned()),
        delta,
    }
}

/// The store sums records per group and currency (never across
/// currencies), counts reports and turns, filters by owner, conversation,
/// agent and time (`to` exclusive), and days are UTC days; `spent` is what
/// budgets read. Records need no conversation (spend outlives it).
async fn the_store_sums_usage_per_group_and_currency(db: TestDb) {
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let (c1, c2, c3) = (model::new_id(), model::new_id(), model::new_id());
    let (t1, t2, t3) = (model::new_id(), model::new_id(), model::new_id());
    let records = [
        record(
            c1,
            "ann",
            "demo",
            Some(t1),
            "2026-03-01T10:00:00Z",
            Some((0.5, "USD")),
            0.5,
        ),
        record(
            c1,
            "ann",
            "demo",
            Some(t1),
            "2026-03-01T23:59:59.5Z",
            Some((0.75, "USD")),
            0.25,
        ),
        record(
            c1,
            "ann",
            "demo",
            Some(t2),
            "2026-03-02T00:00:00Z",
            None,
            0.0,
        ),
        record(
            c1,
            "ann",
            "demo",
            Some(t2),
            "2026-03-02T01:00:00+00:00",
            Some((2.0, "EUR")),
            2.0,
        ),
        record(
            c2,
            "bob",
            "claude",
            Some(t3),
            "2026-03-02T02:00:00Z",
            Some((1.0, "USD")),
            1.0,
        ),
        record(
            c3,
            "bob",
            "demo",
            None,
            "2026-03-05T00:00:00Z",
            Some((4.0, "USD")),
            4.0,
        ),
    ];
    store.insert_usage_records(&records).await.unwrap();
    // Written again (an export run twice): nothing doubles.
    store.insert_usage_records(&records[..2]).await.unwrap();

    let sums = |group_by, owner: Option<&str>| {
        let store = store.clone();
        let query = UsageQuery {
            owner: owner.map(str::to_owned),
            group_by,
            ..UsageQuery::default()
        };
        async move {
            let rows = store.usage_totals(&query).await.unwrap();
            rows.into_iter()
                .map(|r| {
                    json!([
                        r.key,
                        r.currency,
                        (r.amount * 1000.0).round() / 1000.0,
                        r.reports,
                        r.turns
                    ])
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        sums(None, None).await,
        [
            json!([null, null, 0.0, 1, 1]),
            json!([null, "EUR", 2.0, 1, 1]),
            json!([null, "USD", 5.75, 4, 2])
        ]
    );
    assert_eq!(
        sums(Some(GroupBy::User), None).await,
        [
            json!(["ann", null, 0.0, 1, 1]),
            json!(["ann", "EUR", 2.0, 1, 1]),
            json!(["ann", "USD", 0.75, 2, 1]),
            json!(["bob", "USD", 5.0, 2, 1])
        ]
    );
    assert_eq!(
        sums(Some(GroupBy::Agent), Some("bob")).await,
        [
            json!(["claude", "USD", 1.0, 1, 1]),
            json!(["demo", "USD", 4.0, 1, 0])
        ]
    );
    let by_conversation = sums(Some(GroupBy::Conversation), None).await;
    let keys: Vec<_> = by_conversation.iter().map(|r| r[0].clone()).collect();
    let (c1, c2, c3) = (c1.to_string(), c2.to_string(), c3.to_string());
    assert_eq!(keys, [&c1, &c1, &c1, &c2, &c3].map(|k| json!(k)));
    assert_eq!(
        sums(Some(GroupBy::Day), None).await,
        [
            json!(["2026-03-01", "USD", 0.75, 2, 1]),
            json!(["2026-03-02", null, 0.0, 1, 1]),
            json!(["2026-03-02", "EUR", 2.0, 1, 1]),
            json!(["2026-03-02", "USD", 1.0, 1, 1]),
            json!(["2026-03-05", "USD", 4.0, 1, 0])
        ]
    );

    let at = |s: &str| Some(s.parse::<chrono::DateTime<chrono::Utc>>().unwrap());
    let spent = store
        .spent(Some("ann"), None, None, None, None)
        .await
        .unwrap();
    assert_eq!(spent, [("EUR".to_owned(), 2.0), ("USD".to_owned(), 0.75)]);
    let spent = store
        .spent(
            None,
            None,
            Some("demo"),
            at("2026-03-01T23:59:59.5Z"),
            at("2026-03-05T00:00:00Z"),
        )
        .await
        .unwrap();
    assert_eq!(spent, [("EUR".to_owned(), 2.0), ("USD".to_owned(), 0.25)]);
    let id = c2.parse().unwrap();
    let spent = store.spent(None, Some(id), None, None, None).await.unwrap();
    assert_eq!(spent, [("USD".to_owned(), 1.0)]);
    assert!(store
        .spent(Some("carol"), None, None, None, None)
        .await
        .unwrap()
        .is_empty());

    let kept = store.usage_records(c1.parse().unwrap()).await.unwrap();
    assert_eq!(kept, records[..4]);
}

/// A conversation's usage records as stored, each as (turn, cost, delta
/// rounded to a thousandth), oldest first.
async fn kept(db: &TestDb, id: &str) -> Vec<(Option<Uuid>, Option<(f64, String)>, f64)> {
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let records = store.usage_records(id.parse().unwrap()).await.unwrap();
    records
        .into_iter()
        .map(|r| {
            let cost = r.cost_amount.zip(r.cost_currency);
            (r.turn_id, cost, (r.delta * 1000.0).round() / 1000.0)
        })
        .collect()
}

/// The turn a prompt started, from its `turn_started` event.
fn turn_of(frames: &[Value]) -> Option<Uuid> {
    let started = frames.iter().find(|e| e["type"] == "turn_started")?;
    started["data"]["turn_id"].as_str()?.parse().ok()
}

fn usd(amount: f64) -> Option<(f64, String)> {
    Some((amount, "USD".to_owned()))
}

/// Every report is kept, in the turn it came in, with what it adds to the
/// one before (counted on across turns; a figure gone down is a new count),
/// and each with its `session_update` event's seq; the conversation shows
/// the sum.
async fn every_report_is_kept_with_its_increase_per_turn(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "cost 0.1 0.25 0.25").await;
    let first = ws.until_type("turn_ended").await;
    gw.prompt(&id, "cost 0.5 0.2").await;
    let second = ws.until_type("turn_ended").await;
    let (t1, t2) = (turn_of(&first), turn_of(&second));
    assert!(t1.is_some() && t2.is_some() && t1 != t2);
    assert_eq!(
        kept(&db, &id).await,
        [
            (t1, usd(0.1), 0.1),
            (t1, usd(0.25), 0.15),
            (t1, usd(0.25), 0.0),
            (t2, usd(0.5), 0.25),
            (t2, usd(0.2), 0.2),
        ]
    );
    // Each with the seq of the event that carried it.
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let records = store.usage_records(id.parse().unwrap()).await.unwrap();
    let events = gw.events(&id).await;
    for r in &records {
        let event = events
            .iter()
            .find(|e| e["seq"] == json!(r.seq.unwrap()))
            .unwrap();
        assert_eq!(event["data"]["update"]["sessionUpdate"], "usage_update");
    }
    let conversation = gw.conversation(&id).await;
    let spend = &conversation["spend"];
    assert_eq!(spend.as_array().unwrap().len(), 1, "{spend}");
    assert_eq!(spend[0]["currency"], "USD");
    assert!(
        (spend[0]["amount"].as_f64().unwrap() - 0.7).abs() < 1e-9,
        "{spend}"
    );
}

/// A new conversation of `client`'s with `agent`, whose one turn is
/// `prompt`, ended: its id.
async fn spent_in(client: &Client, agent: &str, prompt: &str) -> String {
    let id = client.create(agent).await;
    let mut ws = client.conversation_ws(&id, 0).await;
    client.prompt(&id, prompt).await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    id
}

/// `GET /api/v1/usage?<query>` as `client` (asserting 200): its rows as
/// `[key, currency, amount, reports, turns]`, and its totals.
async fn usage(client: &Client, query: &str) -> (Vec<Value>, Value) {
    let (status, body) = client.get(&format!("/api/v1/usage?{query}")).await;
    assert_eq!(status, 200, "{query}: {body}");
    let rows = body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            json!([
                r["key"],
                r["currency"],
                r["amount"],
                r["reports"],
                r["turns"]
            ])
        })
        .collect();
    (rows, body["totals"].clone())
}

/// A user sees their own spend, by any grouping; an operator everyone's,
/// or one user's; agent and conversation narrow it; a span without reports
/// is empty; each conversation, read or listed, shows its own.
async fn spend_is_summed_by_each_key_a_user_seeing_their_own(db: TestDb) {
    let operator = cli_token(&db, "root", "operator");
    let (alice, bob) = (
        cli_token(&db, "alice", "user"),
        cli_token(&db, "bob", "user"),
    );
    let gw = TestGateway::start(
        &db,
        vec![demo_profile("demo", &[]), demo_profile("other", &[])],
    )
    .await;
    let (op, alice, bob) = (
        gw.with_token(&operator),
        gw.with_token(&alice),
        gw.with_token(&bob),
    );
    let first_day = chrono::Utc::now().date_naive().to_string();
    let a1 = spent_in(&alice, "demo", "cost 0.5").await;
    let b1 = spent_in(&bob, "demo", "cost 0.25 0.75").await;
    let b2 = spent_in(&bob, "other", "cost 1").await;
    let last_day = chrono::Utc::now().date_naive().to_string();

    let (rows, totals) = usage(&alice, "").await;
    assert_eq!(rows, [json!([null, "USD", 0.5, 1, 1])]);
    assert_eq!(totals, json!([{"amount": 0.5, "currency": "USD"}]));
    let (rows, _) = usage(&alice, "group_by=user&user=alice").await;
    assert_eq!(rows, [json!(["alice", "USD", 0.5, 1, 1])]);
    assert_problem(
        alice.get("/api/v1/usage?user=bob").await,
        403,
        "only operators",
    );
    let (rows, totals) = usage(&bob, "group_by=agent").await;
    assert_eq!(
        rows,
        [
            json!(["demo", "USD", 0.75, 2, 1]),
            json!(["other", "USD", 1.0, 1, 1])
        ]
    );
    assert_eq!(totals, json!([{"amount": 1.75, "currency": "USD"}]));

    let (rows, totals) = usage(&op, "group_by=user").await;
    assert_eq!(
        rows,
        [
            json!(["alice", "USD", 0.5, 1, 1]),
            json!(["bob", "USD", 1.75, 3, 2])
        ]
    );
    assert_eq!(totals, json!([{"amount": 2.25, "currency": "USD"}]));
    let (rows, _) = usage(&op, "group_by=user&user=bob").await;
    assert_eq!(rows, [json!(["bob", "USD", 1.75, 3, 2])]);
    let (rows, _) = usage(&op, "group_by=conversation").await;
    assert_eq!(
        rows,
        [
            json!([a1, "USD", 0.5, 1, 1]),
            json!([b1, "USD", 0.75, 2, 1]),
            json!([b2, "USD", 1.0, 1, 1])
        ]
    );
    let (rows, _) = usage(&op, "group_by=day").await;
    let day = rows[0][0].as_str().unwrap();
    assert!(day == first_day || day == last_day, "{day}");
    let all_in_one: usize = rows.iter().map(|r| r[3].as_u64().unwrap() as usize).sum();
    assert_eq!(all_in_one, 4);
    let (_, totals) = usage(&op, "agent=other").await;
    assert_eq!(totals, json!([{"amount": 1.0, "currency": "USD"}]));
    let (_, totals) = usage(&op, &format!("conversation={b1}")).await;
    assert_eq!(totals, json!([{"amount": 0.75, "currency": "USD"}]));
    // Another user's conversation adds nothing to a user's own.
    let (rows, _) = usage(&alice, &format!("conversation={b1}")).await;
    assert!(rows.is_empty());
    let (status, body) = op
        .get("/api/v1/usage?from=2020-01-01T00:00:00Z&to=2020-12-31T00:00:00%2B02:00")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"from": "2020-01-01T00:00:00Z", "to": "2020-12-30T22:00:00Z",
               "group_by": null, "rows": [], "totals": []})
    );

    assert_eq!(
        alice.conversation(&a1).await["spend"],
        json!([{"amount": 0.5, "currency": "USD"}])
    );
    let (status, found) = alice.get("/api/v1/search?q=cost").await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(
        found["items"][0]["conversation"]["spend"],
        json!([{"amount": 0.5, "currency": "USD"}]),
        "{found}"
    );
    let (_, listed) = bob.get("/api/v1/conversations").await;
    let spends: Vec<_> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_str().unwrap().to_owned(), c["spend"].clone()))
        .collect();
    assert_eq!(
        spends,
        [
            (b2, json!([{"amount": 1.0, "currency": "USD"}])),
            (b1, json!([{"amount": 0.75, "currency": "USD"}]))
        ]
    );
}

/// What `GET /api/v1/usage` does not take is 422, saying why.
async fn bad_usage_queries_are_refused(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    for (query, says) in [
        ("from=yesterday", "from must be an RFC 3339 time"),
        ("to=2026-13-01T00:00:00Z", "to must be an RFC 3339 time"),
        (
            "from=2026-02-01T00:00:00Z&to=2026-01-01T00:00:00Z",
            "from must not be after to",
        ),
        (
            "from=2025-01-01T00:00:00Z&to=2026-02-01T00:00:00Z",
            "at most 366 days apart",
        ),
        (
            "group_by=month",
            "group_by must be user, agent, conversation or day",
        ),
        ("conversation=nope", "conversation"),
    ] {
        let problem = assert_problem(gw.get(&format!("/api/v1/usage?{query}")).await, 422, says);
        assert_eq!(problem["status"], 422, "{query}");
    }
    // 366 days is still one span.
    let (status, body) = gw
        .get("/api/v1/usage?from=2025-01-01T00:00:00Z&to=2026-01-02T00:00:00Z")
        .await;
    assert_eq!(status, 200, "{body}");
}

/// The SDK agent's reports, through a restart of the gateway (its agent
/// loads its session and counts on): the cost reported before survives
/// with the conversation, a currency change counts whole, and the
/// conversation's spend is per currency.
async fn an_sdk_agents_reports_count_on_across_a_restart(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let mut profile = node_sdk_profile("sdk");
    profile.env.insert(
        "ACP_TEST_AGENT_STATE".into(),
        state.path().to_str().unwrap().into(),
    );
    let gw = TestGateway::start(&db, vec![profile]).await;
    let (id, mut ws) = gw.open_conversation("sdk").await;
    gw.prompt(&id, "cost 0.25 0.75 0.5:EUR 1.25:EUR").await;
    let first = ws.until_type("turn_ended").await;
    let t1 = turn_of(&first);
    let eur = |amount: f64| Some((amount, "EUR".to_owned()));
    assert_eq!(
        kept(&db, &id).await,
        [
            (t1, usd(0.25), 0.25),
            (t1, usd(0.75), 0.5),
            (t1, eur(0.5), 0.5),
            (t1, eur(1.25), 0.75),
        ]
    );

    let gw = gw.restart().await;
    let last_seq = gw.conversation(&id).await["last_seq"].as_i64().unwrap();
    let mut ws = gw.conversation_ws(&id, last_seq).await;
    gw.prompt(&id, "cost 1.5:EUR 0.5").await;
    let second = ws.until_type("turn_ended").await;
    let ready = second
        .iter()
        .find(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .expect("the agent started again");
    assert_eq!(ready["data"]["context"], "loaded", "{ready}");
    let t2 = turn_of(&second);
    let records = kept(&db, &id).await;
    assert_eq!(records[4..], [(t2, eur(1.5), 0.25), (t2, usd(0.5), 0.5)]);
    assert_eq!(
        gw.conversation(&id).await["spend"],
        json!([{"amount": 1.5, "currency": "EUR"}, {"amount": 1.25, "currency": "USD"}])
    );
}

/// The Python SDK's agent reports its cost (as the npm one does): each
/// report kept with its increase, the conversation's spend per currency.
async fn the_python_sdk_agents_reports_are_kept(db: TestDb) {
    let gw = TestGateway::start(&db, vec![python_sdk_profile("py")]).await;
    let (id, mut ws) = gw.open_conversation("py").await;
    gw.prompt(&id, "cost 0.25 0.75 0.5:EUR").await;
    let frames = ws.until_type("turn_ended").await;
    let turn = turn_of(&frames);
    assert_eq!(
        kept(&db, &id).await,
        [
            (turn, usd(0.25), 0.25),
            (turn, usd(0.75), 0.5),
            (turn, Some((0.5, "EUR".to_owned())), 0.5),
        ]
    );
    assert_eq!(
        gw.conversation(&id).await["spend"],
        json!([{"amount": 0.5, "currency": "EUR"}, {"amount": 0.75, "currency": "USD"}])
    );
    gw.stop().await;
}

/// `cost-wait` reports, then goes on until cancelled: what it reported is
/// kept, in its turn, and the turn ends `cancelled`.
async fn a_turn_cancelled_while_spending_keeps_what_it_reported(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "cost-wait 0.25 0.5").await;
    let frames = ws
        .until(|e| {
            e["type"] == "session_update" && e["data"]["update"]["content"]["text"] == "cost 0.5 "
        })
        .await;
    let turn = turn_of(&frames);
    let frames = gw.cancel_turn(&mut ws, &id).await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");
    assert_eq!(
        kept(&db, &id).await,
        [(turn, usd(0.25), 0.25), (turn, usd(0.5), 0.25)]
    );
}

/// Costs that are none (not a number, below zero, absurdly large, no
/// currency) are kept as reports without a cost, adding nothing; the next
/// real one counts whole.
async fn costs_that_are_none_count_as_reports_without_one(db: TestDb) {
    let gw = TestGateway::start(&db, vec![node_sdk_profile("sdk")]).await;
    let (id, mut ws) = gw.open_conversation("sdk").await;
    gw.prompt(&id, "cost abc -1 1e300 0.5: 0.5").await;
    let frames = ws.until_type("turn_ended").await;
    let turn = turn_of(&frames);
    let none = (turn, None, 0.0);
    assert_eq!(
        kept(&db, &id).await,
        [
            none.clone(),
            none.clone(),
            none.clone(),
            none,
            (turn, usd(0.5), 0.5)
        ]
    );
    assert_eq!(
        gw.conversation(&id).await["spend"],
        json!([{"amount": 0.5, "currency": "USD"}])
    );
}

backend_tests!(
    a_turn_cancelled_while_spending_keeps_what_it_reported,
    costs_that_are_none_count_as_reports_without_one,
    the_store_sums_usage_per_group_and_currency,
    every_report_is_kept_with_its_increase_per_turn,
    spend_is_summed_by_each_key_a_user_seeing_their_own,
    bad_usage_queries_are_refused,
    an_sdk_agents_reports_count_on_across_a_restart,
    the_python_sdk_agents_reports_are_kept,
);

/// Spend is in the database, not in a node's memory: what a conversation
/// running on node A spent (asked there, or through node B) is what `GET
/// /usage` and the conversation say on node B.
#[tokio::test]
async fn spend_recorded_on_one_node_is_seen_on_another() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let agents = [demo_profile("demo", &[])];
    let start = || GatewayProcess::start_configured(&db, &agents, "info", "node_lease = \"1s\"");
    let (a, b) = (start(), start());
    let id = a.create("demo").await;
    let mut ws = a.conversation_ws(&id, 0).await;
    a.prompt(&id, "cost 0.25 0.5").await;
    ws.until_type("turn_ended").await;
    let (rows, totals) = usage(&b, "group_by=conversation").await;
    assert_eq!(rows, [json!([id, "USD", 0.5, 2, 1])]);
    assert_eq!(totals, json!([{"amount": 0.5, "currency": "USD"}]));
    // A prompt through B runs on A; B sees what it spent.
    b.prompt(&id, "cost 1").await;
    ws.until_type("turn_ended").await;
    let (rows, _) = usage(&b, "group_by=conversation").await;
    assert_eq!(rows, [json!([id, "USD", 1.0, 3, 2])]);
    assert_eq!(
        b.conversation(&id).await["spend"],
        json!([{"amount": 1.0, "currency": "USD"}])
    );
}
