//! The search index's backlog: messages written before search existed are
//! listed by the migration that made the backlog (`search_backlog`), and a
//! running gateway indexes them in the background, a conversation at a
//! time, so a database upgraded in place finds its whole history. Commits
//! index what they write; nothing joins the backlog afterwards.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::backend::{search_text, Store};
use crate::error::Result;

/// Conversations taken from the backlog per round.
const CONVERSATIONS: i64 = 20;
/// Messages read, and indexed in one transaction, per page: small, so that
/// the commits of running agents wait little behind it (on SQLite they
/// share one writer).
const MESSAGES: i64 = 100;
/// Most bytes of messages per page (at least one message): at most this much
/// text is indexed in one transaction.
const PAGE_BYTES: usize = 1 << 20;
/// How long it waits after the database failed it, before trying again:
/// at first, then twice as long each time, up to [`MOST_RETRY`].
const RETRY: Duration = Duration::from_secs(5);
const MOST_RETRY: Duration = Duration::from_secs(300);

/// Indexes the backlog until none is left, or `shutdown` (a round cut short
/// commits nothing of its page, and the next start takes it again).
pub async fn run(store: Arc<dyn Store>, shutdown: CancellationToken) {
    let mut indexed = 0;
    let mut retry = RETRY;
    loop {
        let round = tokio::select! {
            _ = shutdown.cancelled() => return,
            round = index_some(&*store) => round,
        };
        match round {
            Ok(Some(n)) => {
                indexed += n;
                retry = RETRY;
            }
            Ok(None) => {
                if indexed > 0 {
                    tracing::info!(
                        messages = indexed,
                        "search: the messages of earlier versions are indexed"
                    );
                }
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?retry, "search: indexing earlier messages failed");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(MOST_RETRY);
            }
        }
    }
}

/// One round: the backlog of up to [`CONVERSATIONS`] conversations indexed,
/// each message's text as a commit would have indexed it (its text blocks,
/// its parts joined). How many messages got text; `None`: the backlog is
/// empty.
pub async fn index_some(store: &dyn Store) -> Result<Option<usize>> {
    let conversations = store.search_backlog(CONVERSATIONS).await?;
    if conversations.is_empty() {
        return Ok(None);
    }
    let mut indexed = 0;
    for id in conversations {
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
            indexed += store.index_backlog(id, &texts, !page.more).await?;
            match page.items.last() {
                Some(last) if page.more => after = Some(last.id),
                _ => break,
            }
        }
    }
    Ok(Some(indexed))
}
