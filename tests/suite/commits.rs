//! The store's commit: a batch is written as its writes would be one by
//! one, whichever way the backend writes it (Postgres in one statement,
//! SQLite in one transaction).

use acp_gateway::model::{
    self, ConversationStatus, Event, EventBody, Message, MessagePart, MessageRole,
    PermissionStatus, ToolCall, UsageRecord,
};
use acp_gateway::store::{AgentLink, AgentProcessRecord, Batch, ConversationPatch, Store};
use serde_json::json;
use uuid::Uuid;

use crate::common::TestDb;

async fn conversation(store: &dyn Store) -> Uuid {
    let c = crate::common::idle_conversation(Some("ann"));
    store.insert_conversation(&c).await.unwrap();
    store
        .record_agent_process(&AgentProcessRecord {
            conversation_id: c.id,
            pid: 1,
            start_time: 1,
            boot_id: "boot".into(),
            pid_namespace: "pid:[1]".into(),
            hostname: "here".into(),
            started_at: model::now(),
            shim_socket: Some("/tmp/shim.sock".into()),
            link: None,
        })
        .await
        .unwrap();
    c.id
}

/// What one turn's first moments write, for `conversation`: a request, a
/// message in two parts (both with text to search), a tool call announced
/// then updated with another title, turn and time, another tool call,
/// events, usage records, the state and the link.
fn writes(conversation: Uuid, ids: &Ids) -> Vec<Batch> {
    let at = |ms| model::now() + chrono::Duration::milliseconds(ms);
    let event = |seq| Event {
        seq,
        conversation_id: conversation,
        at: at(seq),
        body: EventBody::Verbatim {
            kind: "agent_message_chunk".into(),
            data: json!({"n": seq}),
        },
    };
    let part = |part, text| MessagePart {
        part,
        message: Message {
            id: ids.message,
            turn_id: Some(ids.turn),
            role: MessageRole::Agent,
            content: vec![json!({"type": "text", "text": text})],
            created_at: ids.at,
        },
        content_in_event: None,
    };
    let call = |id: &str, title: &str, turn, ms| ToolCall {
        title: Some(title.into()),
        status: Some("pending".into()),
        raw_input: Some(json!({"title": title})),
        ..ToolCall::new(id.into(), turn, at(ms))
    };
    let patch = |seq| ConversationPatch {
        status: ConversationStatus::Running,
        acp_session_id: Some("s\0x".into()),
        last_seq: seq,
        current_turn_id: Some(ids.turn),
        updated_at: ids.at,
        state: None,
        queue: None,
    };
    let link = |to| AgentLink {
        output_to: to,
        ..AgentLink::default()
    };
    let usage = |seq, amount: Option<f64>, delta| UsageRecord {
        id: model::new_id(),
        conversation_id: conversation,
        turn_id: Some(ids.turn),
        owner: Some("ann".into()),
        agent: "demo".into(),
        at: at(seq),
        seq: Some(seq),
        used: Some(seq * 100),
        size: Some(1000),
        cost_amount: amount,
        cost_currency: amount.map(|_| "US\0D".into()),
        delta,
    };
    vec![
        Batch {
            events: vec![event(1)],
            messages: vec![part(0, "sunny ")],
            conversation: Some(patch(1)),
            link: Some(link(10)),
            ..Batch::default()
        },
        Batch {
            events: vec![event(2)],
            messages: vec![part(1, "meadow")],
            tool_calls: vec![call("t1", "read", Some(ids.turn), 2)],
            usage: vec![usage(2, Some(0.25), 0.25)],
            conversation: Some(patch(2)),
            ..Batch::default()
        },
        Batch {
            events: vec![event(3)],
            tool_calls: vec![
                call("t1", "read a.txt", None, 3),
                call("t2", "edit", Some(ids.turn), 3),
            ],
            new_permissions: vec![model::PermissionRequest {
                id: ids.request,
                conversation_id: conversation,
                turn_id: Some(ids.turn),
                tool_call: json!({"toolCallId": "t2"}),
                options: vec![json!({"optionId": "ok", "name": "Allow", "kind": "allow_once"})],
                status: PermissionStatus::Pending,
                decision: None,
                created_at: ids.at,
                kind: Default::default(),
            }],
            usage: vec![usage(3, None, 0.0), usage(3, Some(0.5), 0.25)],
            conversation: Some(patch(3)),
            link: Some(link(30)),
            ..Batch::default()
        },
    ]
}

/// The batches' writes as one batch, in their order (the latest state and
/// link win).
fn as_one(batches: Vec<Batch>) -> Batch {
    let mut whole = Batch::default();
    for b in batches {
        whole.events.extend(b.events);
        whole.messages.extend(b.messages);
        whole.tool_calls.extend(b.tool_calls);
        whole.new_permissions.extend(b.new_permissions);
        whole.usage.extend(b.usage);
        whole.conversation = b.conversation.or(whole.conversation);
        whole.link = b.link.or(whole.link);
    }
    whole
}

struct Ids {
    message: Uuid,
    turn: Uuid,
    request: Uuid,
    at: chrono::DateTime<chrono::Utc>,
}

