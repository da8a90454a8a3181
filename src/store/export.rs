//! Copying a whole gateway history from one store to another (e.g. from the
//! embedded SQLite file into Postgres when a laptop setup grows into a team
//! one). It goes through the [`Store`] trait only, so any direction works.

use std::collections::HashMap;

use uuid::Uuid;

use super::backend::{Batch, CommitQueue, ConversationPatch, Store};
use super::permissions::PermissionFilter;
use crate::error::Result;
use crate::model::{Conversation, Event, EventBody, Message, MessagePart, MessageRole};

/// What a copy moved.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CopyStats {
    pub conversations: usize,
    /// Conversations the target already had, complete, and were left alone.
    pub skipped: usize,
    pub events: usize,
    pub messages: usize,
    pub tool_calls: usize,
    pub permission_requests: usize,
    pub rules: usize,
    /// Usage records copied (of removed conversations too; those the
    /// target had already are left alone, and not counted).
    pub usage_records: usize,
    /// Members of shared conversations.
    pub members: usize,
    /// Notification targets copied (those already there are left alone).
    pub notification_targets: usize,
    /// Budgets' exceptions and notices copied (those already there are
    /// left alone, an exception replaced by the source's).
    pub budget_exceptions: usize,
    pub budget_notices: usize,
    /// Share links copied, as they are (only their tokens' hashes exist;
    /// those already there are left alone).
    pub share_links: usize,
    /// The VAPID key pair: the target now has the source's (copied, or it
    /// had it already), or `false`: the target has a key of its own, kept,
    /// and browsers subscribed with the source's must subscribe again.
    pub vapid_same: bool,
}

/// Conversations read per page.
const PAGE: i64 = 100;

/// Usage records read per page.
const USAGE_PAGE: i64 = 1000;

/// Copies every conversation with its events, messages, tool calls,
/// permission requests, remembered rules, members and share links (their
/// hashes: a link made before works after); every usage record (what
/// agents spent, kept when a conversation is removed); the notification
/// targets and the VAPID key pair (Web Push subscriptions are made against
/// it); the budgets' exceptions and notices. A conversation the target
/// already holds with the same history is skipped, so an interrupted export
/// can be run again; one it holds with a different history is an error.
pub async fn copy_all(from: &dyn Store, to: &dyn Store) -> Result<CopyStats> {
    let turns: HashMap<Uuid, Option<Uuid>> = from
        .live_conversations()
        .await?
        .into_iter()
        .map(|(c, turn)| (c.id, turn))
        .collect();
    let mut stats = CopyStats::default();
    let mut cursor = None;
    loop {
        let page = from
            .list_conversations(PAGE, cursor, None, None, false)
            .await?;
        let Some(last) = page.last() else { break };
        cursor = Some(last.id);
        for conversation in &page {
            let existing = to.get_conversation(conversation.id).await?;
            let fresh = match existing {
                None => true,
                Some(c) if c.last_seq == conversation.last_seq => {
                    stats.skipped += 1;
                    continue;
                }
                // Its row was written but the history's transaction was not.
                Some(c) if c.last_seq == 0 => false,
                Some(_) => {
                    return Err(anyhow::anyhow!(
                        "conversation {} already exists in the target with a different \
                         history; export into an empty database",
                        conversation.id
                    )
                    .into())
                }
            };
            let turn = turns.get(&conversation.id).copied().flatten();
            copy_conversation(from, to, conversation, turn, fresh, &mut stats).await?;
        }
    }
    let mut after = None;
    loop {
        let page = from.usage_records_after(after, USAGE_PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        stats.usage_records += to.insert_usage_records(&page).await? as usize;
    }
    stats.vapid_same = match from.stored_vapid_keys().await? {
        Some(keys) => to.vapid_keys(keys.clone()).await? == keys,
        None => true,
    };
    for target in from.all_targets().await? {
        if to.insert_target(&target).await? {
            stats.notification_targets += 1;
        }
    }
    for exception in from.all_budget_exceptions().await? {
        to.put_budget_exception(&exception).await?;
        stats.budget_exceptions += 1;
    }
    for n in from.budget_notices().await? {
        if to
            .note_budget(&n.budget_id, &n.scope_key, n.window_start, &n.kind, n.at)
            .await?
        {
            stats.budget_notices += 1;
        }
    }
    for link in from.all_share_links().await? {
        if to.insert_share_link(&link).await? {
            stats.share_links += 1;
        }
    }
    Ok(stats)
}

/// Each message whole, as its first part; a prompt's as the source stores
/// it: its content in its `turn_started` event only.
fn prompts_stored_once(events: &[Event], messages: Vec<Message>) -> Vec<MessagePart> {
    let prompts: HashMap<Uuid, (i64, &[serde_json::Value])> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TurnStarted(started) => {
                Some((started.turn_id, (e.seq, started.content.as_slice())))
            }
            _ => None,
        })
        .collect();
    messages
        .into_iter()
        .map(|message| {
            let content_in_event = message
                .turn_id
                .and_then(|turn| prompts.get(&turn))
                .filter(|(_, content)| {
                    message.role == MessageRole::User && *content == message.content.as_slice()
                })
                .map(|(seq, _)| *seq);
            MessagePart {
                part: 0,
                message,
                content_in_event,
            }
        })
        .collect()
}

async fn copy_conversation(
    from: &dyn Store,
    to: &dyn Store,
    conversation: &Conversation,
    turn: Option<Uuid>,
    fresh: bool,
    stats: &mut CopyStats,
) -> Result<()> {
    let id = conversation.id;
    let events = from.list_events(id, 0, i64::MAX).await?;
    let messages = prompts_stored_once(&events, from.list_messages(id).await?);
    let batch = Batch {
        fence: None,
        link: None,
        events,
        messages,
        tool_calls: from.list_tool_calls(id).await?,
        new_permissions: from
            .list_permissions(&PermissionFilter {
                pending_only: false,
                conversation_id: Some(id),
                owner: None,
                kind: None,
            })
            .await?,
        conversation: Some(ConversationPatch {
            status: conversation.status,
            acp_session_id: conversation.acp_session_id.clone(),
            last_seq: conversation.last_seq,
            current_turn_id: turn,
            updated_at: conversation.updated_at,
            state: Some(conversation.state.clone()),
            queue: Some(conversation.queue.clone()),
        }),
        lane: CommitQueue::Person,
        // Copied on their own, with those of removed conversations.
        usage: Vec::new(),
    };
    // The row first (the rest refers to it), then everything in one transaction.
    if fresh {
        let mut row = conversation.clone();
        row.last_seq = 0;
        // A node of the other database runs nothing here.
        row.node_id = None;
        to.insert_conversation(&row).await?;
    }
    to.commit(id, &batch).await?;
    // A worktree's totals, as last recorded (its worktree goes with the row).
    if let Some(totals) = &conversation.changes {
        to.set_change_totals(id, totals).await?;
    }
    let rules = from.list_rules(id).await?;
    for rule in &rules {
        to.upsert_rule(rule).await?;
    }
    // Who it is shared with (their events are in its history).
    let members = from.list_members(id).await?;
    for member in &members {
        to.put_member(id, member).await?;
    }
    stats.members += members.len();
    stats.conversations += 1;
    stats.events += batch.events.len();
    stats.messages += batch.messages.len();
    stats.tool_calls += batch.tool_calls.len();
    stats.permission_requests += batch.new_permissions.len();
    stats.rules += rules.len();
    Ok(())
}
