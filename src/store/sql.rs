//! The SQL both backends share. Postgres and SQLite accept the same
//! statements here (`$n` parameters, `on conflict`, `returning`), and every
//! bound and decoded type exists in both drivers, so [`impl_store!`] writes
//! the [`Store`](super::backend::Store) implementation once and each backend expands
//! it against its own pool. A backend supplies only what differs: its
//! `insert_events` (Postgres inserts a whole batch with one `unnest`) and
//! the statements that do in one round trip what a transaction does in
//! several (Postgres only: SQLite has no round trips to save).

/// Implements [`Store`](super::backend::Store) for a backend type with a `pool` field (for
/// reads), a `writer()` method (the pool every write goes through) and a `lanes` field
/// ([`Lanes`](super::backend::Lanes): who goes first to the writer). The invoking module
/// must define
/// `AGENT_TITLE` (the SQL of the title an agent gave conversation `c`,
/// from its `agent_state`), `SEARCH_MATCH` (the SQL condition under which a `search_texts s` row
/// matches the full-text query bound as `$1`), `fn search_query(&[String])
/// -> String` (that query, from a search's words),
/// `async fn insert_events(&mut Connection, Uuid, &[Event]) -> Result<()>`,
/// `async fn commit_at_once(&Pool, Uuid, &Batch) -> Result<bool>` (a whole
/// commit in one statement where the backend can: `false` where it cannot,
/// and the general transaction writes it) and
/// `async fn resolve_at_once(&Pool, &Resolution, &Event, &ConversationPatch, Option<i64>) -> Result<Option<Event>>`
/// (a resolution in one statement where the backend can: `None` where it
/// cannot, or the stored request is not as the resolution expects, and the
/// general transaction decides).
macro_rules! impl_store {
    ($store:ty, $conn:ty) => {
        use futures::TryStreamExt as _;

        async fn update_conversation(
            tx: &mut $conn,
            conversation_id: Uuid,
            patch: &ConversationPatch,
        ) -> Result<()> {
            let query = sqlx::query(
                "update conversations set status = $2, acp_session_id = $3, last_seq = $4,
                   current_turn_id = $5, updated_at = $6, agent_state = coalesce($7, agent_state)
                 where id = $1",
            )
            .bind(conversation_id);
            bind_patch(query, patch).execute(tx).await?;
            Ok(())
        }

        type Db = <$conn as sqlx::Connection>::Database;

        /// Holds the conversation for this transaction if its owner epoch is
        /// still `fence` (a write lock on its row, so no claim slips in
        /// before the commit); otherwise the transaction writes nothing.
        async fn fence(tx: &mut $conn, conversation_id: Uuid, fence: Option<i64>) -> Result<()> {
            let Some(epoch) = fence else { return Ok(()) };
            let held = sqlx::query(
                "update conversations set owner_epoch = owner_epoch
                 where id = $1 and owner_epoch = $2",
            )
            .bind(conversation_id)
            .bind(epoch)
            .execute(tx)
            .await?
            .rows_affected();
            if held == 0 {
                return Err($crate::error::Error::Fenced(conversation_id));
            }
            Ok(())
        }

        /// Binds a patch's six columns (status, acp_session_id, last_seq,
        /// current_turn_id, updated_at, agent_state), in that order.
        fn bind_patch<'q>(
            query: sqlx::query::Query<'q, Db, <Db as sqlx::Database>::Arguments<'q>>,
            patch: &'q ConversationPatch,
        ) -> sqlx::query::Query<'q, Db, <Db as sqlx::Database>::Arguments<'q>> {
            query
                .bind(patch.status.as_str())
                .bind(patch.acp_session_id.as_deref().map(text_col))
                .bind(patch.last_seq)
                .bind(patch.current_turn_id)
                .bind(patch.updated_at)
                .bind(patch.state.as_ref().map(JsonText::of))
        }

        #[async_trait::async_trait]
        impl Store for $store {
            async fn ping(&self) -> Result<()> {
                sqlx::query("select 1").execute(&self.pool).await?;
                Ok(())
            }

            async fn insert_conversation(&self, c: &Conversation) -> Result<()> {
                sqlx::query(
                    "insert into conversations (id, agent, title, cwd, status, acp_session_id,
                       last_seq, created_at, updated_at, owner, agent_state, node_id)
                     values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                )
                .bind(c.id)
                .bind(&c.agent)
                .bind(&c.title)
                .bind(&c.cwd)
                .bind(c.status.as_str())
                .bind(&c.acp_session_id)
                .bind(c.last_seq)
                .bind(c.created_at)
                .bind(c.updated_at)
                .bind(&c.owner)
                .bind(JsonText::of(&c.state))
                .bind(c.node_id)
                .execute(self.writer())
                .await?;
                Ok(())
            }

            async fn get_conversation(&self, id: Uuid) -> Result<Option<Conversation>> {
                sqlx::query_as::<_, ConversationRow>("select * from conversations where id = $1")
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?
                    .map(ConversationRow::into_conversation)
                    .transpose()
            }

            async fn list_conversations(
                &self,
                limit: i64,
                before: Option<Uuid>,
                owner: Option<&str>,
            ) -> Result<Vec<Conversation>> {
                sqlx::query_as::<_, ConversationRow>(
                    "select * from conversations
                     where ($1 is null or id < $1) and ($3 is null or owner = $3)
                     order by id desc limit $2",
                )
                .bind(before)
                .bind(limit)
                .bind(owner)
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(ConversationRow::into_conversation)
                .collect()
            }

            async fn search_conversations(
                &self,
                q: &str,
                limit: i64,
                before: Option<Uuid>,
                owner: Option<&str>,
            ) -> Result<Vec<(Conversation, Option<String>)>> {
                let words = $crate::store::backend::search_words(q);
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
                // Each conversation's first matching message, found once; a
                // conversation counts where it has one or its title holds `q`.
                let found = format!(
                    "select * from (
                       select c.*,
                         (select s.body from search_texts s
                          where s.conversation_id = c.id and {matched}
                          order by s.message_id limit 1) as found
                       from conversations c
                       where ($3 is null or c.id < $3) and ($4 is null or c.owner = $4)
                     ) c
                     where c.found is not null
                        or lower(coalesce(c.title, {agent_title}, '')) like $2 escape '\\'
                     order by c.id desc limit $5"
                );
                sqlx::query_as::<_, $crate::store::rows::SearchRow>(&found)
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

            async fn search_backlog(&self, limit: i64, after: Option<Uuid>) -> Result<Vec<Uuid>> {
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

            async fn live_conversations(&self) -> Result<Vec<(Conversation, Option<Uuid>)>> {
                sqlx::query_as::<_, ConversationRow>(
                    "select * from conversations
                     where status in ('starting', 'running', 'awaiting_permission')
                     order by id",
                )
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(ConversationRow::into_parts)
                .collect()
            }

            async fn commit(&self, conversation_id: Uuid, batch: &Batch) -> Result<()> {
                if batch.is_empty() {
                    return Ok(());
                }
                let _place = self.lanes.enter(batch.lane).await;
                if commit_at_once(self.writer(), conversation_id, batch).await? {
                    crate::telemetry::transaction(batch.rows());
                    return Ok(());
                }
                let mut tx = self.writer().begin().await?;
                fence(&mut tx, conversation_id, batch.fence).await?;
                // Permission requests first: an event announcing one must
                // never be visible without the request itself.
                for p in &batch.new_permissions {
                    sqlx::query(
                        "insert into permission_requests (id, conversation_id, turn_id,
                           tool_call, options, status, decision, created_at)
                         values ($1, $2, $3, $4, $5, $6, $7, $8)",
                    )
                    .bind(p.id)
                    .bind(p.conversation_id)
                    .bind(p.turn_id)
                    .bind(JsonText::of(&p.tool_call))
                    .bind(JsonText::of(&p.options))
                    .bind(p.status.as_str())
                    .bind(p.decision.as_ref().map(JsonText::of))
                    .bind(p.created_at)
                    .execute(&mut *tx)
                    .await?;
                }
                insert_events(&mut tx, conversation_id, &batch.events).await?;
                for MessagePart { part, message: m, content_in_event } in &batch.messages {
                    // Idempotent: a commit retried after its answer was
                    // lost must not fail on what it wrote.
                    let query = if *part == 0 {
                        // A prompt's content is its event's: not stored again.
                        let content = match content_in_event {
                            Some(_) => JsonText("[]".into()),
                            None => JsonText::of(&m.content),
                        };
                        sqlx::query(
                            "insert into messages (id, conversation_id, turn_id, role, content,
                               created_at, prompt_seq)
                             values ($1, $2, $3, $4, $5, $6, $7)
                             on conflict (id) do nothing",
                        )
                        .bind(m.id)
                        .bind(conversation_id)
                        .bind(m.turn_id)
                        .bind(m.role.as_str())
                        .bind(content)
                        .bind(m.created_at)
                        .bind(*content_in_event)
                    } else {
                        sqlx::query(
                            "insert into message_parts (conversation_id, message_id, part, content)
                             values ($1, $2, $3, $4)
                             on conflict do nothing",
                        )
                        .bind(conversation_id)
                        .bind(m.id)
                        .bind(*part)
                        .bind(JsonText::of(&m.content))
                    };
                    query.execute(&mut *tx).await?;
                    // Its text for search, joined to what came before it
                    // (up to a cap, so a huge message costs no more). A
                    // commit retried after its answer was lost may add its
                    // part twice: found twice, nothing worse.
                    let text = $crate::store::backend::search_text(&m.content);
                    if !text.is_empty() {
                        sqlx::query(
                            "insert into search_texts (message_id, conversation_id, body)
                             values ($1, $2, $3)
                             on conflict (message_id) do update
                               set body = search_texts.body || excluded.body
                               where length(search_texts.body) < $4",
                        )
                        .bind(m.id)
                        .bind(conversation_id)
                        .bind(text_col(&text))
                        .bind($crate::store::backend::SEARCH_TEXT_MAX as i64)
                        .execute(&mut *tx)
                        .await?;
                    }
                }
                for t in &batch.tool_calls {
                    sqlx::query(
                        "insert into tool_calls (conversation_id, tool_call_id, turn_id, title, kind,
                           status, content, locations, raw_input, raw_output, created_at, updated_at)
                         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                         on conflict (conversation_id, tool_call_id) do update set
                           title = excluded.title, kind = excluded.kind, status = excluded.status,
                           content = excluded.content, locations = excluded.locations,
                           raw_input = excluded.raw_input, raw_output = excluded.raw_output,
                           updated_at = excluded.updated_at",
                    )
                    .bind(conversation_id)
                    .bind(text_col(&t.tool_call_id))
                    .bind(t.turn_id)
                    .bind(t.title.as_deref().map(text_col))
                    .bind(t.kind.as_deref().map(text_col))
                    .bind(t.status.as_deref().map(text_col))
                    .bind(t.content.as_ref().map(JsonText::of))
                    .bind(t.locations.as_ref().map(JsonText::of))
                    .bind(t.raw_input.as_ref().map(JsonText::of))
                    .bind(t.raw_output.as_ref().map(JsonText::of))
                    .bind(t.created_at)
                    .bind(t.updated_at)
                    .execute(&mut *tx)
                    .await?;
                }
                match (&batch.conversation, batch.events.last()) {
                    (Some(patch), _) => update_conversation(&mut tx, conversation_id, patch).await?,
                    // A piece of a refused batch: `last_seq` keeps up with
                    // its events (see `Store::commit`).
                    (None, Some(newest)) => {
                        sqlx::query(
                            "update conversations set last_seq = $2
                             where id = $1 and last_seq < $2",
                        )
                        .bind(conversation_id)
                        .bind(newest.seq)
                        .execute(&mut *tx)
                        .await?;
                    }
                    (None, None) => {}
                }
                if let Some(link) = &batch.link {
                    sqlx::query("update agent_processes set link = $2 where conversation_id = $1")
                        .bind(conversation_id)
                        .bind(JsonText::of(link))
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                crate::telemetry::transaction(batch.rows());
                Ok(())
            }

            async fn resolve_permission(
                &self,
                resolution: &Resolution,
                mut event: Event,
                patch: &ConversationPatch,
                fence_at: Option<i64>,
            ) -> Result<Option<(PermissionRequest, Event)>> {
                let at_once = resolve_at_once(self.writer(), resolution, &event, patch, fence_at);
                if let Some(event) = at_once.await? {
                    crate::telemetry::transaction(3);
                    return Ok(Some((resolution.resolved(), event)));
                }
                let mut tx = self.writer().begin().await?;
                fence(&mut tx, event.conversation_id, fence_at).await?;
                // A write first: the transaction takes the write lock at once.
                let row = sqlx::query_as::<_, PermissionRow>(
                    "update permission_requests set status = $2, decision = $3
                     where id = $1 and status = 'pending' returning *",
                )
                .bind(resolution.request.id)
                .bind(resolution.status.as_str())
                .bind(JsonText::of(&resolution.decision))
                .fetch_optional(&mut *tx)
                .await?;
                let Some(row) = row else {
                    return Ok(None);
                };
                let request = PermissionRequest::try_from(row)?;
                event.body = crate::model::EventBody::PermissionResolved(request.clone());
                insert_events(&mut tx, event.conversation_id, std::slice::from_ref(&event)).await?;
                update_conversation(&mut tx, event.conversation_id, patch).await?;
                tx.commit().await?;
                // The request, its event and the conversation.
                crate::telemetry::transaction(3);
                Ok(Some((request, event)))
            }

            async fn list_events(
                &self,
                conversation_id: Uuid,
                after: i64,
                limit: i64,
            ) -> Result<Vec<Event>> {
                let rows = sqlx::query_as::<_, EventRow>(
                    "select * from events where conversation_id = $1 and seq > $2
                     order by seq limit $3",
                )
                .bind(conversation_id)
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows.into_iter().map(Event::from).collect())
            }

            async fn last_event_seq(&self, conversation_id: Uuid) -> Result<i64> {
                let newest: Option<i64> =
                    sqlx::query_scalar("select max(seq) from events where conversation_id = $1")
                        .bind(conversation_id)
                        .fetch_one(&self.pool)
                        .await?;
                Ok(newest.unwrap_or(0))
            }

            async fn list_events_page(
                &self,
                conversation_id: Uuid,
                after: i64,
                limit: i64,
                max_bytes: usize,
            ) -> Result<Bounded<Event>> {
                let mut page = Bounded::new(limit, max_bytes);
                // Streamed: what lies past the bound is never held.
                let mut rows = sqlx::query_as::<_, EventRow>(
                    "select * from events where conversation_id = $1 and seq > $2
                     order by seq limit $3",
                )
                .bind(conversation_id)
                .bind(after)
                .bind(limit)
                .fetch(&self.pool);
                while let Some(row) = rows.try_next().await? {
                    if !page.push(Event::from(row)) || page.is_full() {
                        break;
                    }
                }
                Ok(page)
            }

            async fn list_events_of_type(
                &self,
                conversation_id: Uuid,
                kind: &str,
                after: i64,
                limit: i64,
                max_bytes: usize,
            ) -> Result<Bounded<Event>> {
                let mut page = Bounded::new(limit, max_bytes);
                let mut rows = sqlx::query_as::<_, EventRow>(
                    "select * from events where conversation_id = $1 and type = $2 and seq > $3
                     order by seq limit $4",
                )
                .bind(conversation_id)
                .bind(kind)
                .bind(after)
                .bind(limit)
                .fetch(&self.pool);
                while let Some(row) = rows.try_next().await? {
                    if !page.push(Event::from(row)) || page.is_full() {
                        break;
                    }
                }
                Ok(page)
            }

            async fn last_message(&self, conversation_id: Uuid) -> Result<Option<(Message, i32)>> {
                let row: Option<(Uuid, Option<Uuid>, String, chrono::DateTime<chrono::Utc>, i64)> =
                    sqlx::query_as(
                    "select m.id, m.turn_id, m.role, m.created_at,
                       (select count(*) from message_parts p
                        where p.conversation_id = m.conversation_id and p.message_id = m.id)
                     from messages m where m.conversation_id = $1
                     order by m.id desc limit 1",
                )
                .bind(conversation_id)
                .fetch_optional(&self.pool)
                .await?;
                let Some((id, turn_id, role, created_at, parts)) = row else {
                    return Ok(None);
                };
                let role = crate::model::MessageRole::parse(&role)
                    .ok_or_else(|| {
                        crate::error::Error::Internal(anyhow::anyhow!("message role {role:?}"))
                    })?;
                let message = Message {
                    id,
                    turn_id,
                    role,
                    content: Vec::new(),
                    created_at,
                };
                Ok(Some((message, 1 + parts as i32)))
            }

            async fn list_messages(&self, conversation_id: Uuid) -> Result<Vec<Message>> {
                let page = self
                    .list_messages_page(conversation_id, None, i64::MAX, usize::MAX)
                    .await?;
                Ok(page.items)
            }

            async fn list_messages_page(
                &self,
                conversation_id: Uuid,
                after: Option<Uuid>,
                limit: i64,
                max_bytes: usize,
            ) -> Result<Bounded<Message>> {
                let mut page = Bounded::new(limit, max_bytes);
                {
                    // A prompt's content is read from its `turn_started`.
                    let mut rows = sqlx::query_as::<_, MessageRow>(
                        "select m.id, m.turn_id, m.role, m.content, m.created_at, e.data as prompt
                         from messages m
                         left join events e on e.conversation_id = m.conversation_id
                           and e.seq = m.prompt_seq
                         where m.conversation_id = $1 and ($2 is null or m.id > $2)
                         order by m.id limit $3",
                    )
                    .bind(conversation_id)
                    .bind(after)
                    .bind(limit)
                    .fetch(&self.pool);
                    while let Some(row) = rows.try_next().await? {
                        if !page.push(Message::try_from(row)?) || page.is_full() {
                            break;
                        }
                    }
                }
                let (Some(first), Some(last)) = (page.items.first(), page.items.last()) else {
                    return Ok(page);
                };
                let (first, last) = (first.id, last.id);
                let mut parts = sqlx::query_as::<_, MessagePartRow>(
                    "select message_id, content from message_parts
                     where conversation_id = $1 and message_id >= $2 and message_id <= $3
                     order by message_id, part",
                )
                .bind(conversation_id)
                .bind(first)
                .bind(last)
                .fetch(&self.pool);
                // Both in id order: one pass joins every part to its message.
                let mut at = 0;
                while let Some(part) = parts.try_next().await? {
                    while page.items.get(at).is_some_and(|m| m.id != part.message_id) {
                        at += 1;
                    }
                    if at >= page.items.len() {
                        break;
                    }
                    let size = json_size(&part.content.0);
                    if at == 0 {
                        // The first message is the page's whatever its size.
                        page.count(size);
                    } else if !page.grow(size) {
                        // This message passes the bound: the page ends
                        // before it, and it starts the next.
                        page.items.truncate(at);
                        break;
                    }
                    page.items[at].extend(part.content.0);
                }
                Ok(page)
            }

            async fn list_tool_calls(&self, conversation_id: Uuid) -> Result<Vec<ToolCall>> {
                let rows = sqlx::query_as::<_, ToolCallRow>(
                    "select * from tool_calls where conversation_id = $1
                     order by created_at, tool_call_id",
                )
                .bind(conversation_id)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows.into_iter().map(ToolCall::from).collect())
            }

            async fn get_permission(&self, id: Uuid) -> Result<Option<PermissionRequest>> {
                sqlx::query_as::<_, PermissionRow>("select * from permission_requests where id = $1")
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?
                    .map(PermissionRequest::try_from)
                    .transpose()
            }

            async fn list_permissions(
                &self,
                filter: &PermissionFilter,
            ) -> Result<Vec<PermissionRequest>> {
                // Ids are UUIDv7: their order is the order of creation.
                sqlx::query_as::<_, PermissionRow>(
                    "select p.* from permission_requests p
                     join conversations c on c.id = p.conversation_id
                     where ($1 = false or p.status = 'pending')
                       and ($2 is null or p.conversation_id = $2)
                       and ($3 is null or c.owner = $3)
                     order by p.id",
                )
                .bind(filter.pending_only)
                .bind(filter.conversation_id)
                .bind(&filter.owner)
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(PermissionRequest::try_from)
                .collect()
            }

            async fn upsert_rule(&self, rule: &Rule) -> Result<Rule> {
                let row = sqlx::query_as::<_, RuleRow>(
                    "insert into permission_rules (id, conversation_id, tool_kind, subject,
                       option_kind, permission_id, created_at)
                     values ($1, $2, $3, $4, $5, $6, $7)
                     on conflict (conversation_id, tool_kind, subject) do update set
                       option_kind = excluded.option_kind, permission_id = excluded.permission_id,
                       created_at = excluded.created_at
                     returning *",
                )
                .bind(rule.id)
                .bind(rule.conversation_id)
                .bind(text_col(&rule.tool_kind))
                .bind(text_col(&rule.subject))
                .bind(&rule.option_kind)
                .bind(rule.permission_id)
                .bind(rule.created_at)
                .fetch_one(self.writer())
                .await?;
                Ok(row.into())
            }

            async fn list_rules(&self, conversation_id: Uuid) -> Result<Vec<Rule>> {
                let rows = sqlx::query_as::<_, RuleRow>(
                    "select * from permission_rules where conversation_id = $1 order by id",
                )
                .bind(conversation_id)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows.into_iter().map(Rule::from).collect())
            }

            async fn delete_rule(&self, conversation_id: Uuid, rule_id: Uuid) -> Result<bool> {
                let done = sqlx::query(
                    "delete from permission_rules where conversation_id = $1 and id = $2",
                )
                .bind(conversation_id)
                .bind(rule_id)
                .execute(self.writer())
                .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn current_policies(&self) -> Result<Option<PolicySet>> {
                let row = sqlx::query_as::<_, PolicySetRow>(
                    "select * from policy_sets order by id desc limit 1",
                )
                .fetch_optional(&self.pool)
                .await?;
                Ok(row.map(PolicySet::from))
            }

            async fn save_policies(&self, set: &PolicySet) -> Result<()> {
                sqlx::query(
                    "insert into policy_sets (id, rules, updated_by, updated_at)
                     values ($1, $2, $3, $4)",
                )
                .bind(set.id)
                .bind(JsonText::of(&set.rules))
                .bind(&set.updated_by)
                .bind(set.updated_at)
                .execute(self.writer())
                .await?;
                Ok(())
            }

            async fn count_conversations_by_status(&self) -> Result<Vec<(String, i64)>> {
                Ok(sqlx::query_as(
                    "select status, count(*) from conversations group by status order by status",
                )
                .fetch_all(&self.pool)
                .await?)
            }

            async fn count_pending_permissions(&self) -> Result<i64> {
                let (count,): (i64,) = sqlx::query_as(
                    "select count(*) from permission_requests where status = 'pending'",
                )
                .fetch_one(&self.pool)
                .await?;
                Ok(count)
            }

            async fn record_agent_process(
                &self,
                record: &super::backend::AgentProcessRecord,
            ) -> Result<()> {
                sqlx::query(
                    "insert into agent_processes (conversation_id, pid, start_time, boot_id,
                       pid_namespace, hostname, started_at, shim_socket, link)
                     values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                     on conflict (conversation_id) do update set
                       pid = excluded.pid, start_time = excluded.start_time,
                       boot_id = excluded.boot_id, pid_namespace = excluded.pid_namespace,
                       hostname = excluded.hostname, started_at = excluded.started_at,
                       shim_socket = excluded.shim_socket, link = excluded.link",
                )
                .bind(record.conversation_id)
                .bind(record.pid)
                .bind(record.start_time)
                .bind(&record.boot_id)
                .bind(&record.pid_namespace)
                .bind(&record.hostname)
                .bind(record.started_at)
                .bind(&record.shim_socket)
                .bind(&record.link)
                .execute(self.writer())
                .await?;
                Ok(())
            }

            async fn forget_agent_process(
                &self,
                record: &super::backend::AgentProcessRecord,
            ) -> Result<()> {
                sqlx::query(
                    "delete from agent_processes where conversation_id = $1 and pid = $2
                       and start_time = $3 and boot_id = $4 and pid_namespace = $5",
                )
                .bind(record.conversation_id)
                .bind(record.pid)
                .bind(record.start_time)
                .bind(&record.boot_id)
                .bind(&record.pid_namespace)
                .execute(self.writer())
                .await?;
                Ok(())
            }

            async fn list_agent_processes(&self) -> Result<Vec<super::backend::AgentProcessRecord>> {
                Ok(sqlx::query_as::<_, super::backend::AgentProcessRecord>(
                    "select * from agent_processes order by conversation_id",
                )
                .fetch_all(&self.pool)
                .await?)
            }
        }
    };
}

pub(crate) use impl_store;
