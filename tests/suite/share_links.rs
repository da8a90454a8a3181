//! Read-only share links: off by default; on, a conversation's owner makes
//! a link whose holder sees that conversation (history and live) without a
//! token, and nothing else; revoked or expired, it answers 404 like a token
//! never made and its sockets close (on other nodes too); `export` keeps it.

use crate::common::*;
use crate::openapi::Contract;
use futures::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// A gateway with share links on (or off), an operator's token, alice's
/// and bob's, and a conversation of alice's with one turn done.
struct World {
    gw: TestGateway,
    operator: String,
    alice: String,
    bob: String,
    conversation: String,
}

async fn world(db: &TestDb, share_links: bool) -> World {
    let operator = cli_token(db, "root-op", "operator");
    let mut config = Config::for_tests(db, vec![demo_profile("demo", &[])]);
    config.share_links = share_links;
    let gw = TestGateway::start_with(config).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let (bob, _) = gw.make_token(&operator, "bob", "user").await;
    let as_alice = gw.with_token(&alice);
    let conversation = as_alice.create("demo").await;
    let mut ws = as_alice.conversation_ws(&conversation, 0).await;
    as_alice.prompt(&conversation, "hello").await;
    ws.until_type("turn_ended").await;
    World {
        gw,
        operator,
        alice,
        bob,
        conversation,
    }
}

impl World {
    fn links(&self) -> String {
        format!("/api/v1/conversations/{}/share-links", self.conversation)
    }

    /// A new link of alice's conversation (asserting 201).
    async fn share(&self, expires_in: Option<&str>) -> Value {
        let body = match expires_in {
            Some(e) => json!({ "expires_in": e }),
            None => json!({}),
        };
        let (status, link) = self
            .gw
            .post_as(&self.links(), Some(&self.alice), body)
            .await;
        assert_eq!(status, 201, "{link}");
        link
    }
}

/// The share link's WebSocket, without any token.
async fn shared_ws(gw: &TestGateway, token: &str, after: i64) -> Ws {
    Client::new(gw.base.clone())
        .ws(&format!("/api/v1/shared/{token}/ws?after={after}"))
        .await
}

/// What a share link route answers without a token.
async fn public(gw: &TestGateway, path: &str) -> (u16, Value) {
    Client::new(gw.base.clone()).get(path).await
}

/// The status a WebSocket handshake to `path` (no token) is refused with.
async fn refused_upgrade(gw: &TestGateway, path: &str) -> u16 {
    let url = gw.url(path).replacen("http://", "ws://", 1);
    match tokio_tungstenite::connect_async(url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        Err(e) => panic!("{path}: {e}"),
        Ok(_) => panic!("{path}: upgraded"),
    }
}

async fn share_links_are_off_by_default(db: TestDb) {
    let w = world(&db, false).await;
    let (status, problem) =
        w.gw.post_as(&w.links(), Some(&w.alice), json!({"expires_in": "1h"}))
            .await;
    assert_eq!(status, 403, "{problem}");
    assert_eq!(problem["code"], "share_links_disabled");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("share_links = true"),
        "{problem}"
    );
    // The operator too: it is the gateway's setting, not a right.
    let (status, problem) = w.gw.post_as(&w.links(), Some(&w.operator), json!({})).await;
    assert_eq!(
        problem["code"], "share_links_disabled",
        "{status} {problem}"
    );
    // Listing says there are none.
    let (status, list) = w.gw.get_as(&w.links(), Some(&w.alice)).await;
    assert_eq!((status, list["items"].clone()), (200, json!([])));
    // A well-formed token is looked up nowhere: 404.
    let token = format!("acpgw_share_{}", "a".repeat(64));
    let (status, problem) = public(&w.gw, &format!("/api/v1/shared/{token}")).await;
    assert_eq!((status, problem["code"].clone()), (404, json!("not_found")));
}

