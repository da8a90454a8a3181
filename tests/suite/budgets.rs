//! Budgets: a turn whose reported cost crosses one is cancelled
//! (`on_exceed = "cancel"`) or let finish with its queue held
//! (`"finish_turn"`); new prompts in its scope get 402 `budget_exceeded`
//! with the limit, the spend and when it resets; 80 % warns (an event and
//! a notification to the owner and the operators); an operator's exception
//! lifts it; turns and context budgets hold agents that report no cost;
//! and the spend is the database's, so a budget holds across nodes.
//!
//! The demo agent's `spend` scenario reports what the steps say: a number
//! is the session's cost so far (USD), `u<N>` the tokens in context, `ask`
//! waits for a permission answer, `wait` for a cancel.

use std::sync::Arc;

use acp_gateway::config::Budget;
use acp_gateway::model::{BudgetLimit, BudgetScope, BudgetWindow, OnExceed};
use acp_gateway::notify::{Enqueue, Outgoing};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::common::*;

fn budget(id: &str, scope: BudgetScope, limit: BudgetLimit, on_exceed: OnExceed) -> Budget {
    Budget {
        id: id.into(),
        scope,
        limit,
        window: BudgetWindow::Day,
        on_exceed,
        profile: None,
    }
}

fn usd(amount: f64) -> BudgetLimit {
    BudgetLimit::Cost {
        amount,
        currency: "USD".into(),
    }
}

struct Recorder(mpsc::UnboundedSender<Outgoing>);

#[async_trait::async_trait]
impl Enqueue for Recorder {
    async fn enqueue(&self, outgoing: Outgoing) -> acp_gateway::error::Result<bool> {
        let _ = self.0.send(outgoing);
        Ok(true)
    }
}

/// A gateway with `budgets`, an operator (`root`), alice and bob, each
/// with a conversation and a WebSocket on it; what the notifier finds due
/// is recorded.
struct Team {
    gw: TestGateway,
    operator: Client,
    alice: Client,
    bob: Client,
    notified: mpsc::UnboundedReceiver<Outgoing>,
}

async fn team(db: &TestDb, budgets: Vec<Budget>) -> Team {
    let root = cli_token(db, "root", "operator");
    let mut config = Config::for_tests(db, vec![demo_profile("demo", &[])]);
    config.budgets = budgets;
    let (tx, notified) = mpsc::unbounded_channel();
    let gw = TestGateway::start_notifying(config, Some(Arc::new(Recorder(tx)))).await;
    let (alice, _) = gw.make_token(&root, "alice", "user").await;
    let (bob, _) = gw.make_token(&root, "bob", "user").await;
    Team {
        operator: gw.with_token(&root),
        alice: gw.with_token(&alice),
        bob: gw.with_token(&bob),
        gw,
        notified,
    }
}

/// A conversation of `client`'s with a WebSocket on it.
async fn open(client: &Client) -> (String, Ws) {
    let id = client.create("demo").await;
    let ws = client.conversation_ws(&id, 0).await;
    (id, ws)
}

