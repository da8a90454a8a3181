//! A database of each test's own: an SQLite file or a fresh Postgres
//! database, the macro that runs a test on both, and direct reads and
//! writes of what the gateway stored.

use std::path::Path;

use super::kill_shims_under;

/// The Postgres server that test databases are created on.
pub fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// Set (by `.ci/run`) to make a missing Postgres fail the Postgres tests
/// instead of skipping them.
pub const REQUIRE_POSTGRES: &str = "ACP_GATEWAY_REQUIRE_POSTGRES";

/// A database of one's own: an SQLite file in a temporary directory, or a
/// fresh Postgres database dropped (best effort) at the end of the test.
pub struct TestDb {
    pub url: String,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
    /// The gateway's state directory (its shims' sockets), the test's own.
    state: tempfile::TempDir,
}

impl TestDb {
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        TestDb {
            url: format!("sqlite://{}", dir.path().join("gateway.db").display()),
            pg_name: None,
            _dir: Some(dir),
            state: tempfile::tempdir().unwrap(),
        }
    }

    /// `None` when no Postgres answers and it is not required: the test is
    /// skipped (and says so).
    pub async fn postgres() -> Option<TestDb> {
        use sqlx::Connection;
        let admin = admin_url();
        let mut conn = match sqlx::PgConnection::connect(&admin).await {
            Ok(conn) => conn,
            Err(e) if std::env::var_os(REQUIRE_POSTGRES).is_none() => {
                eprintln!("skipping the Postgres variant: no Postgres at TEST_DATABASE_URL ({e})");
                return None;
            }
            Err(e) => panic!("{REQUIRE_POSTGRES} is set but Postgres is not reachable: {e}"),
        };
        let name = format!("acpgw_test_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(&format!("create database {name}"))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
        Some(TestDb {
            url: format!("{base}/{name}"),
            pg_name: Some(name),
            _dir: None,
            state: tempfile::tempdir().unwrap(),
        })
    }
}

impl TestDb {
    /// Runs SQL on the test's database directly (the statement for the
    /// backend this test runs on), e.g. to make the database refuse a row.
    pub async fn execute(&self, postgres_sql: &str, sqlite_sql: &str) {
        use sqlx::Connection;
        if self.pg_name.is_some() {
            let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
            sqlx::raw_sql(postgres_sql)
                .execute(&mut conn)
                .await
                .unwrap();
        } else {
            let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
            sqlx::raw_sql(sqlite_sql).execute(&mut conn).await.unwrap();
        }
    }
}

impl TestDb {
    /// One number the test's database answers `sql` with (a statement both
    /// backends take).
    pub async fn number(&self, sql: &str) -> i64 {
        let numbers = self.column::<i64>(sql).await;
        assert_eq!(numbers.len(), 1, "one row for {sql}");
        numbers[0]
    }

    /// The first column of every row the test's database answers `sql`
    /// with (a statement both backends take).
    pub async fn column<T>(&self, sql: &str) -> Vec<T>
    where
        T: Send
            + Unpin
            + sqlx::Type<sqlx::Postgres>
            + for<'r> sqlx::Decode<'r, sqlx::Postgres>
            + sqlx::Type<sqlx::Sqlite>
            + for<'r> sqlx::Decode<'r, sqlx::Sqlite>,
    {
        use sqlx::Connection;
        if self.pg_name.is_some() {
            let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
            sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
        } else {
            let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
            sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
        }
    }

    /// The state directory gateways on this database use (`state_dir`).
    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Shims (and their agents) a gateway of this test left running are
        // the test's to end.
        kill_shims_under(self.state.path());
        let Some(name) = self.pg_name.clone() else {
            return;
        };
        // Drop may run where no runtime can block: use a thread of our own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                use sqlx::Connection;
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url()).await {
                    let _ = sqlx::query(&format!("drop database if exists {name} with (force)"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

/// Runs each named `async fn name(db: TestDb)` once per backend: as
/// `sqlite::name` and `postgres::name`.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::TestDb::sqlite().await).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(db) = $crate::common::TestDb::postgres().await {
                        super::$name(db).await
                    }
                }
            )*
        }
    };
}

/// A new idle conversation of `owner` (nothing stored), for tests that
/// write to a store directly.
pub fn idle_conversation(owner: Option<&str>) -> acp_gateway::model::Conversation {
    use acp_gateway::model;
    model::Conversation {
        id: model::new_id(),
        agent: "demo".into(),
        title: None,
        cwd: "/tmp".into(),
        status: model::ConversationStatus::Idle,
        acp_session_id: None,
        last_seq: 0,
        created_at: model::now(),
        updated_at: model::now(),
        owner: owner.map(str::to_owned),
        state: Default::default(),
        node_id: None,
        queue: Vec::new(),
        forked_from: None,
        adopted_session: None,
        worktree: None,
        changes: None,
        spend: Vec::new(),
        sharing: Default::default(),
    }
}

/// The agent processes the gateway has recorded as running.
pub async fn agent_process_records(db: &TestDb) -> Vec<acp_gateway::store::AgentProcessRecord> {
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    store.list_agent_processes().await.unwrap()
}