async fn a_link_shows_the_history_and_live_events_and_nothing_else(db: TestDb) {
    let w = world(&db, true).await;
    let link = w.share(Some("7d")).await;
    let token = link["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("acpgw_share_"), "{link}");
    // Without notifications.base_url, the URL is a path on the gateway.
    assert_eq!(link["url"], format!("/s/{token}"));
    assert_eq!(link["created_by"], "user:alice");
    assert_eq!(link["conversation_id"], w.conversation.as_str());
    assert_eq!(link["state"], "active");
    assert!(link["revoked_at"].is_null());
    let made = chrono::DateTime::parse_from_rfc3339(link["created_at"].as_str().unwrap()).unwrap();
    let ends = chrono::DateTime::parse_from_rfc3339(link["expires_at"].as_str().unwrap()).unwrap();
    assert_eq!(ends - made, chrono::Duration::days(7));

    // The conversation as the link shows it: nothing of the server, nor its owner.
    let (status, shared) = public(&w.gw, &format!("/api/v1/shared/{token}")).await;
    assert_eq!(status, 200, "{shared}");
    assert_eq!(shared["id"], w.conversation.as_str());
    assert_eq!(shared["agent"], "demo");
    assert_eq!(shared["link_expires_at"], link["expires_at"]);
    let mut members: Vec<&str> = shared
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    members.sort();
    assert_eq!(
        members,
        [
            "agent",
            "created_at",
            "id",
            "last_seq",
            "link_expires_at",
            "status",
            "title",
            "updated_at"
        ]
    );
    // Its history, as the owner's, but for what says more of the server.
    let owners = w.gw.with_token(&w.alice).events(&w.conversation).await;
    let (status, page) = public(&w.gw, &format!("/api/v1/shared/{token}/events?after=0")).await;
    assert_eq!(status, 200, "{page}");
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), owners.len());
    for (seen, stored) in items.iter().zip(&owners) {
        assert_eq!(seen["seq"], stored["seq"]);
        assert_eq!(seen["type"], stored["type"]);
        if seen["type"] == "agent_status" {
            assert!(
                seen["data"].get("detail").is_none() || seen["data"]["detail"].is_null(),
                "{seen}"
            );
        } else {
            assert_eq!(seen, stored);
        }
    }
    let (status, _) = public(&w.gw, &format!("/api/v1/shared/{token}/events?after=-1")).await;
    assert_eq!(status, 422);

    // Live: the history, then what happens next, in order.
    let mut viewer = shared_ws(&w.gw, &token, 0).await;
    let replayed = viewer
        .until(|e| e["seq"] == owners.last().unwrap()["seq"])
        .await;
    assert_eq!(replayed.len(), owners.len());
    // A viewer's frames change nothing (presence included) and do not end it.
    viewer
        .stream
        .send(WsMessage::Text(
            r#"{"type":"presence","visible":true}"#.into(),
        ))
        .await
        .unwrap();
    viewer
        .stream
        .send(WsMessage::Text(r#"{"type":"prompt","text":"hi"}"#.into()))
        .await
        .unwrap();
    w.gw.with_token(&w.alice)
        .prompt(&w.conversation, "hello")
        .await;
    let live = viewer.until_type("turn_ended").await;
    assert_eq!(live[0]["type"], "turn_started");
    assert_consecutive(&live, owners.last().unwrap()["seq"].as_i64().unwrap());

    // The link's token is no bearer token: the API refuses it, whatever it asks.
    for path in [
        format!("/api/v1/conversations/{}", w.conversation),
        format!("/api/v1/conversations/{}/events", w.conversation),
        "/api/v1/conversations".to_owned(),
        "/api/v1/agents".to_owned(),
    ] {
        let (status, problem) = w.gw.get_as(&path, Some(&token)).await;
        assert_eq!(status, 401, "{path}: {problem}");
    }
    let other = w.gw.with_token(&w.alice).create("demo").await;
    let (status, _) =
        w.gw.post_as(
            &format!("/api/v1/conversations/{other}/prompts"),
            Some(&token),
            json!({"text": "hi"}),
        )
        .await;
    assert_eq!(status, 401);
    let url =
        w.gw.url(&format!(
            "/api/v1/conversations/{other}/ws?access_token={token}"
        ))
        .replacen("http://", "ws://", 1);
    match tokio_tungstenite::connect_async(url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!(
            "the link's token opened another socket: {:?}",
            other.map(|_| ())
        ),
    }
    // Nor does a bearer token change what a link shows: one link, one conversation.
    let (status, shared_with_bearer) =
        w.gw.get_as(&format!("/api/v1/shared/{token}"), Some(&w.operator))
            .await;
    assert_eq!(
        (status, shared_with_bearer["id"].clone()),
        (200, json!(w.conversation))
    );

    // Who may see the links: the owner and operators; bob finds no conversation.
    let (status, list) = w.gw.get_as(&w.links(), Some(&w.alice)).await;
    assert_eq!(status, 200, "{list}");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert!(
        items[0].get("token").is_none() && items[0].get("url").is_none(),
        "{list}"
    );
    assert_eq!(items[0]["id"], link["id"]);
    assert_eq!(w.gw.get_as(&w.links(), Some(&w.operator)).await.0, 200);
    for (method, body) in [("GET", None), ("POST", Some(json!({})))] {
        let (status, problem) = w.gw.call_as(method, &w.links(), Some(&w.bob), body).await;
        assert_eq!(status, 404, "bob {method}: {problem}");
    }
    let revoke = format!("{}/{}", w.links(), link["id"].as_str().unwrap());
    assert_eq!(w.gw.delete_as(&revoke, Some(&w.bob)).await.0, 404);
    // Made by the operator too.
    let (status, by_operator) = w.gw.post_as(&w.links(), Some(&w.operator), json!({})).await;
    assert_eq!(
        (status, by_operator["created_by"].clone()),
        (201, json!("user:root-op"))
    );

    // The web client's read-only page, for any token (it asks the API).
    let page = reqwest::get(w.gw.url(&format!("/s/{token}")))
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["referrer-policy"], "no-referrer");
    assert!(page.text().await.unwrap().contains("/ui/shared.js"));
}

