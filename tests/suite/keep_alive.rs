//! A request answered before its body was read (401, a 404 for a malformed
//! id) leaves a kept-alive connection usable, or the answer says
//! `connection: close`: a client's next request never meets a connection
//! the gateway closed without a word. A raw HTTP/1.1 client, so that what
//! happens to the connection is seen, not hidden by a pool.

use crate::common::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// One HTTP/1.1 connection, kept alive.
struct Connection {
    stream: BufReader<TcpStream>,
}

/// An answer: its status, headers (names in lower case) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

impl Connection {
    async fn open(gw: &TestGateway) -> Connection {
        let addr = gw.base.trim_start_matches("http://");
        let stream = TcpStream::connect(addr).await.unwrap();
        // Headers and body go out as separate writes, as they would from
        // a client streaming a body: the gateway may answer in between.
        stream.set_nodelay(true).unwrap();
        Connection {
            stream: BufReader::new(stream),
        }
    }

    /// Sends a request: its head, then (separately) its body.
    async fn send(&mut self, method: &str, path: &str, token: Option<&str>, body: &[u8]) {
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: gateway\r\n");
        if let Some(token) = token {
            head += &format!("authorization: Bearer {token}\r\n");
        }
        if !body.is_empty() || method == "POST" {
            head += &format!(
                "content-type: application/json\r\ncontent-length: {}\r\n",
                body.len()
            );
        }
        head += "\r\n";
        let stream = self.stream.get_mut();
        if let Err(e) = stream.write_all(head.as_bytes()).await {
            panic!("the gateway closed the connection without saying so: {e}");
        }
        if !body.is_empty() {
            // The gateway may have answered and closed meanwhile: what is
            // written then is lost, and the answer says so.
            let _ = stream.write_all(body).await;
        }
    }

    /// Reads one answer (failing the test if the connection ends first).
    async fn answer(&mut self) -> Answer {
        tokio::time::timeout(WAIT, self.read_answer())
            .await
            .expect("an answer in time")
    }

    async fn read_answer(&mut self) -> Answer {
        let mut line = String::new();
        let n = self.stream.read_line(&mut line).await.unwrap();
        assert!(n > 0, "the connection was closed instead of answered");
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("a status line: {line:?}"));
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.stream.read_line(&mut line).await.unwrap();
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap();
            headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
        }
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map(|(_, v)| v.parse().unwrap())
            .expect("a content-length");
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).await.unwrap();
        Answer {
            status,
            headers,
            body: String::from_utf8(body).unwrap(),
        }
    }

    /// Whether the gateway closed the connection (reads to its end).
    async fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        matches!(
            tokio::time::timeout(WAIT, self.stream.read_to_end(&mut rest)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

async fn a_kept_alive_connection_survives_every_early_answer(db: TestDb) {
    let token = cli_token(&db, "alice", "operator");
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let unknown = uuid::Uuid::now_v7();
    // More than one read of the gateway's takes (a few KiB), less than what
    // it reads to keep a connection (64 KiB).
    let prompt = serde_json::json!({"text": "x".repeat(40 * 1024)}).to_string();
    let mut conn = Connection::open(&gw).await;
    for round in 0..200 {
        // No token: 401 before the body is read.
        conn.send(
            "POST",
            &format!("/api/v1/conversations/{unknown}/prompts"),
            None,
            prompt.as_bytes(),
        )
        .await;
        let answer = conn.answer().await;
        assert_eq!(answer.status, 401, "round {round}: {answer:?}");
        assert!(answer.body.contains("unauthorized"), "{answer:?}");
        assert!(!answer.closes(), "round {round}: {answer:?}");
        // A malformed id: 404 before the body is read.
        conn.send(
            "POST",
            "/api/v1/conversations/not-an-id/prompts",
            Some(&token),
            prompt.as_bytes(),
        )
        .await;
        let answer = conn.answer().await;
        assert_eq!(answer.status, 404, "round {round}: {answer:?}");
        assert!(!answer.closes(), "round {round}: {answer:?}");
        // A body the endpoint never reads.
        conn.send(
            "POST",
            &format!("/api/v1/conversations/{unknown}/cancel"),
            Some(&token),
            b"{}",
        )
        .await;
        assert_eq!(conn.answer().await.status, 404, "round {round}");
        // And the next request on the same connection is answered.
        conn.send("GET", "/api/v1/agents", Some(&token), b"").await;
        let answer = conn.answer().await;
        assert_eq!(answer.status, 200, "round {round}: {answer:?}");
        assert!(answer.body.contains("\"demo\""), "{answer:?}");
    }
}

async fn a_large_unread_body_gets_connection_close_and_the_next_connection_works(db: TestDb) {
    let token = cli_token(&db, "alice", "operator");
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let unknown = uuid::Uuid::now_v7();
    // Larger than what is read to keep a connection (64 KiB), within
    // max_body_bytes.
    let prompt = serde_json::json!({"text": "x".repeat(100 * 1024)}).to_string();
    for round in 0..50 {
        let mut conn = Connection::open(&gw).await;
        conn.send(
            "POST",
            &format!("/api/v1/conversations/{unknown}/prompts"),
            None,
            prompt.as_bytes(),
        )
        .await;
        let answer = conn.answer().await;
        assert_eq!(answer.status, 401, "round {round}: {answer:?}");
        assert!(answer.closes(), "round {round}: {answer:?}");
        assert!(conn.closed().await, "round {round}: said close, kept open");
        // A new connection carries the next request.
        let mut next = Connection::open(&gw).await;
        next.send("GET", "/api/v1/agents", Some(&token), b"").await;
        assert_eq!(next.answer().await.status, 200, "round {round}");
    }
}

backend_tests!(
    a_kept_alive_connection_survives_every_early_answer,
    a_large_unread_body_gets_connection_close_and_the_next_connection_works,
);