async fn answer(client: &Client, request: &Value, option: &str) {
    let id = request["data"]["id"].as_str().unwrap();
    let (status, body) = client
        .post(
            &format!("/api/v1/permissions/{id}/respond"),
            json!({"option_id": option}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
}

/// Reads `ws` until it has seen an event of each of `kinds`, in whatever
/// order they come (a budget's notice and the turn's end race); the last
/// of each.
async fn until_each(ws: &mut Ws, kinds: &[&str]) -> Vec<Value> {
    let mut frames: Vec<Value> = Vec::new();
    while !kinds.iter().all(|k| frames.iter().any(|f| f["type"] == *k)) {
        frames.push(ws.next().await);
    }
    kinds
        .iter()
        .map(|k| {
            frames
                .iter()
                .rev()
                .find(|f| f["type"] == *k)
                .unwrap()
                .clone()
        })
        .collect()
}

/// Asserts a 402 `budget_exceeded` naming `budget`; the problem.
fn assert_spent((status, problem): (u16, Value), budget: &str) -> Value {
    assert_eq!(status, 402, "{problem}");
    assert_eq!(problem["code"], "budget_exceeded", "{problem}");
    assert_eq!(problem["budget"], budget, "{problem}");
    problem
}

/// Tomorrow's midnight, UTC, as the API writes it.
fn tomorrow() -> chrono::DateTime<chrono::Utc> {
    let today = chrono::Utc::now().date_naive();
    (today + chrono::Duration::days(1))
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc()
}

fn at(value: &Value) -> chrono::DateTime<chrono::Utc> {
    value.as_str().unwrap().parse().unwrap()
}

async fn a_turn_that_spends_a_budget_is_cancelled_and_new_prompts_get_402(db: TestDb) {
    let t = team(
        &db,
        vec![budget(
            "daily",
            BudgetScope::User,
            usd(1.0),
            OnExceed::Cancel,
        )],
    )
    .await;
    let (id, mut ws) = open(&t.alice).await;
    let (other, _) = open(&t.alice).await;
    let (bobs, mut bob_ws) = open(&t.bob).await;
    t.alice.prompt(&id, "cost 0.5 1.5 wait").await;
    let frames = ws.until_type("budget_exceeded").await;
    let notice = &frames.last().unwrap()["data"];
    assert_eq!(notice["budget"], "daily");
    assert_eq!(notice["scope"], "user");
    assert_eq!(notice["key"], "alice");
    assert_eq!(notice["spent"], 1.5);
    assert_eq!(notice["limit"], json!({"amount": 1.0, "currency": "USD"}));
    assert_eq!(notice["on_exceed"], "cancel");
    assert_eq!(at(&notice["resets_at"]), tomorrow());
    // 0.5 of 1.0 warned of nothing.
    assert!(!frames.iter().any(|e| e["type"] == "budget_warning"));
    // The turn was cancelled by the gateway: the agent waits for nothing
    // else.
    let ended = ws.until_type("turn_ended").await.pop().unwrap();
    assert_eq!(ended["data"]["stop_reason"], "cancelled");

    // New prompts in its scope: this conversation and alice's others.
    for conversation in [&id, &other] {
        let problem = assert_spent(t.alice.try_prompt(conversation, "hello").await, "daily");
        assert_eq!(problem["spent"], 1.5);
        assert_eq!(problem["limit"], json!({"amount": 1.0, "currency": "USD"}));
        assert_eq!(at(&problem["resets_at"]), tomorrow());
        assert_eq!(problem["key"], "alice");
    }
    // Bob spends his own.
    t.bob.prompt(&bobs, "hello").await;
    bob_ws.until_type("turn_ended").await;
    // Where alice stands, as she sees it.
    let (status, list) = t.alice.get("/api/v1/budgets").await;
    assert_eq!(status, 200, "{list}");
    let daily = &list["items"][0];
    assert_eq!(daily["id"], "daily");
    assert_eq!(daily["standing"]["spent"], 1.5);
    assert_eq!(daily["excepted"], false);
    let (_, list) = t.bob.get("/api/v1/budgets").await;
    assert_eq!(list["items"][0]["standing"]["spent"], 0.0);
    // The notice is recorded once, in the conversation's log.
    let events = t.alice.events(&id).await;
    let notices = events
        .iter()
        .filter(|e| e["type"] == "budget_exceeded")
        .count();
    assert_eq!(notices, 1, "{events:?}");
}

async fn a_turn_that_spends_a_finish_turn_budget_finishes_and_its_queue_holds(db: TestDb) {
    let t = team(
        &db,
        vec![budget(
            "daily",
            BudgetScope::User,
            usd(1.0),
            OnExceed::FinishTurn,
        )],
    )
    .await;
    let (id, mut ws) = open(&t.alice).await;
    t.alice.prompt(&id, "cost ask 1.5 ask").await;
    let first = ws.until_type("permission_requested").await.pop().unwrap();
    // Queued while the budget is not spent yet.
    let (status, queued) = t
        .alice
        .post(
            &format!("/api/v1/conversations/{id}/prompts"),
            json!({"text": "hello"}),
        )
        .await;
    assert_eq!((status, &queued["queued"]), (202, &json!(true)), "{queued}");
    answer(&t.alice, &first, "allow-once").await;
    // The turn goes on: the agent asks again, and finishes once answered.
    let [exceeded, second] =
        &until_each(&mut ws, &["budget_exceeded", "permission_requested"]).await[..]
    else {
        unreachable!()
    };
    assert_eq!(exceeded["data"]["on_exceed"], "finish_turn");
    assert_ne!(second["data"]["id"], first["data"]["id"]);
    answer(&t.alice, second, "allow-once").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    // What was queued waits for a person, held by the budget.
    let held = ws.until_type("queue_held").await.pop().unwrap();
    assert_eq!(held["data"]["budget"], "daily");
    assert_eq!(held["data"]["queued"], 1);
    let (status, queue) = t
        .alice
        .get(&format!("/api/v1/conversations/{id}/queue"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(queue["items"].as_array().unwrap().len(), 1, "{queue}");
    // And it does not start while the budget is spent.
    assert_spent(
        t.alice
            .post(
                &format!("/api/v1/conversations/{id}/queue/resume"),
                json!({}),
            )
            .await,
        "daily",
    );
    assert_spent(t.alice.try_prompt(&id, "hello").await, "daily");
}

async fn a_budget_warns_at_80_percent_and_tells_the_owner_and_the_operators(db: TestDb) {
    let mut t = team(
        &db,
        vec![budget(
            "daily",
            BudgetScope::User,
            usd(1.0),
            OnExceed::Cancel,
        )],
    )
    .await;
    let (id, mut ws) = open(&t.alice).await;
    t.alice.prompt(&id, "cost 0.85").await;
    let [warning, _] = &until_each(&mut ws, &["budget_warning", "turn_ended"]).await[..] else {
        unreachable!()
    };
    assert_eq!(warning["data"]["spent"], 0.85);
    // The owner and the operator, each away, are told.
    let mut told = Vec::new();
    for _ in 0..2 {
        let outgoing = tokio::time::timeout(WAIT, t.notified.recv())
            .await
            .expect("a notification in time")
            .unwrap();
        assert_eq!(outgoing.body.event.as_str(), "budget_warning");
        let budget = outgoing.body.budget.as_ref().unwrap();
        assert_eq!(budget.budget, "daily");
        assert_eq!(budget.spent, 0.85);
        told.push(outgoing.body.user.clone());
    }
    told.sort();
    assert_eq!(told, ["alice", "root"]);
    // Under the limit: prompts go on.
    t.alice.prompt(&id, "cost 0.9").await;
    ws.until_type("turn_ended").await;
    // The warning is not said twice in the window.
    let events = t.alice.events(&id).await;
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "budget_warning")
            .count(),
        1
    );
    // Then the budget is spent: told too.
    t.alice.prompt(&id, "cost 1.2").await;
    until_each(&mut ws, &["budget_exceeded", "turn_ended"]).await;
    let mut told = Vec::new();
    for _ in 0..2 {
        let outgoing = tokio::time::timeout(WAIT, t.notified.recv())
            .await
            .expect("a notification in time")
            .unwrap();
        assert_eq!(outgoing.body.event.as_str(), "budget_exceeded");
        told.push(outgoing.body.user.clone());
    }
    told.sort();
    assert_eq!(told, ["alice", "root"]);
    drop(t.gw);
}

async fn an_operator_exception_lifts_a_budget_until_removed(db: TestDb) {
    let t = team(
        &db,
        vec![budget(
            "daily",
            BudgetScope::User,
            usd(1.0),
            OnExceed::Cancel,
        )],
    )
    .await;
    let (id, mut ws) = open(&t.alice).await;
    t.alice.prompt(&id, "cost 1.5").await;
    until_each(&mut ws, &["budget_exceeded", "turn_ended"]).await;
    assert_spent(t.alice.try_prompt(&id, "hello").await, "daily");

    // Users may not lift it.
    let exceptions = "/api/v1/budgets/daily/exceptions";
    let (status, _) = t.alice.post(exceptions, json!({"user": "alice"})).await;
    assert_eq!(status, 403);
    let (status, exception) = t.operator.post(exceptions, json!({"user": "alice"})).await;
    assert_eq!(status, 201, "{exception}");
    assert_eq!(exception["user"], "alice");
    assert_eq!(exception["created_by"], "user:root");
    assert_eq!(at(&exception["until"]), tomorrow());
    let (status, list) = t.operator.get(exceptions).await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");
    let (_, mine) = t.alice.get("/api/v1/budgets").await;
    assert_eq!(mine["items"][0]["excepted"], true);

    // Lifted: alice prompts and spends on, unstopped.
    t.alice.prompt(&id, "cost 2.0 ask").await;
    let request = ws.until_type("permission_requested").await.pop().unwrap();
    answer(&t.alice, &request, "allow-once").await;
    let ended = ws.until_type("turn_ended").await.pop().unwrap();
    assert_eq!(ended["data"]["stop_reason"], "end_turn");

    // Removed: held again.
    let (status, _) = t.operator.delete(&format!("{exceptions}/alice")).await;
    assert_eq!(status, 204);
    let (status, _) = t.operator.delete(&format!("{exceptions}/alice")).await;
    assert_eq!(status, 404);
    assert_spent(t.alice.try_prompt(&id, "hello").await, "daily");
}

async fn a_turns_budget_holds_agents_that_report_no_cost(db: TestDb) {
    let t = team(
        &db,
        vec![
            budget(
                "turns",
                BudgetScope::User,
                BudgetLimit::Turns { turns: 2 },
                OnExceed::Cancel,
            ),
            // A cost budget never stops an agent that reports no cost.
            budget("cost", BudgetScope::User, usd(0.01), OnExceed::Cancel),
        ],
    )
    .await;
    let (id, mut ws) = open(&t.alice).await;
    t.alice.prompt(&id, "hello").await;
    let ended = ws.until_type("turn_ended").await.pop().unwrap();
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    // The second uses it up: told, not cancelled.
    t.alice.prompt(&id, "hello").await;
    let [ended, _] = &until_each(&mut ws, &["turn_ended", "budget_exceeded"]).await[..] else {
        unreachable!()
    };
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    let problem = assert_spent(t.alice.try_prompt(&id, "hello").await, "turns");
    assert_eq!(problem["spent"], 2.0);
    assert_eq!(problem["limit"], json!({"turns": 2}));
    // The turn that used it up ran on: it was told, not cancelled.
    let events = t.alice.events(&id).await;
    let exceeded: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "budget_exceeded")
        .collect();
    assert_eq!(exceeded.len(), 1, "{events:?}");
    assert_eq!(exceeded[0]["data"]["budget"], "turns");
}

async fn a_context_budget_stops_a_conversation_whose_context_is_full(db: TestDb) {
    let t = team(
        &db,
        vec![budget(
            "context",
            BudgetScope::Conversation,
            BudgetLimit::Context { context: 1000 },
            OnExceed::Cancel,
        )],
    )
    .await;
    let (id, mut ws) = open(&t.alice).await;
    let (other, mut other_ws) = open(&t.alice).await;
    t.alice.prompt(&id, "cost u500 u1500 wait").await;
    let exceeded = ws.until_type("budget_exceeded").await.pop().unwrap();
    assert_eq!(exceeded["data"]["spent"], 1500.0);
    assert_eq!(exceeded["data"]["resets_at"], Value::Null);
    let ended = ws.until_type("turn_ended").await.pop().unwrap();
    assert_eq!(ended["data"]["stop_reason"], "cancelled");
    assert_spent(t.alice.try_prompt(&id, "hello").await, "context");
    // Each conversation's context is its own.
    t.alice.prompt(&other, "hello").await;
    other_ws.until_type("turn_ended").await;
}

async fn budgets_refuse_bad_input(db: TestDb) {
    let t = team(
        &db,
        vec![budget(
            "daily",
            BudgetScope::User,
            usd(1.0),
            OnExceed::Cancel,
        )],
    )
    .await;
    let exceptions = "/api/v1/budgets/daily/exceptions";
    let (status, _) = t
        .operator
        .post("/api/v1/budgets/nope/exceptions", json!({"user": "alice"}))
        .await;
    assert_eq!(status, 404);
    let (status, _) = t.operator.get("/api/v1/budgets/nope/exceptions").await;
    assert_eq!(status, 404);
    let (status, _) = t
        .operator
        .delete("/api/v1/budgets/nope/exceptions/alice")
        .await;
    assert_eq!(status, 404);
    for body in [
        json!({}),
        json!({"user": "a b"}),
        json!({"user": "alice", "until": "never"}),
        json!({"user": 5}),
    ] {
        let (status, problem) = t.operator.post(exceptions, body.clone()).await;
        assert_eq!(status, 422, "{body}: {problem}");
    }
    let (status, _) = t
        .operator
        .post_raw(exceptions, "application/json", "{\"user\":")
        .await;
    assert_eq!(status, 400);
    let (status, _) = t.bob.get(exceptions).await;
    assert_eq!(status, 403);
    let (status, _) = t.bob.delete(&format!("{exceptions}/alice")).await;
    assert_eq!(status, 403);
    let (status, _) = t.gw.get("/api/v1/budgets").await;
    assert_eq!(status, 401);
}

/// An agent built on the official npm SDK, which reports its cost: the
/// budget holds it as the demo agent.
async fn a_budget_holds_an_sdk_agent_that_reports_cost(db: TestDb) {
    let root = cli_token(&db, "root", "operator");
    let mut config = Config::for_tests(&db, vec![node_sdk_profile("node")]);
    config.budgets = vec![budget(
        "tiny",
        BudgetScope::Conversation,
        usd(0.1),
        OnExceed::Cancel,
    )];
    let gw = TestGateway::start_with(config).await;
    let (alice, _) = gw.make_token(&root, "alice", "user").await;
    let alice = gw.with_token(&alice);
    let id = alice.create("node").await;
    let mut ws = alice.conversation_ws(&id, 0).await;
    alice.prompt(&id, "usage").await;
    let [exceeded, _] = &until_each(&mut ws, &["budget_exceeded", "turn_ended"]).await[..] else {
        unreachable!()
    };
    assert_eq!(exceeded["data"]["budget"], "tiny");
    assert_eq!(exceeded["data"]["spent"], 0.12);
    assert_spent(alice.try_prompt(&id, "hello").await, "tiny");
}

/// `acp-gateway export` copies what budgets keep: the spend (usage
/// records), the exceptions and the notices recorded.
async fn the_export_carries_budgets_exceptions_notices_and_spend(db: TestDb) {
    let daily = || {
        vec![budget(
            "daily",
            BudgetScope::User,
            usd(1.0),
            OnExceed::Cancel,
        )]
    };
    let t = team(&db, daily()).await;
    let (id, mut ws) = open(&t.alice).await;
    t.alice.prompt(&id, "cost 1.5").await;
    until_each(&mut ws, &["budget_exceeded", "turn_ended"]).await;
    let (status, _) = t
        .operator
        .post("/api/v1/budgets/daily/exceptions", json!({"user": "bob"}))
        .await;
    assert_eq!(status, 201);
    drop(ws);
    t.gw.stop().await;

    let target = TestDb::sqlite().await;
    let report = crate::export::export(&db, &target);
    assert!(
        report.contains("1 budget exceptions, 1 budget notices"),
        "{report}"
    );
    let mut config = Config::for_tests(&target, vec![demo_profile("demo", &[])]);
    config.budgets = daily();
    let gw = TestGateway::start_with(config).await;
    // The tokens were not copied: the target runs open, as its operator.
    let (status, list) = gw.get("/api/v1/budgets/daily/exceptions").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["items"][0]["user"], "bob", "{list}");
    // Alice's spend came along: her conversation is held there too.
    assert_spent(gw.try_prompt(&id, "hello").await, "daily");
    let events = gw.events(&id).await;
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "budget_exceeded")
            .count(),
        1
    );
}