impl Ids {
    fn new() -> Ids {
        Ids {
            message: model::new_id(),
            turn: model::new_id(),
            request: model::new_id(),
            at: model::now(),
        }
    }
}

/// One batch holding three commits' writes leaves what the three commits
/// leave: the tool call written twice is its last state with its first turn
/// and time, the message's parts are one message found by words of both,
/// and the request, events, state and link are the same.
async fn a_batch_is_written_as_its_writes_one_by_one(db: TestDb) {
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let (one, apart) = (conversation(&*store).await, conversation(&*store).await);
    let (one_ids, apart_ids) = (Ids::new(), Ids::new());
    store
        .commit(one, &as_one(writes(one, &one_ids)))
        .await
        .unwrap();
    for b in writes(apart, &apart_ids) {
        store.commit(apart, &b).await.unwrap();
    }

    for (c, ids) in [(one, &one_ids), (apart, &apart_ids)] {
        let mut calls = store.list_tool_calls(c).await.unwrap();
        calls.sort_by(|a, b| a.tool_call_id.cmp(&b.tool_call_id));
        let titles: Vec<_> = calls.iter().map(|t| t.title.as_deref()).collect();
        assert_eq!(titles, [Some("read a.txt"), Some("edit")]);
        assert_eq!(calls[0].raw_input, Some(json!({"title": "read a.txt"})));
        assert_eq!(calls[0].turn_id, Some(ids.turn), "an update keeps the turn");
        assert!(
            calls[0].created_at < calls[0].updated_at,
            "an update keeps the first time: {:?}",
            calls[0]
        );
        let messages = store.list_messages(c).await.unwrap();
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert_eq!(
            messages[0].content,
            vec![json!({"type": "text", "text": "sunny meadow"})]
        );
        let request = store.get_permission(ids.request).await.unwrap().unwrap();
        assert_eq!(request.status, PermissionStatus::Pending);
        let events = store.list_events(c, 0, 10).await.unwrap();
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        let row = store.get_conversation(c).await.unwrap().unwrap();
        assert_eq!((row.last_seq, row.status), (3, ConversationStatus::Running));
        assert_eq!(row.acp_session_id.as_deref(), Some("s\u{FFFD}x"));
        let process = store.list_agent_processes().await.unwrap();
        let link = process
            .iter()
            .find(|p| p.conversation_id == c)
            .and_then(AgentProcessRecord::agent_link);
        assert_eq!(link.map(|l| l.output_to), Some(30));
        let usage = store.usage_records(c).await.unwrap();
        let kept: Vec<_> = usage
            .iter()
            .map(|u| (u.seq, u.cost_amount, u.cost_currency.as_deref(), u.delta))
            .collect();
        assert_eq!(
            kept,
            [
                (Some(2), Some(0.25), Some("US\u{FFFD}D"), 0.25),
                (Some(3), None, None, 0.0),
                (Some(3), Some(0.5), Some("US\u{FFFD}D"), 0.25)
            ]
        );
        assert_eq!(row.spend.len(), 1, "{:?}", row.spend);
        assert_eq!(row.spend[0].amount, 0.5);
    }
    // Both found by words of both parts, with the message's whole text.
    let found = store
        .search_conversations("sunny meadow", 10, None, Some("ann"))
        .await
        .unwrap();
    let mut found: Vec<_> = found.into_iter().map(|(c, text)| (c.id, text)).collect();
    found.sort();
    let mut expected = vec![
        (one, Some("sunny meadow".to_owned())),
        (apart, Some("sunny meadow".to_owned())),
    ];
    expected.sort();
    assert_eq!(found, expected);
}

/// A batch the conversation's epoch no longer admits writes nothing of any
/// kind, however many tables it touches.
async fn a_fenced_batch_writes_none_of_its_tables(db: TestDb) {
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let c = conversation(&*store).await;
    let claimed = "update conversations set owner_epoch = 2";
    db.execute(claimed, claimed).await;
    let ids = Ids::new();
    let mut whole = Batch {
        fence: Some(1),
        ..as_one(writes(c, &ids))
    };
    let refused = store.commit(c, &whole).await.unwrap_err();
    assert!(refused.is_fenced(), "{refused}");
    assert!(store.list_events(c, 0, 10).await.unwrap().is_empty());
    assert!(store.list_messages(c).await.unwrap().is_empty());
    assert!(store.list_tool_calls(c).await.unwrap().is_empty());
    assert!(store.get_permission(ids.request).await.unwrap().is_none());
    assert!(store.usage_records(c).await.unwrap().is_empty());
    let row = store.get_conversation(c).await.unwrap().unwrap();
    assert_eq!((row.last_seq, row.status), (0, ConversationStatus::Idle));
    let process = store.list_agent_processes().await.unwrap();
    assert_eq!(process[0].link, None);
    let found = store
        .search_conversations("meadow", 10, None, None)
        .await
        .unwrap();
    assert!(found.is_empty());

    whole.fence = Some(2);
    store.commit(c, &whole).await.unwrap();
    assert_eq!(store.list_events(c, 0, 10).await.unwrap().len(), 3);
}

backend_tests!(
    a_batch_is_written_as_its_writes_one_by_one,
    a_fenced_batch_writes_none_of_its_tables
);
