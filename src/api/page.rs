//! Lists in the contract's shape ([`Page`]): answered whole, or one page
//! of what the store read within its bounds, with the next cursor.

use axum::Json;

use crate::model::Page;
use crate::store::Bounded;

/// A list answered whole: one page with no cursor.
pub(crate) fn whole<T>(items: Vec<T>) -> Json<Page<T>> {
    Json(Page {
        items,
        next_cursor: None,
    })
}

/// One page of what the store read within `limit` and `max_page_bytes`,
/// with the cursor (`cursor` of its last item) when more follow.
pub(crate) fn paged<T>(page: Bounded<T>, cursor: impl Fn(&T) -> String) -> Json<Page<T>> {
    paged_as(page, cursor, Some)
}

/// [`paged`], each item then shown as `shown` makes it, or left out where
/// it gives `None`: the cursor stays that of the last item read.
pub(crate) fn paged_as<T, U>(
    page: Bounded<T>,
    cursor: impl Fn(&T) -> String,
    shown: impl FnMut(T) -> Option<U>,
) -> Json<Page<U>> {
    let next_cursor = page.more.then(|| page.items.last().map(&cursor)).flatten();
    Json(Page {
        items: page.items.into_iter().filter_map(shown).collect(),
        next_cursor,
    })
}

/// A newest-first list's query: its `limit` (1 to `max`, `default` where
/// absent); the cursor, the conversation id of the previous page's last,
/// is already a [`uuid::Uuid`] (the document says `format: uuid`).
pub(crate) fn newest_first(
    limit: Option<i64>,
    default: i64,
    max: i64,
) -> crate::error::Result<i64> {
    let limit = limit.unwrap_or(default);
    if !(1..=max).contains(&limit) {
        return Err(crate::error::Error::Unprocessable(format!(
            "limit must be between 1 and {max}"
        )));
    }
    Ok(limit)
}

/// `items` read one beyond `limit`, as a page: cut to `limit`, the cursor
/// (`id` of the last kept) where more follow.
pub(crate) fn cut<T>(mut items: Vec<T>, limit: i64, id: impl Fn(&T) -> String) -> Page<T> {
    let next_cursor = if items.len() as i64 > limit {
        items.truncate(limit as usize);
        items.last().map(id)
    } else {
        None
    };
    Page { items, next_cursor }
}
