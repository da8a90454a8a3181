//! The search index's backlog: messages written before search existed are
//! listed by the migration that made the backlog (`search_backlog`), and a
//! running gateway indexes them in the background, a conversation at a
//! time, so a database upgraded in place finds its whole history. Commits
//! index what they write; nothing joins the backlog afterwards.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::backend::Store;
use super::search::search_text;
use crate::error::Result;

/// Conversations read from the backlog at a time.
const CONVERSATIONS: i64 = 20;
/// Messages read, and indexed in one transaction, per page: small, so that
/// the commits of running agents wait little behind it (on SQLite they
/// share one writer).
const MESSAGES: i64 = 100;
/// Most bytes of messages per page (at least one message): at most this much
/// text is indexed in one transaction.
const PAGE_BYTES: usize = 1 << 20;
/// How long it waits after a pass that failed, before the next: at first,
/// then twice as long each time, up to [`MOST_RETRY`].
const RETRY: Duration = Duration::from_secs(5);
const MOST_RETRY: Duration = Duration::from_secs(300);

/// What one pass over the backlog did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Messages that got text indexed.
    pub indexed: usize,
    /// Conversations the database failed (left in the backlog, whole from
    /// the page that failed on).
    pub failed: usize,
}

/// Indexes the backlog until none is left, or `shutdown` (a page cut short
/// commits nothing, and the next start takes it again).
pub async fn run(store: Arc<dyn Store>, shutdown: CancellationToken) {
    let mut indexed = 0;
    let mut retry = RETRY;
    loop {
        let pass = tokio::select! {
            _ = shutdown.cancelled() => return,
            pass = index_pass(&*store) => pass,
        };
        match pass {
            Ok(pass) if pass.failed == 0 => {
                indexed += pass.indexed;
                if indexed > 0 {
                    tracing::info!(
                        messages = indexed,
                        "search: the messages of earlier versions are indexed"
                    );
                }
                return;
            }
            Ok(pass) => {
                indexed += pass.indexed;
                tracing::warn!(conversations = pass.failed, retry_in = ?retry, "search: some conversations' earlier messages could not be indexed");
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?retry, "search: the backlog of earlier messages could not be read");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(MOST_RETRY);
    }
}

/// One pass over the backlog: each conversation in it indexed, as a commit
/// would have indexed each message (its text blocks, its parts joined). A
/// conversation the database refuses is passed over (and said in the log),
/// so that one cannot hold up the others; a database out of reach ends the
/// pass. With none failed, the backlog is empty afterwards.
pub async fn index_pass(store: &dyn Store) -> Result<Pass> {
    let mut pass = Pass::default();
    let mut after = None;
    loop {
        let conversations = store.search_backlog(CONVERSATIONS, after).await?;
        let Some(last) = conversations.last() else {
            return Ok(pass);
        };
        after = Some(*last);
        for id in conversations {
            if let Err(e) = index_conversation(store, id, &mut pass.indexed).await {
                // Out of reach: the others would fail alike; later.
                if e.is_outage() {
                    return Err(e);
                }
                tracing::warn!(conversation_id = %id, error = %e, "search: a conversation's earlier messages could not be indexed");
                pass.failed += 1;
            }
        }
    }
}

/// The conversation's backlog, a page of messages at a time (each page
/// committed adds how many of its messages got text to `indexed`).
async fn index_conversation(store: &dyn Store, id: Uuid, indexed: &mut usize) -> Result<()> {
    let mut after = None;
    loop {
        let page = store
            .list_messages_page(id, after, MESSAGES, PAGE_BYTES)
            .await?;
        let texts: Vec<(Uuid, String)> = page
            .items
            .iter()
            .map(|m| (m.id, search_text(&m.content)))
            .collect();
        *indexed += store.index_backlog(id, &texts, !page.more).await?;
        match page.items.last() {
            Some(last) if page.more => after = Some(last.id),
            _ => return Ok(()),
        }
    }
}
