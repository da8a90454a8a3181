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

backend_tests!(
    the_store_sums_usage_per_group_and_currency,
    every_report_is_kept_with_its_increase_per_turn
);