async fn a_revoked_link_closes_its_sockets_at_once_and_answers_404(db: TestDb) {
    let w = world(&db, true).await;
    let link = w.share(None).await;
    let token = link["token"].as_str().unwrap().to_owned();
    let made = chrono::DateTime::parse_from_rfc3339(link["created_at"].as_str().unwrap()).unwrap();
    let ends = chrono::DateTime::parse_from_rfc3339(link["expires_at"].as_str().unwrap()).unwrap();
    assert_eq!(
        ends - made,
        chrono::Duration::hours(24),
        "24 hours by default"
    );
    let mut first = shared_ws(&w.gw, &token, 0).await;
    let mut second = shared_ws(&w.gw, &token, 0).await;
    first.until_type("turn_ended").await;
    second.until_type("turn_ended").await;
    // Another link of the same conversation is not touched.
    let kept = w.share(Some("1h")).await;
    let mut other = shared_ws(&w.gw, kept["token"].as_str().unwrap(), 0).await;
    other.until_type("turn_ended").await;

    let revoke = format!("{}/{}", w.links(), link["id"].as_str().unwrap());
    let (status, body) = w.gw.delete_as(&revoke, Some(&w.alice)).await;
    assert_eq!(status, 204, "{body}");
    for ws in [&mut first, &mut second] {
        let (_, code) = ws.until_closed().await;
        assert_eq!(code, 1008);
    }
    // Gone everywhere, with the answer a token never made gets.
    let (status, revoked) = public(&w.gw, &format!("/api/v1/shared/{token}")).await;
    assert_eq!(status, 404);
    let never = format!("acpgw_share_{}", "0".repeat(64));
    let (_, unknown) = public(&w.gw, &format!("/api/v1/shared/{never}")).await;
    assert_eq!(revoked, unknown);
    assert_eq!(
        public(&w.gw, &format!("/api/v1/shared/{token}/events"))
            .await
            .0,
        404
    );
    assert_eq!(
        refused_upgrade(&w.gw, &format!("/api/v1/shared/{token}/ws")).await,
        404
    );
    // Listed as revoked; revoking again is no error; another id is 404.
    let (_, list) = w.gw.get_as(&w.links(), Some(&w.alice)).await;
    let states: Vec<_> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["state"].clone())
        .collect();
    assert_eq!(states, [json!("revoked"), json!("active")]);
    assert_eq!(w.gw.delete_as(&revoke, Some(&w.alice)).await.0, 204);
    let unknown_link = format!("{}/{}", w.links(), uuid::Uuid::now_v7());
    assert_eq!(w.gw.delete_as(&unknown_link, Some(&w.alice)).await.0, 404);
    // The other link's socket is still open and live.
    w.gw.with_token(&w.alice)
        .prompt(&w.conversation, "hello")
        .await;
    other.until_type("turn_ended").await;
}