/// An ACP client (an IDE through the gateway's `/acp`) is held as REST
/// clients are: its prompt in a spent budget's scope is a JSON-RPC error
/// carrying the 402 problem.
async fn an_acp_clients_prompt_is_refused_once_the_budget_is_spent(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.budgets = vec![budget(
        "mine",
        BudgetScope::Conversation,
        usd(1.0),
        OnExceed::Cancel,
    )];
    let gw = TestGateway::start_with(config).await;
    let mut acp = crate::acp_server::Acp::open(&gw).await;
    let session = acp.new_session().await;
    let mut ws = gw.conversation_ws(&session, 0).await;
    let ended = acp
        .call(
            "session/prompt",
            crate::acp_server::text_prompt(&session, "cost 1.5"),
        )
        .await;
    assert_eq!(ended["result"]["stopReason"], "end_turn", "{ended}");
    ws.until_type("budget_exceeded").await;
    let refused = acp
        .call(
            "session/prompt",
            crate::acp_server::text_prompt(&session, "hello"),
        )
        .await;
    assert_eq!(refused["error"]["code"], -32000, "{refused}");
    assert_eq!(refused["error"]["data"]["status"], 402, "{refused}");
    assert_eq!(
        refused["error"]["data"]["code"], "budget_exceeded",
        "{refused}"
    );
}

