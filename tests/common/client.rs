//! A client of one gateway's REST API and its WebSockets, and what tests
//! assert of its answers.

use serde_json::{json, Value};
use tokio_tungstenite::MaybeTlsStream;

use super::{Ws, WAIT};

/// A client of one gateway's API: what every harness (an in-process
/// [`TestGateway`], a [`GatewayProcess`]) offers through `Deref`, so a
/// method means the same whichever a test started.
#[derive(Clone)]
pub struct Client {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub http: reqwest::Client,
    /// The bearer token every request (WebSockets too) carries, if any.
    pub token: Option<String>,
}

impl Client {
    pub fn new(base: String) -> Client {
        Client {
            base,
            http: reqwest::Client::new(),
            token: None,
        }
    }

    /// The same gateway as the holder of `token`: every call carries it.
    pub fn with_token(&self, token: &str) -> Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        Client {
            base: self.base.clone(),
            http: reqwest::Client::builder()
                .default_headers(headers)
                .build()
                .unwrap(),
            token: Some(token.to_owned()),
        }
    }

    /// One REST call; the status and the JSON answer (or its text).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(method, path, None, body).await
    }

    /// One REST call with an optional bearer token (on top of this
    /// client's) and JSON body; the status and the JSON answer (or its text).
    pub async fn call_as(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method.parse().unwrap(), self.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        decode(request.send().await.unwrap()).await
    }

    /// GETs with a bearer token (if given).
    pub async fn get_as(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.call_as("GET", path, token, None).await
    }

    /// POSTs JSON with a bearer token (if given).
    pub async fn post_as(&self, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
        self.call_as("POST", path, token, Some(body)).await
    }

    /// DELETEs with a bearer token (if given).
    pub async fn delete_as(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.call_as("DELETE", path, token, None).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, Some(body)).await
    }

    pub async fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> (u16, Value) {
        let resp = self
            .http
            .post(self.url(path))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        decode(resp).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.call("DELETE", path, None).await
    }

    /// Creates a token over the API as `operator`; returns (token, id).
    pub async fn make_token(&self, operator: &str, user: &str, role: &str) -> (String, String) {
        let body = json!({"user": user, "role": role});
        let (status, body) = self.post_as("/api/v1/tokens", Some(operator), body).await;
        assert_eq!(status, 201, "{body}");
        (
            body["token"].as_str().unwrap().to_owned(),
            body["id"].as_str().unwrap().to_owned(),
        )
    }

    /// Creates a conversation with `agent` (asserting 201); its id.
    pub async fn create(&self, agent: &str) -> String {
        self.create_conversation(agent).await["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Creates a conversation and returns its JSON (asserting 201).
    pub async fn create_conversation(&self, agent: &str) -> Value {
        let (status, body) = self
            .post("/api/v1/conversations", json!({"agent": agent}))
            .await;
        assert_eq!(status, 201, "create conversation: {body}");
        body
    }

    /// A new conversation with `agent` and a WebSocket on it from the start.
    pub async fn open_conversation(&self, agent: &str) -> (String, Ws) {
        let id = self.create_conversation(agent).await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let ws = self.conversation_ws(&id, 0).await;
        (id, ws)
    }

    /// Cancels the conversation's running turn and waits on `ws` for it to
    /// end `cancelled`: the events up to then.
    pub async fn cancel_turn(&self, ws: &mut Ws, conversation: &str) -> Vec<Value> {
        let (status, body) = self
            .post(
                &format!("/api/v1/conversations/{conversation}/cancel"),
                json!({}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        let frames = ws.until_type("turn_ended").await;
        assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");
        frames
    }

    /// Sends a text prompt and returns the turn id (asserting 202).
    pub async fn prompt(&self, conversation: &str, text: &str) -> String {
        let (status, body) = self.try_prompt(conversation, text).await;
        assert_eq!(status, 202, "prompt: {body}");
        body["turn_id"].as_str().unwrap().to_owned()
    }

    /// Sends a text prompt; the status and the answer, whatever they are.
    pub async fn try_prompt(&self, conversation: &str, text: &str) -> (u16, Value) {
        self.post(
            &format!("/api/v1/conversations/{conversation}/prompts"),
            json!({"text": text}),
        )
        .await
    }

    pub async fn ws(&self, path: &str) -> Ws {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let url = self.url(path).replacen("http://", "ws://", 1);
        let mut request = url.into_client_request().unwrap();
        if let Some(token) = &self.token {
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let (stream, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("websocket connects in time")
            .expect("websocket connects");
        Ws { stream }
    }

    /// A WebSocket client that never reads (until a test reads it at last):
    /// small socket buffers (a small receive buffer, a small segment size
    /// for the gateway to send), so the kernel holds little for it and the
    /// gateway soon has to. It carries this client's token.
    pub async fn non_reading_ws(&self, path: &str) -> Ws {
        use std::os::fd::AsRawFd;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let addr: std::net::SocketAddr = self.base.trim_start_matches("http://").parse().unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let segment: libc::c_int = 1024;
        // SAFETY: setsockopt on a socket we own, with a pointer to an int and its size.
        let set = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_MAXSEG,
                (&segment as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
        let stream = socket.connect(addr).await.unwrap();
        let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
        if let Some(token) = &self.token {
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let stream = MaybeTlsStream::Plain(stream);
        let (stream, _) =
            tokio::time::timeout(WAIT, tokio_tungstenite::client_async(request, stream))
                .await
                .expect("connects in time")
                .expect("connects");
        Ws { stream }
    }

    pub async fn conversation_ws(&self, conversation: &str, after: i64) -> Ws {
        self.ws(&format!(
            "/api/v1/conversations/{conversation}/ws?after={after}"
        ))
        .await
    }

    /// A conversation as `GET` shows it (asserting 200).
    pub async fn conversation(&self, id: &str) -> Value {
        let (status, body) = self.get(&format!("/api/v1/conversations/{id}")).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// `POST …/mode`.
    pub async fn set_mode(&self, conversation: &str, mode_id: &str) -> (u16, Value) {
        self.post(
            &format!("/api/v1/conversations/{conversation}/mode"),
            json!({"mode_id": mode_id}),
        )
        .await
    }

    /// `POST …/config-options`.
    pub async fn set_option(
        &self,
        conversation: &str,
        config_id: &str,
        value: Value,
    ) -> (u16, Value) {
        self.post(
            &format!("/api/v1/conversations/{conversation}/config-options"),
            json!({"config_id": config_id, "value": value}),
        )
        .await
    }

    /// All events of a conversation from REST, page after page.
    pub async fn events(&self, conversation: &str) -> Vec<Value> {
        let mut events = Vec::new();
        let mut after = 0;
        loop {
            let (status, body) = self
                .get(&format!(
                    "/api/v1/conversations/{conversation}/events?after={after}&limit=10000"
                ))
                .await;
            assert_eq!(status, 200, "{body}");
            events.extend(body["items"].as_array().unwrap().iter().cloned());
            match body["next_cursor"].as_str() {
                Some(cursor) => after = cursor.parse().unwrap(),
                None => return events,
            }
        }
    }
}

async fn decode(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, body)
}

/// Asserts an answer is a problem with this status whose `detail` says
/// `says`; returns the problem.
pub fn assert_problem((status, problem): (u16, Value), expected: u16, says: &str) -> Value {
    assert_eq!(status, expected, "{problem}");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(says), "{says:?} not in {problem}");
    problem
}