async fn an_expired_link_closes_its_sockets_and_answers_404(db: TestDb) {
    let w = world(&db, true).await;
    let link = w.share(Some("2s")).await;
    let token = link["token"].as_str().unwrap().to_owned();
    let mut viewer = shared_ws(&w.gw, &token, 0).await;
    // Closed at its expiry, by the gateway (the wait is on the close).
    let (frames, code) = viewer.until_closed().await;
    assert_eq!(code, 1008);
    assert!(frames.iter().any(|e| e["type"] == "turn_ended"));
    let (status, expired) = public(&w.gw, &format!("/api/v1/shared/{token}")).await;
    assert_eq!(status, 404);
    let never = format!("acpgw_share_{}", "1".repeat(64));
    assert_eq!(
        expired,
        public(&w.gw, &format!("/api/v1/shared/{never}")).await.1
    );
    let (_, list) = w.gw.get_as(&w.links(), Some(&w.alice)).await;
    assert_eq!(list["items"][0]["state"], "expired");
}

async fn bad_bodies_and_hostile_tokens_are_refused(db: TestDb) {
    let w = world(&db, true).await;
    for body in [
        json!({"expires_in": "31d"}),
        json!({"expires_in": "0s"}),
        json!({"expires_in": "soon"}),
        json!({"expires_in": ""}),
        json!({"expires_in": 3600}),
        json!({"expires": "1h"}),
        json!("1h"),
    ] {
        let (status, problem) = w.gw.post_as(&w.links(), Some(&w.alice), body.clone()).await;
        assert_eq!(status, 422, "{body}: {problem}");
        assert_eq!(problem["code"], "invalid_request");
    }
    let (status, _) =
        w.gw.with_token(&w.alice)
            .post_raw(&w.links(), "application/json", "{")
            .await;
    assert_eq!(status, 400);
    let (status, _) =
        w.gw.with_token(&w.alice)
            .post_raw(&w.links(), "text/plain", "{}")
            .await;
    assert_eq!(status, 415);
    // Nothing was made.
    let (_, list) = w.gw.get_as(&w.links(), Some(&w.alice)).await;
    assert_eq!(list["items"], json!([]));
    // A real link, then tokens that are not one: one 404 for all.
    let link = w.share(None).await;
    let token = link["token"].as_str().unwrap();
    for hostile in [
        format!("{token}0"),
        token[..token.len() - 1].to_owned(),
        token.to_uppercase(),
        format!("acpgw_share_{}", "f".repeat(5000)),
        w.alice.clone(),
        "..%2F..%2Fconversations".to_owned(),
        "%00".to_owned(),
        "acpgw_share_%F0%9F%92%A9".to_owned(),
    ] {
        let (status, problem) = public(&w.gw, &format!("/api/v1/shared/{hostile}")).await;
        assert_eq!(status, 404, "{hostile}: {problem}");
    }
    // The link still works.
    assert_eq!(
        public(&w.gw, &format!("/api/v1/shared/{token}")).await.0,
        200
    );
}