backend_tests!(
    a_turn_that_spends_a_budget_is_cancelled_and_new_prompts_get_402,
    a_turn_that_spends_a_finish_turn_budget_finishes_and_its_queue_holds,
    a_budget_warns_at_80_percent_and_tells_the_owner_and_the_operators,
    an_operator_exception_lifts_a_budget_until_removed,
    a_turns_budget_holds_agents_that_report_no_cost,
    a_context_budget_stops_a_conversation_whose_context_is_full,
    budgets_refuse_bad_input,
    a_budget_holds_an_sdk_agent_that_reports_cost,
    the_export_carries_budgets_exceptions_notices_and_spend,
    an_acp_clients_prompt_is_refused_once_the_budget_is_spent,
);

/// The spend is the database's: a budget spent through one node refuses
/// prompts on another, for that conversation and the owner's others.
#[tokio::test]
async fn a_budget_spent_on_one_node_holds_on_another() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let budgets = r#"
[[budgets]]
id = "daily"
scope = "user"
limit = { amount = 1.0, currency = "USD" }
window = "day"
"#;
    let start = || {
        GatewayProcess::start_configured(
            &db,
            &[demo_profile("demo", &[])],
            "info",
            &format!("node_lease = \"1s\"\n{budgets}"),
        )
    };
    let (a, b) = (start(), start());
    let id = a.create("demo").await;
    let mut ws = a.conversation_ws(&id, 0).await;
    a.prompt(&id, "cost 0.9 1.5").await;
    let [exceeded, _] = &until_each(&mut ws, &["budget_exceeded", "turn_ended"]).await[..] else {
        unreachable!()
    };
    assert_eq!(exceeded["data"]["spent"], 1.5);
    // The same owner's other conversation, made and prompted on the other
    // node, and the first one prompted there.
    let other = b.create("demo").await;
    assert_spent(b.try_prompt(&other, "hello").await, "daily");
    assert_spent(b.try_prompt(&id, "hello").await, "daily");
    // One notice for both nodes.
    let events = a.events(&id).await;
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "budget_exceeded")
            .count(),
        1
    );
}
