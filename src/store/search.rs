//! Search: which conversations a query finds (their titles, and their
//! messages' text as each commit indexes it), and the backlog of messages
//! written before search existed (see [`super::search_backlog`]). A part of
//! [`Store`](super::Store) (its supertrait), written once for both backends
//! by [`impl_search_store!`]; how each backend matches words is its own.

use async_trait::async_trait;
use uuid::Uuid;

use crate::error::Result;
use crate::model::Conversation;

/// Persistence of the search index (see the module).
#[async_trait]
pub trait SearchStore: Send + Sync {
    /// Search (see [`search_words`]): conversations, newest first (paged
    /// like [`ConversationStore::list_conversations`](super::conversations::ConversationStore::list_conversations)),
    /// whose title holds `q` or whose messages' text holds all its words;
    /// each with the text of its first matching message (`None`: its title
    /// matched).
    async fn search_conversations(
        &self,
        q: &str,
        limit: i64,
        before: Option<Uuid>,
        owner: Option<&str>,
    ) -> Result<Vec<(Conversation, Option<String>)>>;
    /// Up to `limit` conversations (in id order, after `after`) with
    /// messages in the search backlog: written before search existed, so not
    /// indexed yet (see [`crate::store::search_backlog`]).
    async fn search_backlog(&self, limit: i64, after: Option<Uuid>) -> Result<Vec<Uuid>>;
    /// Indexes these messages of the conversation (id, whole text) in one
    /// transaction, each only if it is still in the backlog, which it leaves
    /// (so each is indexed once, whichever node gets there first). Text a
    /// commit has indexed for a message since stays after it. With
    /// `rest_done`, the conversation's other backlog rows go too. Answers
    /// how many messages got text indexed.
    async fn index_backlog(
        &self,
        conversation_id: Uuid,
        texts: &[(Uuid, String)],
        rest_done: bool,
    ) -> Result<usize>;
}

/// Most text of one message kept for search (what follows is not found).
pub const SEARCH_TEXT_MAX: usize = 64 * 1024;

/// The words of a search, as full-text matching takes them (letters and
/// digits; everything else separates them), at most 16.
pub fn search_words(q: &str) -> Vec<String> {
    q.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(16)
        .map(str::to_lowercase)
        .collect()
}

/// The text a message part adds to its message's search text: its text
/// blocks, at most [`SEARCH_TEXT_MAX`] bytes (cut at a character).
pub fn search_text(content: &[serde_json::Value]) -> String {
    let mut text = String::new();
    for block in content {
        if block.get("type").and_then(serde_json::Value::as_str) == Some("text") {
            if let Some(t) = block.get("text").and_then(serde_json::Value::as_str) {
                text.push_str(t);
            }
        }
        if text.len() >= SEARCH_TEXT_MAX {
            let mut end = SEARCH_TEXT_MAX;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            break;
        }
    }
    text
}

/// Implements [`SearchStore`] for a backend type with a `pool` field (for
/// reads) and a `writer()` method (the pool every write goes through). The
/// invoking module defines how its backend matches words: `AGENT_TITLE`
/// (the SQL of the title an agent gave conversation `c`, from its
/// `agent_state`), `SEARCH_MATCH` (the SQL condition under which a
/// `search_texts s` row matches the full-text query bound as `$1`) and `fn
/// search_query(&[String]) -> String` (that query, from a search's words);
/// and `CONVERSATION_SPEND`, as for
/// [`impl_conversation_store!`](super::conversations).
macro_rules! impl_search_store {
    ($store:ty) => {
        const _: () = {
            use uuid::Uuid;

            use $crate::error::Result;
            use $crate::model::Conversation;
            use $crate::store::rows::{text_col, SearchRow};

            #[async_trait::async_trait]
            impl $crate::store::search::SearchStore for $store {
                async fn search_conversations(
                    &self,
                    q: &str,
                    limit: i64,
                    before: Option<Uuid>,
                    owner: Option<&str>,
                ) -> Result<Vec<(Conversation, Option<String>)>> {
                    let words = $crate::store::search::search_words(q);
                    if words.is_empty() {
                        return Ok(Vec::new());
                    }
                    // Title: the words as typed, anywhere in it.
                    let like = format!(
                        "%{}%",
                        q.trim()
                            .to_lowercase()
                            // Postgres text holds no NUL.
                            .replace('\0', "")
                            .replace('\\', "\\\\")
                            .replace('%', "\\%")
                            .replace('_', "\\_")
                    );
                    let matched = SEARCH_MATCH;
                    // The title shown: the user's, else the agent's.
                    let agent_title = AGENT_TITLE;
                    // Those shared with the reader too, with their role.
                    let sharing = $crate::store::members::sharing_columns("$4");
                    let shared = $crate::store::members::shared_with("$4");
                    // Each conversation's first matching message, found once; a
                    // conversation counts where it has one or its title holds `q`;
                    // each found with what it spent.
                    let found = format!(
                        "select c.*, {CONVERSATION_SPEND} as spend from (
                           select c.*, {sharing},
                             (select s.body from search_texts s
                              where s.conversation_id = c.id and {matched}
                              order by s.message_id limit 1) as found
                           from conversations c
                           where ($3 is null or c.id < $3)
                             and ($4 is null or c.owner = $4 or {shared})
                         ) c
                         where c.found is not null
                            or lower(coalesce(c.title, {agent_title}, '')) like $2 escape '\\'
                         order by c.id desc limit $5"
                    );
                    sqlx::query_as::<_, SearchRow>(&found)
                        .bind(search_query(&words))
                        .bind(&like)
                        .bind(before)
                        .bind(owner)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?
                        .into_iter()
                        .map(|row| Ok((row.conversation.into_conversation()?, row.found)))
                        .collect()
                }

                async fn search_backlog(
                    &self,
                    limit: i64,
                    after: Option<Uuid>,
                ) -> Result<Vec<Uuid>> {
                    Ok(sqlx::query_scalar(
                        "select distinct conversation_id from search_backlog
                         where $2 is null or conversation_id > $2
                         order by conversation_id limit $1",
                    )
                    .bind(limit)
                    .bind(after)
                    .fetch_all(&self.pool)
                    .await?)
                }

                async fn index_backlog(
                    &self,
                    conversation_id: Uuid,
                    texts: &[(Uuid, String)],
                    rest_done: bool,
                ) -> Result<usize> {
                    let mut tx = self.writer().begin().await?;
                    let mut indexed = 0;
                    for (message_id, text) in texts {
                        let taken = sqlx::query("delete from search_backlog where message_id = $1")
                            .bind(message_id)
                            .execute(&mut *tx)
                            .await?
                            .rows_affected()
                            > 0;
                        if !taken || text.is_empty() {
                            continue;
                        }
                        // Before what a commit indexed since the message was
                        // read (its newer parts): a part read twice is found
                        // twice, nothing worse.
                        sqlx::query(
                            "insert into search_texts (message_id, conversation_id, body)
                             values ($1, $2, $3)
                             on conflict (message_id) do update
                               set body = excluded.body || search_texts.body",
                        )
                        .bind(message_id)
                        .bind(conversation_id)
                        .bind(text_col(text))
                        .execute(&mut *tx)
                        .await?;
                        indexed += 1;
                    }
                    if rest_done {
                        sqlx::query("delete from search_backlog where conversation_id = $1")
                            .bind(conversation_id)
                            .execute(&mut *tx)
                            .await?;
                    }
                    tx.commit().await?;
                    Ok(indexed)
                }
            }
        };
    };
}

pub(crate) use impl_search_store;
