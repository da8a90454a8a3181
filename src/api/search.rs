//! `GET /api/v1/search`: the caller's conversations (an operator's: all)
//! whose title holds the search or whose messages hold all its words, newest
//! first, each with a snippet of where it was found.

use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::extract::{AppQuery, Authed};
use super::page::{cut, newest_first};
use super::state::AppState;
use crate::error::{Error, Result};
use crate::model::{ConversationView, Page};

/// Longest search, in characters.
const Q_MAX_CHARS: usize = 200;
/// Characters of a snippet on each side of the first word found.
const SNIPPET_CONTEXT: usize = 60;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(search))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SearchQuery {
    /// Words to find (all of them, whole, any case) in what was said, or
    /// text in a title; 1 to 200 characters. Without a letter or digit
    /// it finds nothing.
    #[param(min_length = 1, max_length = 200)]
    q: String,
    /// 1 to 50 (default 20).
    #[param(minimum = 1, maximum = 50)]
    limit: Option<i64>,
    /// The `next_cursor` of the previous page.
    cursor: Option<uuid::Uuid>,
}

/// A conversation found, and where.
#[derive(Serialize, ToSchema)]
pub struct SearchHit {
    conversation: ConversationView,
    /// `title` or `message`.
    matched: &'static str,
    /// Some of the text around the first word found (the title, where that
    /// is what matched).
    snippet: String,
}

/// Conversations found, newest first (a page).
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct SearchHitList {
    items: Vec<SearchHit>,
    /// The cursor of the next page; `null` on the last.
    next_cursor: Option<String>,
}

/// Searches the caller's conversations.
#[utoipa::path(
    get, operation_id = "search", path = "/api/v1/search", tag = "conversations",
    params(SearchQuery),
    responses(
        (status = 200, description = "A page of conversations found, newest first", body = SearchHitList),
        (status = 422, description = "A search too long, or an invalid limit or cursor"),
    )
)]
async fn search(
    Authed { state, caller }: Authed,
    AppQuery(q): AppQuery<SearchQuery>,
) -> Result<Json<Page<SearchHit>>> {
    if q.q.is_empty() {
        return Err(Error::Unprocessable("q must not be empty".into()));
    }
    if q.q.chars().count() > Q_MAX_CHARS {
        return Err(Error::Unprocessable(format!(
            "q must be at most {Q_MAX_CHARS} characters"
        )));
    }
    let words = crate::store::search_words(&q.q);
    if words.is_empty() {
        // Nothing to look for finds nothing (an answer, not an error: the
        // document cannot say what a word is in every script).
        return Ok(Json(Page {
            items: Vec::new(),
            next_cursor: None,
        }));
    }
    let limit = newest_first(q.limit, 20, 50)?;
    let before = q.cursor;
    let owner = caller.owner_filter();
    let found = state
        .store()
        .search_conversations(&q.q, limit + 1, before, owner.as_deref())
        .await?;
    let Page {
        items: found,
        next_cursor,
    } = cut(found, limit, |(c, _)| c.id.to_string());
    let items = found
        .into_iter()
        .map(|(conversation, body)| {
            let (matched, snippet) = match body {
                Some(body) => ("message", snippet(&body, &words)),
                None => (
                    "title",
                    conversation
                        .title
                        .clone()
                        .or_else(|| conversation.state.title.clone())
                        .unwrap_or_default(),
                ),
            };
            SearchHit {
                conversation: conversation.into(),
                matched,
                snippet,
            }
        })
        .collect();
    Ok(Json(Page { items, next_cursor }))
}

/// The text around the first of `words` in `body` (any case), at most
/// [`SNIPPET_CONTEXT`] characters on each side, `…` where cut.
fn snippet(body: &str, words: &[String]) -> String {
    let lower = body.to_lowercase();
    // Lowercasing keeps byte offsets for the text agents write (ASCII and
    // most scripts); where it does not, the start is used.
    let at = words
        .iter()
        .filter_map(|w| lower.find(w.as_str()))
        .min()
        .filter(|&at| lower.len() == body.len() && body.is_char_boundary(at))
        .unwrap_or(0);
    let start = body[..at]
        .char_indices()
        .rev()
        .nth(SNIPPET_CONTEXT - 1)
        .map_or(0, |(i, _)| i);
    let end = body[at..]
        .char_indices()
        .nth(SNIPPET_CONTEXT + words[0].chars().count())
        .map_or(body.len(), |(i, _)| at + i);
    let mut text: String = body[start..end]
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if start > 0 {
        text.insert(0, '…');
    }
    if end < body.len() {
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snippet_is_the_text_around_the_first_word_found() {
        let words = vec!["needle".to_owned()];
        let body = format!(
            "{} The Needle is here. {}",
            "a ".repeat(100),
            "b ".repeat(100)
        );
        let shown = snippet(&body, &words);
        assert!(shown.starts_with('…') && shown.ends_with('…'), "{shown}");
        assert!(shown.contains("The Needle is here."), "{shown}");
        assert!(shown.chars().count() < 2 * SNIPPET_CONTEXT + 20, "{shown}");
        assert_eq!(snippet("short needle", &words), "short needle");
        // Lines are joined: a snippet is one line.
        assert_eq!(snippet("one\nneedle\n\ntwo", &words), "one needle two");
    }
}