async fn failed_lookups_are_limited_per_address_but_a_usable_link_still_answers(db: TestDb) {
    let w = world(&db, true).await;
    let link = w.share(None).await;
    let token = link["token"].as_str().unwrap();
    for n in 0..20 {
        let unknown = format!("acpgw_share_{:064x}", n);
        assert_eq!(
            public(&w.gw, &format!("/api/v1/shared/{unknown}")).await.0,
            404
        );
    }
    let response =
        reqwest::get(w.gw.url(&format!("/api/v1/shared/acpgw_share_{}", "9".repeat(64))))
            .await
            .unwrap();
    assert_eq!(response.status(), 429);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(
        public(&w.gw, &format!("/api/v1/shared/{token}")).await.0,
        200
    );
    let mut viewer = shared_ws(&w.gw, token, 0).await;
    viewer.until_type("turn_ended").await;
}

async fn export_keeps_share_links(db: TestDb) {
    let w = world(&db, true).await;
    let link = w.share(Some("1h")).await;
    let token = link["token"].as_str().unwrap().to_owned();
    let revoked = w.share(Some("1h")).await;
    let revoke = format!("{}/{}", w.links(), revoked["id"].as_str().unwrap());
    assert_eq!(w.gw.delete_as(&revoke, Some(&w.alice)).await.0, 204);
    w.gw.stop().await;
    // Into the other backend where there is one, else another SQLite file.
    let target = match db.url.starts_with("sqlite") {
        true => match TestDb::postgres().await {
            Some(pg) => pg,
            None => TestDb::sqlite().await,
        },
        false => TestDb::sqlite().await,
    };
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("database_url = {:?}\n", db.url)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .args(["export", "--config"])
        .arg(config.path())
        .args(["--to", &target.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(said.contains("2 share links"), "{said}");
    let mut config = Config::for_tests(&target, vec![demo_profile("demo", &[])]);
    config.share_links = true;
    let there = TestGateway::start_with(config).await;
    let (status, shared) = public(&there, &format!("/api/v1/shared/{token}")).await;
    assert_eq!(status, 200, "{shared}");
    assert_eq!(shared["id"], w.conversation.as_str());
    let (status, page) = public(&there, &format!("/api/v1/shared/{token}/events")).await;
    assert_eq!(status, 200);
    assert!(!page["items"].as_array().unwrap().is_empty());
    let revoked_token = revoked["token"].as_str().unwrap();
    assert_eq!(
        public(&there, &format!("/api/v1/shared/{revoked_token}"))
            .await
            .0,
        404
    );
}

async fn links_made_before_stop_working_while_share_links_are_off(db: TestDb) {
    let w = world(&db, true).await;
    let link = w.share(Some("1h")).await;
    let token = link["token"].as_str().unwrap().to_owned();
    let links = w.links();
    let mut config = w.gw.stop().await;
    config.share_links = false;
    let off = TestGateway::start_with(config.clone()).await;
    for path in [
        format!("/api/v1/shared/{token}"),
        format!("/api/v1/shared/{token}/events"),
    ] {
        assert_eq!(public(&off, &path).await.0, 404, "{path}");
    }
    assert_eq!(
        refused_upgrade(&off, &format!("/api/v1/shared/{token}/ws")).await,
        404
    );
    // Its owner still sees it listed (and could revoke it).
    let (status, list) = off.get_as(&links, Some(&w.alice)).await;
    assert_eq!(
        (status, list["items"][0]["state"].clone()),
        (200, json!("active"))
    );
    off.stop().await;
    // On again, it works again (it has not expired).
    config.share_links = true;
    let on = TestGateway::start_with(config).await;
    assert_eq!(public(&on, &format!("/api/v1/shared/{token}")).await.0, 200);
}

/// What the share link routes answer is what the document says.
async fn share_link_answers_match_the_document(db: TestDb) {
    let contract = Contract::new();
    let off = world(&db, false).await;
    let create = "/api/v1/conversations/{id}/share-links";
    contract.answer(
        "post",
        create,
        &off.gw
            .post_as(&off.links(), Some(&off.alice), json!({}))
            .await,
    );
    off.gw.stop().await;
    let w = world(&db, true).await;
    let made =
        w.gw.post_as(&w.links(), Some(&w.alice), json!({"expires_in": "1h"}))
            .await;
    contract.answer("post", create, &made);
    contract.answer(
        "post",
        create,
        &w.gw
            .post_as(&w.links(), Some(&w.alice), json!({"expires_in": "40d"}))
            .await,
    );
    contract.answer(
        "post",
        create,
        &w.gw.post_as(&w.links(), Some(&w.bob), json!({})).await,
    );
    contract.answer(
        "get",
        create,
        &w.gw.get_as(&w.links(), Some(&w.alice)).await,
    );
    let token = made.1["token"].as_str().unwrap();
    let shared = "/api/v1/shared/{token}";
    contract.answer(
        "get",
        shared,
        &public(&w.gw, &format!("/api/v1/shared/{token}")).await,
    );
    contract.answer("get", shared, &public(&w.gw, "/api/v1/shared/nope").await);
    let events = "/api/v1/shared/{token}/events";
    let page = public(&w.gw, &format!("/api/v1/shared/{token}/events")).await;
    contract.answer("get", events, &page);
    for event in page.1["items"].as_array().unwrap() {
        contract.schema("Event", event);
    }
    contract.answer(
        "get",
        events,
        &public(&w.gw, &format!("/api/v1/shared/{token}/events?limit=0")).await,
    );
    let revoke = "/api/v1/conversations/{id}/share-links/{link_id}";
    let one = format!("{}/{}", w.links(), made.1["id"].as_str().unwrap());
    contract.answer(
        "delete",
        revoke,
        &w.gw.delete_as(&one, Some(&w.alice)).await,
    );
    let none = format!("{}/{}", w.links(), uuid::Uuid::now_v7());
    contract.answer(
        "delete",
        revoke,
        &w.gw.delete_as(&none, Some(&w.alice)).await,
    );
}

backend_tests!(
    share_link_answers_match_the_document,
    links_made_before_stop_working_while_share_links_are_off,
    share_links_are_off_by_default,
    a_link_shows_the_history_and_live_events_and_nothing_else,
    a_revoked_link_closes_its_sockets_at_once_and_answers_404,
    an_expired_link_closes_its_sockets_and_answers_404,
    bad_bodies_and_hostile_tokens_are_refused,
    failed_lookups_are_limited_per_address_but_a_usable_link_still_answers,
    export_keeps_share_links,
);

/// Several nodes: a link revoked on one closes its sockets on the other.
#[tokio::test]
async fn a_link_revoked_on_one_node_closes_its_sockets_on_another() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let start = || {
        GatewayProcess::start_configured(
            &db,
            &[demo_profile("demo", &[])],
            "info",
            "node_lease = \"1s\"\nshare_links = true",
        )
    };
    let (a, b) = (start(), start());
    let id = a.create("demo").await;
    let mut ws = a.conversation_ws(&id, 0).await;
    a.prompt(&id, "hello").await;
    ws.until_type("turn_ended").await;
    let (status, link) = a
        .post(
            &format!("/api/v1/conversations/{id}/share-links"),
            json!({"expires_in": "1h"}),
        )
        .await;
    assert_eq!(status, 201, "{link}");
    let token = link["token"].as_str().unwrap();
    let mut on_b = Client::new(b.base.clone())
        .ws(&format!("/api/v1/shared/{token}/ws?after=0"))
        .await;
    on_b.until_type("turn_ended").await;
    // Live through B, from A's agent.
    a.prompt(&id, "hello").await;
    on_b.until_type("turn_ended").await;
    let (status, _) = a
        .delete(&format!(
            "/api/v1/conversations/{id}/share-links/{}",
            link["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, 204);
    let (_, code) = on_b.until_closed().await;
    assert_eq!(code, 1008);
    assert_eq!(
        Client::new(b.base.clone())
            .get(&format!("/api/v1/shared/{token}"))
            .await
            .0,
        404
    );
}
