//! The journal's `seq`s against what the store holds: a seq that is stored
//! is never used again, so no event is refused for it and dropped. A batch
//! the database refuses is written piece by piece, each piece moving the
//! conversation's `last_seq` with it; a journal that starts (or goes on)
//! behind the stored events goes on after them.

use acp_gateway::bus::EventBus;
use acp_gateway::model::{self, ConversationStatus, Decision, PermissionRequest, PermissionStatus};
use acp_gateway::session::journal::{Journal, Outlets};
use acp_gateway::store::Resolution;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::{idle_conversation, TestDb};

backend_tests!(
    a_refused_batch_keeps_last_seq_with_every_piece_stored,
    a_journal_behind_the_stored_events_goes_on_after_them,
);

/// A store on `db` with one idle conversation.
async fn one_conversation(db: &TestDb) -> (Outlets, Uuid) {
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let conversation = idle_conversation(Some("ann"));
    store.insert_conversation(&conversation).await.unwrap();
    let bus = EventBus::new(64);
    (Outlets { store, bus }, conversation.id)
}

/// A journal as a gateway starts one: from the conversation as stored.
async fn journal(outlets: &Outlets, id: Uuid) -> Journal {
    let conversation = outlets.store.get_conversation(id).await.unwrap().unwrap();
    Journal::new(outlets.clone(), &conversation, None)
}

fn thought(text: &str) -> Value {
    json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": text}})
}

/// Each event's seq and what it says: its thought, else its type.
fn said(events: impl IntoIterator<Item = model::Event>) -> Vec<(i64, String)> {
    events
        .into_iter()
        .map(|e| {
            let data = e.data_value();
            let text = data["update"]["content"]["text"].as_str();
            (e.seq, text.unwrap_or(e.body.kind()).to_owned())
        })
        .collect()
}

async fn stored(outlets: &Outlets, id: Uuid) -> Vec<(i64, String)> {
    said(outlets.store.list_events(id, 0, 100).await.unwrap())
}

/// Sets the conversation's `last_seq` back to `seq`, as an earlier run
/// could leave it.
async fn behind(db: &TestDb, seq: i64) {
    let sql = format!("update conversations set last_seq = {seq}");
    db.execute(&sql, &sql).await;
}

/// What the bus has published so far.
fn published(sub: &mut acp_gateway::bus::Subscription) -> Vec<(i64, String)> {
    let mut events = Vec::new();
    while let Ok(p) = sub.rx.try_recv() {
        events.push(serde_json::from_str::<model::Event>(&p.json).unwrap());
    }
    said(events)
}

fn said_pairs(pairs: &[(i64, &str)]) -> Vec<(i64, String)> {
    pairs.iter().map(|(s, t)| (*s, (*t).to_owned())).collect()
}

/// A batch the database refuses is written piece by piece, the
/// conversation's own row last. When that last write fails (refused here;
/// a crash or a lost connection alike), `last_seq` has kept up with the
/// events stored all the same, and the next journal goes on after them.
async fn a_refused_batch_keeps_last_seq_with_every_piece_stored(db: TestDb) {
    let (outlets, id) = one_conversation(&db).await;
    // Refused: a thought saying POISON (so the batch goes piece by piece),
    // and any change of a conversation's status (its row, written last).
    db.execute(
        "alter table events add constraint no_poison
           check (position('POISON' in data::text) = 0);
         create function frozen() returns trigger language plpgsql as $$
           begin raise exception 'frozen'; end $$;
         create trigger frozen before update on conversations for each row
           when (new.status is distinct from old.status) execute function frozen();",
        "create trigger no_poison before insert on events
           when instr(new.data, 'POISON') > 0
           begin select raise(abort, 'poisoned'); end;
         create trigger frozen before update on conversations
           when new.status is not old.status
           begin select raise(abort, 'frozen'); end;",
    )
    .await;
    let mut first = journal(&outlets, id).await;
    for text in ["one", "POISON", "three"] {
        first.session_update(thought(text), None);
    }
    first.set_status(ConversationStatus::Running);
    first.flush().await.unwrap_err();
    let kept = stored(&outlets, id).await;
    assert_eq!(
        kept.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(),
        [1, 2, 3],
        "{kept:?}"
    );
    assert_eq!(kept[1].1, "session_update", "a stand-in: {kept:?}");
    let row = outlets.store.get_conversation(id).await.unwrap().unwrap();
    assert_eq!(row.last_seq, 3, "last_seq kept up with the pieces");
    assert_eq!(
        row.status,
        ConversationStatus::Idle,
        "the row itself was not written"
    );

    db.execute(
        "drop trigger frozen on conversations;",
        "drop trigger frozen;",
    )
    .await;
    let mut sub = outlets.bus.subscribe(id);
    let mut next = journal(&outlets, id).await;
    next.session_update(thought("four"), None);
    next.flush().await.unwrap();
    assert_eq!(stored(&outlets, id).await[3..], said_pairs(&[(4, "four")]));
    assert_eq!(published(&mut sub), said_pairs(&[(4, "four")]));
}

/// A journal behind the stored events (started from a `last_seq` an
/// earlier run left behind them here; one whose resolution was committed
/// but whose answer was lost is behind alike) goes on after the newest: its
/// events and its resolutions are stored and published, none refused for
/// a seq taken.
async fn a_journal_behind_the_stored_events_goes_on_after_them(db: TestDb) {
    let (outlets, id) = one_conversation(&db).await;
    let request = PermissionRequest {
        id: model::new_id(),
        conversation_id: id,
        turn_id: None,
        tool_call: json!({"toolCallId": "call_1", "title": "Write a.txt"}),
        options: vec![json!({"optionId": "allow", "name": "Allow", "kind": "allow_once"})],
        status: PermissionStatus::Pending,
        decision: None,
        created_at: model::now(),
        kind: Default::default(),
    };
    let mut first = journal(&outlets, id).await;
    first.session_update(thought("one"), None);
    first.add_permission_request(&request, None);
    first.session_update(thought("three"), None);
    first.flush().await.unwrap();

    behind(&db, 1).await;
    let mut sub = outlets.bus.subscribe(id);
    let mut next = journal(&outlets, id).await;
    next.session_update(thought("four"), None);
    next.flush().await.unwrap();
    assert_eq!(published(&mut sub), said_pairs(&[(4, "four")]));

    behind(&db, 2).await;
    let mut last = journal(&outlets, id).await;
    let resolution = Resolution {
        request: request.clone(),
        status: PermissionStatus::Approved,
        decision: Decision::new(Some("allow".into()), "user:ann".into(), None),
    };
    let resolved = last.resolve(&resolution).await.unwrap().unwrap();
    assert_eq!(resolved.status, PermissionStatus::Approved);
    assert_eq!(last.last_seq(), 5);
    let expected = said_pairs(&[
        (1, "one"),
        (2, "permission_requested"),
        (3, "three"),
        (4, "four"),
        (5, "permission_resolved"),
    ]);
    assert_eq!(stored(&outlets, id).await, expected);
    assert_eq!(published(&mut sub), expected[4..]);
    let row = outlets.store.get_conversation(id).await.unwrap().unwrap();
    assert_eq!(row.last_seq, 5);
}
