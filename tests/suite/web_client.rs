//! The built-in web client, end to end: Debian's Chromium (headless, driven
//! by `tests/web/driver.mjs` on playwright-core) on a 375 px wide phone
//! screen, against a real gateway and the agent built on the official npm
//! ACP SDK. Screenshots go to `target/tmp/web-screenshots/`.
//!
//! Skipped (and said so) where Chromium or the driver's node_modules are
//! missing, unless `ACP_GATEWAY_REQUIRE_BROWSER` is set (CI sets it).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::common::*;
use acp_gateway::config::AgentProfile;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

const REQUIRE_BROWSER: &str = "ACP_GATEWAY_REQUIRE_BROWSER";
const CHROMIUM: &str = "/usr/bin/chromium";

fn web_tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web")
}

/// A headless Chromium on the gateway, through the driver's proxy.
pub(crate) struct Browser {
    _child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Browser {
    /// `None` (the test is skipped) where no browser can run here.
    async fn open(gw: &TestGateway) -> Option<Browser> {
        Browser::launch(Some(&gw.base))
            .await
            .map(|(browser, _)| browser)
    }

    /// A browser on a gateway that serves HTTPS (its page https://, its
    /// sockets wss://).
    async fn open_https(gw: &TestGateway) -> Option<(Browser, String)> {
        Browser::start(Some(&gw.base), true).await
    }

    /// A browser whose proxy has no gateway behind it yet (`upstream`
    /// gives it one), and the origin the page is served from.
    pub(crate) async fn launch(gateway: Option<&str>) -> Option<(Browser, String)> {
        Browser::start(gateway, false).await
    }

    async fn start(gateway: Option<&str>, https: bool) -> Option<(Browser, String)> {
        let driver = web_tests_dir().join("driver.mjs");
        let installed = web_tests_dir().join("node_modules/playwright-core/package.json");
        if !Path::new(CHROMIUM).exists() || !installed.exists() {
            assert!(
                std::env::var_os(REQUIRE_BROWSER).is_none(),
                "{REQUIRE_BROWSER} is set but {CHROMIUM} or {} is missing",
                installed.display()
            );
            eprintln!("skipped: needs {CHROMIUM} and `npm ci --prefix tests/web` (see the README)");
            return None;
        }
        let mut command = tokio::process::Command::new("node");
        if let Some(gateway) = gateway {
            command.env("GATEWAY", gateway);
        }
        if https {
            command.env("HTTPS", "1");
        }
        let mut child = command
            .arg(driver)
            .env("CHROMIUM", CHROMIUM)
            .env("WAIT_MS", WAIT.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut browser = Browser {
            _child: child,
            stdin,
            lines,
        };
        let started = browser.answer().await.expect("the browser starts");
        let origin = started["origin"].as_str().unwrap().to_owned();
        Some((browser, origin))
    }

    async fn answer(&mut self) -> Result<Value, String> {
        // The driver bounds each of its waits by WAIT; this bounds the rest.
        let line = tokio::time::timeout(WAIT * 3, self.lines.next_line())
            .await
            .expect("the driver answers in time")
            .unwrap()
            .expect("the driver is running");
        let answer: Value = serde_json::from_str(&line).unwrap();
        if answer["ok"] == true {
            Ok(answer["value"].clone())
        } else {
            Err(answer["error"].as_str().unwrap_or_default().to_owned())
        }
    }

    /// Runs one command; the test fails if it does.
    pub(crate) async fn run(&mut self, command: Value) -> Value {
        let mut line = command.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.answer()
            .await
            .unwrap_or_else(|e| panic!("browser: {e} (command {command})"))
    }

    /// Opens a conversation's page and sends `text` from its prompt box.
    pub(crate) async fn send_prompt(&mut self, conversation: &str, text: &str) {
        self.goto(&format!("/#/c/{conversation}")).await;
        self.wait("#prompt").await;
        self.fill("Message", text).await;
        self.click("button", "Send").await;
    }

    pub(crate) async fn goto(&mut self, path: &str) {
        self.run(json!({"do": "goto", "path": path})).await;
    }

    pub(crate) async fn click(&mut self, role: &str, name: &str) {
        self.run(json!({"do": "click", "role": role, "name": name}))
            .await;
    }

    pub(crate) async fn fill(&mut self, label: &str, value: &str) {
        self.run(json!({"do": "fill", "label": label, "value": value}))
            .await;
    }

    pub(crate) async fn wait(&mut self, selector: &str) {
        self.run(json!({"do": "wait", "selector": selector})).await;
    }

    pub(crate) async fn wait_for_text(&mut self, selector: &str, text: &str) {
        self.run(json!({"do": "wait", "selector": selector, "text": text}))
            .await;
    }

    pub(crate) async fn wait_gone(&mut self, selector: &str) {
        self.run(json!({"do": "wait", "selector": selector, "state": "detached"}))
            .await;
    }

    /// Waits until `selector`'s text is `text`.
    pub(crate) async fn wait_text(&mut self, selector: &str, text: &str) {
        self.run(json!({"do": "wait_text", "selector": selector, "text": text}))
            .await;
    }

    pub(crate) async fn wait_hidden(&mut self, selector: &str) {
        self.run(json!({"do": "wait", "selector": selector, "state": "hidden"}))
            .await;
    }

    /// Asserts that nothing on the page is wider than the 375 px screen.
    pub(crate) async fn fits_the_screen(&mut self) {
        let width = self.run(json!({"do": "width"})).await;
        assert_eq!(width["client"], 375, "{width}");
        assert!(
            width["scroll"].as_i64() <= width["client"].as_i64(),
            "the page scrolls sideways: {width}"
        );
    }

    /// Asserts that axe-core finds no violation on the page (`what` it
    /// shows, for the message).
    pub(crate) async fn no_axe_violation(&mut self, what: &str) {
        let violations = self.run(json!({"do": "axe"})).await;
        assert_eq!(violations, json!([]), "{what}: {violations:#}");
    }

    pub(crate) async fn texts(&mut self, selector: &str) -> Vec<String> {
        let texts = self.run(json!({"do": "texts", "selector": selector})).await;
        serde_json::from_value(texts).unwrap()
    }

    /// The whole page, or (`full` false) what the screen shows.
    pub(crate) async fn screenshot(&mut self, name: &str, full: bool) -> PathBuf {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        self.run(json!({"do": "screenshot", "path": path, "full": full}))
            .await;
        assert!(std::fs::metadata(&path).unwrap().len() > 0);
        path
    }

    /// Closes the browser; the page must not have thrown or logged errors.
    pub(crate) async fn close(&mut self) {
        let errors = self.run(json!({"do": "errors"})).await;
        assert_eq!(errors, json!([]), "the page reported errors");
        self.run(json!({"do": "close"})).await;
    }
}

/// Postgres where it runs, else SQLite: the page does not depend on it.
pub(crate) async fn db() -> TestDb {
    match TestDb::postgres().await {
        Some(db) => db,
        None => TestDb::sqlite().await,
    }
}

fn sdk_agent(cwd: &Path) -> AgentProfile {
    AgentProfile {
        title: Some("SDK agent".into()),
        cwd: Some(cwd.to_path_buf()),
        ..node_sdk_profile("sdk")
    }
}

async fn gateway(db: &TestDb, work: &Path) -> TestGateway {
    TestGateway::start(db, vec![sdk_agent(work)]).await
}

fn work_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let work = std::fs::canonicalize(dir.path()).unwrap();
    (dir, work)
}

/// A gateway in open mode with the SDK agent working in `work`, and a
/// browser on it; `None` where no browser can run here. Borrow its parts
/// (`let Scene { gw, browser, .. } = &mut scene;`): it keeps the directory
/// and the database alive.
pub(crate) struct Scene {
    pub(crate) gw: TestGateway,
    pub(crate) work: PathBuf,
    pub(crate) browser: Browser,
    _dir: tempfile::TempDir,
    _db: TestDb,
}

pub(crate) async fn scene() -> Option<Scene> {
    let db = db().await;
    let (dir, work) = work_dir();
    let gw = gateway(&db, &work).await;
    let browser = Browser::open(&gw).await?;
    Some(Scene {
        gw,
        work,
        browser,
        _dir: dir,
        _db: db,
    })
}

#[tokio::test]
async fn a_turn_with_an_approval_answered_from_the_inbox() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let Scene {
        gw, work, browser, ..
    } = &mut scene;

    // A conversation started from the page.
    browser.goto("/#/conversations").await;
    browser
        .run(json!({"do": "wait", "selector": "#new-agent option[value=sdk]", "state": "attached"}))
        .await;
    browser.fill("Title", "Fix the greeting").await;
    browser.click("button", "Start").await;
    browser.wait_for_text("h1", "Fix the greeting").await;
    let (_, list) = gw.get("/api/v1/conversations").await;
    let conversation = list["items"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(list["items"][0]["title"], "Fix the greeting");
    let mut ws = gw.conversation_ws(&conversation, 0).await;

    // The prompt sent from the keyboard.
    browser.fill("Message", "work").await;
    browser
        .run(json!({"do": "press", "key": "Control+Enter"}))
        .await;
    ws.until_type("permission_requested").await;

    // The inbox: one card, the agent's options as buttons named exactly so.
    browser.goto("/#/").await;
    browser.wait("article.permission").await;
    // The conversation's title, looked up once the card is there.
    browser
        .wait_for_text("article.permission .where a", "Fix the greeting")
        .await;
    let card = browser.texts("article.permission").await.concat();
    for shown in [
        "Fix the greeting",
        "Edit src/main.rs",
        "edit",
        &format!("{}:2", work.join("src/main.rs").display()),
        "-    println!(\"hello\");",
        "+    println!(\"hello, world\");",
    ] {
        assert!(card.contains(shown), "{shown:?} is not on the card: {card}");
    }
    let (_, pending) = gw.get("/api/v1/permissions?status=pending").await;
    let request = &pending["items"][0];
    let offered: Vec<Value> = request["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].clone())
        .collect();
    // (Beside them, "Add a reason": see web_steering.)
    let buttons = browser
        .run(json!({"do": "names", "selector": "article.permission .options", "role": "button"}))
        .await;
    assert_eq!(buttons, json!(offered));
    assert_eq!(buttons, json!(["Allow once", "Always allow", "Reject"]));
    let tags = browser
        .run(json!({"do": "tags", "selector": "article.permission .options > *"}))
        .await;
    assert_eq!(tags, json!(["button", "button", "button"]));
    let shot = browser.screenshot("inbox.png", true).await;
    eprintln!("inbox screenshot: {}", shot.display());

    // A tap answers it: the agent goes on, the card goes.
    browser.click("button", "Allow once").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    browser.wait_gone("article.permission").await;
    browser.wait("#inbox p.empty").await;
    let (_, answered) = gw
        .get(&format!(
            "/api/v1/permissions/{}",
            request["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(answered["status"], "approved");
    assert_eq!(answered["decision"]["option_id"], "allow-once");

    // The conversation: prompt, thought, plan, the tool call done, the reply.
    browser.goto(&format!("/#/c/{conversation}")).await;
    browser.wait("p.turn-end").await;
    browser.wait("section.tool[data-status=completed]").await;
    assert_eq!(browser.texts("section.message.user .text").await, ["work"]);
    assert_eq!(
        browser.texts("section.message.thought .text").await,
        ["The greeting should name the world."]
    );
    assert_eq!(
        browser.texts("section.message.agent .text").await,
        ["Done."]
    );
    let plan = browser.texts("ol.plan li").await;
    assert_eq!(plan.len(), 3, "{plan:?}");
    assert!(plan[1].contains("Change the greeting"));
    let decision = browser.texts("article.permission .decision").await;
    assert_eq!(decision.len(), 1);
    assert!(decision[0].contains("Allow once"), "{decision:?}");
    // As the phone shows it (the prompt box stays at the bottom of the
    // screen), and the whole of it.
    let shot = browser.screenshot("conversation.png", false).await;
    eprintln!("conversation screenshot: {}", shot.display());
    browser.screenshot("conversation-whole.png", true).await;
    browser.close().await;
}

/// The page's Content-Security-Policy, as `src/web.rs` sends it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; \
                   frame-ancestors 'none'";

/// Sends a prompt over the API and waits until the page shows its turn
/// ended (the `n`th turn end on the page).
async fn turn_shown(
    gw: &TestGateway,
    browser: &mut Browser,
    conversation: &str,
    text: &str,
    n: usize,
) {
    turn_ended(gw, conversation, text).await;
    browser
        .run(json!({"do": "wait", "selector": format!("p.turn-end >> nth={}", n - 1)}))
        .await;
}

#[tokio::test]
async fn an_agents_markdown_is_shown_as_such_and_nothing_in_it_runs() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let Scene { gw, browser, .. } = &mut scene;
    let conversation = gw.create("sdk").await;
    browser.goto(&format!("/#/c/{conversation}")).await;
    browser.wait("#prompt").await;

    // The SDK agent says back what it is told: "You said: " and the text.
    let reply = "\n# Plan\n\nFirst **bold**, then `code`, then a [link](https://example.com/docs).\n\n\
                 - one\n- two\n\n| name | size |\n|---|---|\n| a.rs | 12 |\n| b.rs | 7 |\n\n\
                 ```rust\nfn main() {\n    println!(\"a line long enough to scroll rather than wrap on a phone\");\n}\n```\n";
    turn_shown(gw, browser, &conversation, reply, 1).await;
    let md = "section.message.agent .text.md";
    assert_eq!(browser.texts(&format!("{md} h1")).await, ["Plan"]);
    assert_eq!(browser.texts(&format!("{md} strong")).await, ["bold"]);
    assert_eq!(browser.texts(&format!("{md} li")).await, ["one", "two"]);
    assert_eq!(browser.texts(&format!("{md} th")).await, ["name", "size"]);
    assert_eq!(
        browser.texts(&format!("{md} td")).await,
        ["a.rs", "12", "b.rs", "7"]
    );
    let code = browser.texts(&format!("{md} pre code")).await;
    assert_eq!(code.len(), 1);
    assert!(code[0].starts_with("fn main() {\n"), "{code:?}");
    let copy = browser
        .run(json!({"do": "names", "selector": format!("{md} .code"), "role": "button"}))
        .await;
    assert_eq!(copy, json!(["Copy"]));
    assert_eq!(
        browser
            .run(json!({"do": "attrs", "selector": format!("{md} a"), "name": "rel"}))
            .await,
        json!(["noopener noreferrer"])
    );
    assert_eq!(
        browser
            .run(json!({"do": "attrs", "selector": format!("{md} a"), "name": "target"}))
            .await,
        json!(["_blank"])
    );
    // What the person typed stays as typed.
    assert_eq!(browser.texts("section.message.user .text").await, [reply]);
    let shot = browser.screenshot("markdown.png", false).await;
    eprintln!("markdown screenshot: {}", shot.display());

    // Hostile Markdown: nothing in it runs, no link in it leads to script.
    let hostile = "\n<img src=x onerror=\"window.__pwned = 'img'\">\n\n\
                   <script>window.__pwned = 'script'</script>\n\n\
                   [click me](javascript:window.__pwned='link')\n\n\
                   [data](data:text/html;base64,PHNjcmlwdD53aW5kb3cuX19wd25lZD0nZGF0YSc8L3NjcmlwdD4=)\n\n\
                   <svg><script>window.__pwned = 'svg'</script><circle onload=\"window.__pwned='svg2'\"/></svg>\n\n\
                   `<img src=x onerror=\"window.__pwned='code'\">` and inline <b onmouseover=\"window.__pwned='b'\">html</b>\n\n\
                   ![pixel](https://example.com/track.png)\n";
    turn_shown(gw, browser, &conversation, hostile, 2).await;
    let last = "section.message.agent >> nth=1";
    let tags = browser
        .run(json!({"do": "tags", "selector": format!("{last} >> .text.md *")}))
        .await;
    for tag in tags.as_array().unwrap() {
        assert!(
            ["p", "a", "code", "img", "strong", "em"].contains(&tag.as_str().unwrap()),
            "an element that should not be there: {tag} in {tags}"
        );
    }
    for attr in ["onerror", "onload", "onmouseover"] {
        let found = browser
            .run(json!({"do": "attrs", "selector": format!("{last} >> .text.md *"), "name": attr}))
            .await;
        assert!(
            found.as_array().unwrap().iter().all(Value::is_null),
            "{attr}: {found}"
        );
    }
    let hrefs = browser
        .run(json!({"do": "attrs", "selector": format!("{last} >> .text.md a"), "name": "href"}))
        .await;
    assert_eq!(hrefs, json!([null, null]), "no script or data link stays");
    let srcs = browser
        .run(json!({"do": "attrs", "selector": format!("{last} >> .text.md img"), "name": "src"}))
        .await;
    assert_eq!(srcs, json!([null]), "no image from elsewhere is fetched");
    // The raw HTML is there as text, for the person to read.
    let text = browser.texts(last).await.concat();
    assert!(
        text.contains("<script>window.__pwned = 'script'</script>"),
        "{text}"
    );
    assert!(text.contains("<img src=x onerror="), "{text}");
    assert_eq!(
        browser
            .run(json!({"do": "global", "name": "__pwned"}))
            .await,
        Value::Null
    );
    // The page's policy is what it was.
    let page = gw.http.get(gw.url("/")).send().await.unwrap();
    assert_eq!(page.headers()["content-security-policy"], CSP);
    browser.close().await;
}

/// The session's settings on the page: the mode and each option the agent
/// offers, changed there, reach the agent; a refused choice says why and
/// goes back; `/` offers the agent's commands; usage is shown.
#[tokio::test]
async fn settings_changed_on_the_page_reach_the_agent() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let Scene { gw, browser, .. } = &mut scene;
    let conversation = gw.create("sdk").await;
    let mut ws = gw.conversation_ws(&conversation, 0).await;
    browser.goto(&format!("/#/c/{conversation}")).await;
    browser.wait("#setting-mode").await;
    let labels = browser.texts("div.settings label").await;
    assert_eq!(labels, ["Mode", "Model", "Brave"]);

    browser
        .run(json!({"do": "select", "label": "Mode", "value": "plan"}))
        .await;
    ws.until_type("mode_changed").await;
    assert_eq!(
        gw.conversation(&conversation).await["modes"]["currentModeId"],
        "plan"
    );
    browser
        .run(json!({"do": "select", "label": "Model", "value": "deep"}))
        .await;
    ws.until_type("config_option_changed").await;
    browser.click("checkbox", "Brave").await;
    ws.until(|e| e["type"] == "config_option_changed" && e["data"]["config_id"] == "brave")
        .await;
    let options = gw.conversation(&conversation).await["config_options"].clone();
    let value = |id: &str| {
        options
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["id"] == id)
            .unwrap()["currentValue"]
            .clone()
    };
    assert_eq!(value("model"), "deep");
    assert_eq!(value("brave"), true);
    // The agent holds them so.
    turn_shown(gw, browser, &conversation, "settings", 1).await;
    assert_eq!(
        browser.texts("section.message.agent .text").await,
        ["mode=plan model=deep brave=true"]
    );

    // A choice the agent refuses: said, and put back.
    browser
        .run(json!({"do": "select", "label": "Model", "value": "refused"}))
        .await;
    browser.wait("form.prompt p.error").await;
    let select = browser
        .run(json!({"do": "values", "selector": "#setting-0"}))
        .await;
    assert_eq!(select, json!(["deep"]));
    assert_eq!(value("model"), "deep");

    // "/" offers the agent's commands; a tap puts one in the prompt.
    browser.fill("Message", "/").await;
    browser.wait("ul.commands button").await;
    assert_eq!(
        browser.texts("ul.commands .name").await,
        ["/init", "/review"]
    );
    assert_eq!(
        browser.texts("ul.commands .description").await,
        ["Write an AGENTS.md", "Review a change"]
    );
    browser.fill("Message", "/re").await;
    browser
        .run(json!({"do": "wait", "selector": "ul.commands li >> nth=1", "state": "detached"}))
        .await;
    browser.click("button", "/review Review a change").await;
    browser
        .run(json!({"do": "wait", "selector": "ul.commands", "state": "hidden"}))
        .await;
    assert_eq!(
        browser
            .run(json!({"do": "values", "selector": "#prompt"}))
            .await,
        json!(["/review "])
    );

    // What the session used, as the agent reported it.
    browser.fill("Message", "").await;
    turn_shown(gw, browser, &conversation, "usage", 2).await;
    browser
        .wait_for_text("#usage", "1,234 of 200,000 tokens · 0.12 USD")
        .await;
    // The top of the page: title, status, usage, the controls.
    browser.run(json!({"do": "focus", "label": "Mode"})).await;
    let shot = browser.screenshot("settings.png", false).await;
    eprintln!("settings screenshot: {}", shot.display());
    browser.close().await;
}

/// Installable: a manifest with icons, and a service worker that keeps the
/// app shell, so the app opens with the gateway unreachable (and its API is
/// never answered from a cache).
#[tokio::test]
async fn the_app_installs_and_opens_from_its_cache_with_the_gateway_unreachable() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let Scene { gw, browser, .. } = &mut scene;
    let page = gw.http.get(gw.url("/")).send().await.unwrap();
    assert_eq!(page.headers()["content-security-policy"], CSP);
    assert!(page
        .text()
        .await
        .unwrap()
        .contains(r#"<link rel="manifest" href="/ui/manifest.webmanifest">"#));
    let response = gw
        .http
        .get(gw.url("/ui/manifest.webmanifest"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "application/manifest+json; charset=utf-8"
    );
    let manifest: Value = response.json().await.unwrap();
    assert_eq!(manifest["display"], "standalone");
    assert_eq!(manifest["start_url"], "/#/");
    let mut sizes = Vec::new();
    for icon in manifest["icons"].as_array().unwrap() {
        let served = gw
            .http
            .get(gw.url(icon["src"].as_str().unwrap()))
            .send()
            .await
            .unwrap();
        assert_eq!(served.status(), 200);
        assert_eq!(served.headers()["content-type"], "image/png");
        let png = served.bytes().await.unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        sizes.push(icon["sizes"].as_str().unwrap().to_owned());
    }
    assert!(sizes.contains(&"192x192".into()) && sizes.contains(&"512x512".into()));

    // Once the worker runs, the shell is kept.
    browser.goto("/#/conversations").await;
    browser.run(json!({"do": "sw_ready"})).await;
    browser.goto("/#/conversations").await;
    browser.wait("#new-agent").await;

    // The gateway out of reach: the app still opens, and says it is
    // reconnecting; nothing of the API comes from a cache.
    browser.run(json!({"do": "cut"})).await;
    browser.goto("/#/").await;
    browser.wait("nav a[data-nav=inbox]").await;
    browser.wait("#live.down").await;
    let shot = browser.screenshot("offline.png", false).await;
    eprintln!("offline screenshot: {}", shot.display());
    browser.run(json!({"do": "restore"})).await;
    browser
        .run(json!({"do": "wait", "selector": "#live.down", "state": "detached"}))
        .await;
    browser.close().await;
}

/// Over HTTPS (the gateway's own `tls`): the app loads, and its
/// WebSockets connect over wss:// (a reply streams in live).
#[tokio::test]
async fn the_app_works_over_https() {
    let db = db().await;
    let (_dir, work) = work_dir();
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    std::fs::write(work.join("cert.pem"), made.cert.pem()).unwrap();
    std::fs::write(work.join("key.pem"), made.signing_key.serialize_pem()).unwrap();
    let mut config = Config::for_tests(&db, vec![sdk_agent(&work)]);
    config.tls = Some(acp_gateway::config::TlsFiles {
        cert_file: work.join("cert.pem"),
        key_file: work.join("key.pem"),
    });
    let gw = TestGateway::start_with(config).await;
    let Some((mut browser, origin)) = Browser::open_https(&gw).await else {
        return;
    };
    assert!(origin.starts_with("https://"), "{origin}");
    let https = Client {
        base: gw.base.replacen("http://", "https://", 1),
        http: reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(made.cert.pem().as_bytes()).unwrap(),
            )
            .build()
            .unwrap(),
        token: None,
    };
    let conversation = https.create("sdk").await;
    browser.send_prompt(&conversation, "over tls").await;
    browser
        .wait_for_text("section.message.agent .text", "You said: over tls")
        .await;
    browser.wait("p.turn-end").await;
    assert_eq!(browser.texts("#live").await, [""]);
    browser.close().await;
}

/// Attachments from the page: a photo reaches an SDK agent that takes
/// images as an `image` block with the very bytes picked, a text file as an
/// embedded `resource`; the conversation shows what was sent; an agent that
/// takes no images says so before anything is sent.
#[tokio::test]
async fn a_photo_and_a_file_attached_reach_the_agent() {
    let db = db().await;
    let (_dir, work) = work_dir();
    let state = work.join("agent-state");
    std::fs::create_dir(&state).unwrap();
    let mut seeing = sdk_agent(&work);
    seeing
        .env
        .insert("ACP_TEST_AGENT_STATE".into(), state.display().to_string());
    seeing
        .env
        .insert("ACP_TEST_AGENT_IMAGES".into(), "1".into());
    let blind = AgentProfile {
        name: "blind".into(),
        ..sdk_agent(&work)
    };
    let gw = TestGateway::start(&db, vec![seeing, blind]).await;
    let Some(mut browser) = Browser::open(&gw).await else {
        return;
    };
    // A real PNG (the app's own icon) and a text file.
    let photo = Path::new(env!("CARGO_MANIFEST_DIR")).join("web/icon-192.png");
    let notes = work.join("notes.md");
    std::fs::write(&notes, "# Notes\nthe whiteboard says: ship it\n").unwrap();

    let conversation = gw.create("sdk").await;
    browser.goto(&format!("/#/c/{conversation}")).await;
    browser.wait("#setting-mode").await;
    browser
        .run(json!({"do": "upload", "label": "Attach", "paths": [photo, notes]}))
        .await;
    // The page reads the files before it lists them (both at once).
    browser.wait("ul.attached li:nth-child(2) .name").await;
    assert_eq!(
        browser.texts("ul.attached .name").await,
        ["icon-192.png", "notes.md"]
    );
    browser.fill("Message", "what is on the whiteboard?").await;
    browser.click("button", "Send").await;
    browser.wait("p.turn-end").await;
    browser.wait("section.message.user img.sent").await;
    assert_eq!(
        browser.texts("section.message.user .file").await,
        ["File: notes.md"]
    );
    // The agent got them, byte for byte.
    let calls = std::fs::read_to_string(state.join("calls.jsonl")).unwrap();
    let prompt: Value = calls
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|c| c["method"] == "session/prompt")
        .unwrap();
    let blocks = prompt["params"]["prompt"].as_array().unwrap();
    assert_eq!(blocks[0]["text"], "what is on the whiteboard?");
    assert_eq!(blocks[1]["type"], "image");
    assert_eq!(blocks[1]["mimeType"], "image/png");
    use base64::Engine;
    let sent = base64::engine::general_purpose::STANDARD
        .decode(blocks[1]["data"].as_str().unwrap())
        .unwrap();
    assert_eq!(sent, std::fs::read(&photo).unwrap());
    assert_eq!(blocks[2]["type"], "resource");
    assert_eq!(blocks[2]["resource"]["uri"], "file:///notes.md");
    assert_eq!(
        blocks[2]["resource"]["text"],
        "# Notes\nthe whiteboard says: ship it\n"
    );
    let shot = browser.screenshot("attachments.png", false).await;
    eprintln!("attachments screenshot: {}", shot.display());

    // Larger than the gateway takes (max_body_bytes, 64 KiB here): said
    // plainly, and the attachment kept to be removed.
    let big = work.join("big.txt");
    std::fs::write(&big, "x".repeat(100 * 1024)).unwrap();
    browser
        .run(json!({"do": "upload", "label": "Attach", "paths": [big]}))
        .await;
    browser.wait("ul.attached li .name").await;
    browser.fill("Message", "too much").await;
    browser.click("button", "Send").await;
    browser.wait("form.prompt p.error").await;
    let said = browser.texts("form.prompt p.error").await.concat();
    assert!(said.contains("too large to send"), "{said}");
    assert!(said.contains("max_body_bytes"), "{said}");
    assert_eq!(browser.texts("ul.attached .name").await, ["big.txt"]);
    browser.click("button", "Remove big.txt").await;
    assert!(browser.texts("ul.attached li").await.is_empty());

    // An agent that takes no images: said at once, nothing sent.
    let other = gw.create("blind").await;
    browser.goto(&format!("/#/c/{other}")).await;
    browser.wait("#setting-mode").await;
    browser
        .run(json!({"do": "upload", "label": "Attach", "paths": [photo]}))
        .await;
    browser
        .wait_for_text(
            "form.prompt p.error",
            "icon-192.png: this agent does not take images.",
        )
        .await;
    assert!(browser.texts("ul.attached li").await.is_empty());
    browser.close().await;
}

/// Every view passes axe-core with no violation at all: the
/// inbox (with a request waiting), the conversations, a conversation (its
/// settings, Markdown, a tool call) and the settings.
#[tokio::test]
async fn every_view_passes_axe_core() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let Scene { gw, browser, .. } = &mut scene;
    let conversation = gw.create("sdk").await;
    turn_ended(
        gw,
        &conversation,
        "\n# Heading\n\n- a list\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```\ncode\n```\n",
    )
    .await;
    let mut ws = gw.conversation_ws(&conversation, 0).await;
    gw.prompt(&conversation, "tool").await;
    ws.until_type("permission_requested").await;
    let views = [
        ("/#/", "article.permission"),
        ("/#/conversations", "#new-agent"),
        (
            &format!("/#/c/{conversation}") as &str,
            "section.message.agent .text.md h1",
        ),
        ("/#/settings", "main h1"),
    ];
    for (path, ready) in views {
        browser.goto(path).await;
        browser.wait(ready).await;
        // Not even a minor violation: docs/web-client.md promises none.
        browser.no_axe_violation(path).await;
    }
    browser.close().await;
}

/// A prompt answered to its end (whatever a page shows meanwhile).
async fn turn_ended(gw: &TestGateway, conversation: &str, text: &str) {
    let mut ws = gw.conversation_ws(conversation, 0).await;
    let turn = gw.prompt(conversation, text).await;
    ws.until(|e| e["type"] == "turn_ended" && e["data"]["turn_id"] == turn.as_str())
        .await;
}

/// The conversations page finds a conversation by a word only its agent
/// said, and shows where.
#[tokio::test]
async fn a_search_on_the_page_finds_what_the_agent_said() {
    let db = db().await;
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &["--chunk-delay-ms", "0"])]).await;
    let Some(mut browser) = Browser::open(&gw).await else {
        return;
    };
    for (title, prompt) in [("Release checklist", "long 60"), ("Unrelated", "hello")] {
        let (_, created) = gw
            .post(
                "/api/v1/conversations",
                json!({"agent": "demo", "title": title}),
            )
            .await;
        turn_ended(&gw, created["id"].as_str().unwrap(), prompt).await;
    }
    browser.goto("/#/conversations").await;
    browser.fill("Search conversations", "w42").await;
    browser.click("button", "Search").await;
    browser.wait_for_text("#search-status", "1 found").await;
    assert_eq!(
        browser.texts("ul.results li strong").await,
        ["Release checklist"]
    );
    let snippet = browser.texts("ul.results .snippet").await;
    assert!(snippet[0].contains("w41 w42 w43"), "{snippet:?}");
    assert_eq!(browser.texts("ul.results .snippet mark").await, ["w42"]);
    let shot = browser.screenshot("search.png", false).await;
    eprintln!("search screenshot: {}", shot.display());
    browser.fill("Search conversations", "nowhere").await;
    browser.click("button", "Search").await;
    browser
        .wait_for_text("#search-status", "Nothing found.")
        .await;
    browser.no_axe_violation("search").await;
    browser.close().await;
}

#[tokio::test]
async fn a_request_answered_elsewhere_leaves_the_page() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let Scene { gw, browser, .. } = &mut scene;
    browser.goto("/#/").await;
    browser.wait("#inbox p.empty").await;

    let (conversation, mut ws) = gw.open_conversation("sdk").await;
    gw.prompt(&conversation, "tool").await;
    let frames = ws.until_type("permission_requested").await;
    let request = frames.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    browser
        .wait(&format!("article.permission[data-request-id='{request}']"))
        .await;
    browser.wait("#inbox-count").await;

    // Another device answers first.
    let (status, _) = gw
        .post(
            &format!("/api/v1/permissions/{request}/respond"),
            json!({"option_id": "reject-once"}),
        )
        .await;
    assert_eq!(status, 200);
    browser.wait_gone("article.permission").await;
    browser.wait("#inbox p.empty").await;
    browser
        .run(json!({"do": "wait", "selector": "#inbox-count", "state": "hidden"}))
        .await;

    // The conversation's own card says how it was answered.
    ws.until_type("turn_ended").await;
    browser.goto(&format!("/#/c/{conversation}")).await;
    browser.wait("article.permission .decision").await;
    let decision = browser.texts("article.permission .decision").await;
    assert!(decision[0].contains("Reject"), "{decision:?}");
    assert_eq!(
        browser
            .run(json!({"do": "names", "selector": "article.permission", "role": "button"}))
            .await,
        json!([]),
        "an answered request offers no buttons"
    );
    browser.close().await;
}

#[tokio::test]
async fn a_network_dropped_mid_turn_loses_and_repeats_no_text() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let Scene { gw, browser, .. } = &mut scene;
    let (conversation, mut ws) = gw.open_conversation("sdk").await;
    browser.send_prompt(&conversation, "gated 300").await;

    let first: String = (1..=300).map(|i| format!("a{i} ")).collect();
    let second: String = (1..=300).map(|i| format!("b{i} ")).collect();
    let frames = ws.until_type("permission_requested").await;
    let request = frames.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    browser
        .run(json!({"do": "wait_text", "selector": "section.message.agent .text", "text": first}))
        .await;

    // The network drops; meanwhile the turn goes on and ends.
    browser.run(json!({"do": "cut"})).await;
    browser.wait("#live.down").await;
    let (status, _) = gw
        .post(
            &format!("/api/v1/permissions/{request}/respond"),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 200);
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");

    // It comes back: what was missed arrives once, in order.
    browser.run(json!({"do": "restore"})).await;
    browser.wait("p.turn-end").await;
    browser
        .run(json!({"do": "wait", "selector": "#live.down", "state": "detached"}))
        .await;
    assert_eq!(
        browser.texts("section.message.agent .text").await,
        [first.clone(), second.clone()]
    );
    assert_eq!(
        browser.texts("section.message.user .text").await,
        ["gated 300"]
    );
    assert_eq!(browser.texts("section.tool").await.len(), 1);
    assert_eq!(browser.texts("p.turn-end").await, ["Done"]);
    // As stored.
    let (_, messages) = gw
        .get(&format!("/api/v1/conversations/{conversation}/messages"))
        .await;
    let stored: Vec<String> = messages["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "agent")
        .map(|m| m["content"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(stored.concat(), format!("{first}{second}"));
    browser.close().await;
}

#[tokio::test]
async fn a_turn_cancelled_and_a_conversation_deleted_from_the_page() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let Scene { gw, browser, .. } = &mut scene;
    let (conversation, mut ws) = gw.open_conversation("sdk").await;
    browser.send_prompt(&conversation, "hang").await;
    browser.wait("#cancel:not([disabled])").await;
    browser
        .wait_for_text(
            "section.message.agent .text",
            "Hanging until session/cancel.",
        )
        .await;
    browser.click("button", "Cancel").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");
    browser
        .wait_for_text("p.turn-end", "Ended: cancelled")
        .await;
    browser.wait("#cancel[disabled]").await;

    // Deleted with two taps; it stays in the list, closed.
    browser.goto("/#/conversations").await;
    let row = format!("li.conversation[data-id='{conversation}']");
    browser.wait(&row).await;
    browser.click("button", "Delete conversation").await;
    browser.wait_for_text(&row, "Really delete?").await;
    assert_eq!(gw.conversation(&conversation).await["status"], "idle");
    browser.click("button", "Delete conversation").await;
    browser.wait(&format!("{row} .status.closed")).await;
    assert_eq!(gw.conversation(&conversation).await["status"], "closed");
    assert_eq!(
        browser
            .run(json!({"do": "names", "selector": row, "role": "button"}))
            .await,
        json!([])
    );

    // A conversation that is not there says so, and is not waited for.
    browser
        .goto("/#/c/0190aaaa-0000-7000-8000-000000000000")
        .await;
    browser.wait("form.prompt p.error").await;
    browser.wait("#prompt[disabled]").await;
    browser.close().await;
}

#[tokio::test]
async fn signing_in_with_a_token() {
    let db = db().await;
    let (_dir, work) = work_dir();
    let alice = cli_token(&db, "alice", "user");
    let gw = gateway(&db, &work).await;
    let Some(mut browser) = Browser::open(&gw).await else {
        return;
    };
    browser.goto("/").await;
    browser.wait("#token").await;
    browser.fill("Token", "acpgw_not-a-token").await;
    browser.click("button", "Sign in").await;
    browser
        .wait_for_text("p.error", "That token is not valid.")
        .await;

    browser.fill("Token", &alice).await;
    browser.click("button", "Sign in").await;
    browser.wait_for_text("h1", "Waiting for you").await;
    browser.wait("#sign-out").await;
    // Alice's requests reach her page over the token-carrying WebSocket.
    let as_alice = gw.with_token(&alice);
    let id = &as_alice.create("sdk").await;
    as_alice.prompt(id, "tool").await;
    browser.wait("article.permission").await;

    browser.click("button", "Sign out").await;
    browser.wait("#token").await;
    browser.close().await;
}

/// The page and its files, as a browser gets them (no browser needed).
#[tokio::test]
async fn the_client_is_served_from_the_binary() {
    let db = TestDb::sqlite().await;
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let page = gw.http.get(gw.url("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let headers = page.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(page.text().await.unwrap().contains("/ui/app.js"));

    let script = gw.http.get(gw.url("/ui/app.js")).send().await.unwrap();
    assert_eq!(script.status(), 200);
    assert_eq!(
        script.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    let etag = script.headers()["etag"].clone();
    let again = gw
        .http
        .get(gw.url("/ui/app.js"))
        .header("if-none-match", etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304);
    assert!(again.bytes().await.unwrap().is_empty());

    let missing = gw.http.get(gw.url("/ui/nope.js")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    let outside = gw
        .http
        .get(gw.url("/ui/..%2FCargo.toml"))
        .send()
        .await
        .unwrap();
    assert_eq!(outside.status(), 404);
}

/// Mistral Vibe asks with only `{toolCallId}`: the card shows the command
/// its earlier `tool_call` announced, not a blind "The agent asks
/// permission".
#[tokio::test]
async fn a_request_carrying_only_its_tool_call_id_shows_the_command_on_the_card() {
    let db = db().await;
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let Some(mut browser) = Browser::open(&gw).await else {
        return;
    };
    browser.goto("/#/").await;
    browser.wait("#inbox p.empty").await;
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&conversation, "vibe rm -rf build").await;
    ws.until_type("permission_requested").await;
    browser.wait("article.permission").await;
    let card = browser.texts("article.permission").await.concat();
    for shown in ["Run rm -rf build", "rm -rf build"] {
        assert!(card.contains(shown), "{shown:?} is not on the card: {card}");
    }
    assert!(!card.contains("The agent asks permission"), "{card}");
    browser.click("button", "Reject").await;
    ws.until_type("turn_ended").await;
    browser.close().await;
}

/// A loopback receiver of what the gateway sends out: `/hook` (a webhook
/// target: the notification's JSON body) and `/push` (a Web Push
/// subscription's endpoint: an encrypted payload), each recorded as
/// (path, content-encoding, body).
pub(crate) async fn receiver() -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<(String, String, Vec<u8>)>,
) {
    use axum::extract::Request;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().fallback(move |request: Request| {
        let tx = tx.clone();
        async move {
            let path = request.uri().path().to_owned();
            let encoding = request
                .headers()
                .get("content-encoding")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let body = axum::body::to_bytes(request.into_body(), 1 << 20)
                .await
                .unwrap_or_default();
            let _ = tx.send((path, encoding, body.to_vec()));
            axum::http::StatusCode::CREATED
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, rx)
}

/// Notifications on a phone, end to end: the settings page subscribes this
/// browser (the Push API stubbed at its boundary: offline, Chromium has no
/// push service) and makes a web_push target; an agent asks while nobody
/// looks; the gateway delivers to the subscription's endpoint (encrypted)
/// and to a webhook; the service worker, given that notification as a push
/// (DevTools), shows it with the request's options, and a tap on "Allow
/// once" answers the request through its action URL: the turn goes on.
#[tokio::test]
async fn a_notification_on_this_device_answers_the_request_from_its_button() {
    let Some((mut browser, origin)) = Browser::launch(None).await else {
        return;
    };
    let db = db().await;
    let (receiver_url, mut received) = receiver().await;
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.notifications.base_url = Some(origin.clone());
    config.notifications.grace = std::time::Duration::from_millis(100);
    config.notifications.allow_private_targets = true;
    let gw = TestGateway::start_with(config).await;
    browser.run(json!({"do": "upstream", "url": gw.base})).await;
    browser
        .run(json!({"do": "stub_push", "endpoint": format!("{receiver_url}/push")}))
        .await;

    // "Notify me on this device" from the settings view.
    browser.goto("/#/settings").await;
    browser.run(json!({"do": "sw_ready"})).await;
    browser.click("button", "Notify me on this device").await;
    browser
        .wait_for_text(
            "section.notifications .status",
            "This device gets notifications.",
        )
        .await;
    browser.wait("li.target[data-kind=web_push]").await;
    let (_, targets) = gw.get("/api/v1/notification-targets").await;
    assert_eq!(targets["items"][0]["kind"], "web_push", "{targets}");
    let (status, hook) = gw
        .post(
            "/api/v1/notification-targets",
            json!({"kind": "webhook", "url": format!("{receiver_url}/hook"), "label": "hook"}),
        )
        .await;
    assert_eq!(status, 201, "{hook}");

    // Nobody looks: the page leaves the app (its sockets close), the agent asks.
    browser.goto("/ui/app.css").await;
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&conversation, "tool").await;
    let request = ws.until_type("permission_requested").await.pop().unwrap()["data"].clone();
    let mut pushed = None;
    let mut hooked = None;
    while pushed.is_none() || hooked.is_none() {
        let (path, encoding, body) = tokio::time::timeout(WAIT, received.recv())
            .await
            .expect("the gateway delivers to both targets")
            .unwrap();
        match path.as_str() {
            "/push" => pushed = Some((encoding, body)),
            "/hook" => hooked = Some(serde_json::from_slice::<Value>(&body).unwrap()),
            other => panic!("unexpected delivery to {other}"),
        }
    }
    let (encoding, payload) = pushed.unwrap();
    assert_eq!(encoding, "aes128gcm", "Web Push payloads are encrypted");
    assert!(
        !payload.windows(9).any(|w| w == b"hello.txt"),
        "not in clear"
    );
    let notification = hooked.unwrap();
    assert_eq!(
        notification["event"], "permission_waiting",
        "{notification}"
    );
    assert_eq!(notification["request"]["id"], request["id"]);

    // The service worker shows it, with the request's options as buttons.
    browser
        .run(json!({"do": "push", "data": notification}))
        .await;
    let shown = browser.run(json!({"do": "notifications"})).await;
    assert_eq!(shown.as_array().unwrap().len(), 1, "{shown}");
    assert_eq!(
        shown[0]["title"], "Waiting for you: Write hello.txt",
        "{shown}"
    );
    assert_eq!(shown[0]["tag"], conversation.as_str());
    assert_eq!(shown[0]["actions"][0], "allow-once", "{shown}");

    // A tap on "Allow once" answers it: the agent goes on.
    browser
        .run(json!({"do": "notification_click", "action": "allow-once"}))
        .await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    let (_, answered) = gw
        .get(&format!(
            "/api/v1/permissions/{}",
            request["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(answered["status"], "approved", "{answered}");
    assert_eq!(answered["decision"]["option_id"], "allow-once");
    assert_eq!(answered["decision"]["via"], "notification");
    browser.close().await;
}

/// "Fork from here" on the newest message opens the fork, which shows the
/// history so far; the new-conversation form lists the agent's own
/// sessions, and "Continue" takes one begun elsewhere over.
#[tokio::test]
async fn a_fork_and_a_session_begun_elsewhere_are_opened_from_the_page() {
    let db = db().await;
    let (_dir, work) = work_dir();
    let mut sdk = sdk_agent(&work);
    for (k, v) in [
        ("ACP_TEST_AGENT_STATE", "home"),
        ("ACP_TEST_AGENT_FORK", "1"),
        ("ACP_TEST_AGENT_LIST", "1"),
    ] {
        sdk.env.insert(k.into(), v.into());
    }
    let gw = TestGateway::start(&db, vec![sdk]).await;
    let Some(mut browser) = Browser::open(&gw).await else {
        return;
    };
    let conversation = gw.create("sdk").await;
    turn_ended(&gw, &conversation, "first").await;
    browser.goto(&format!("/#/c/{conversation}")).await;
    browser
        .wait_for_text("section.message.agent", "You said: first")
        .await;
    browser.click("button", "Fork from here").await;
    browser.wait_for_text("#origin", "Forked from").await;
    browser.wait_for_text("h1", "(fork)").await;
    browser
        .wait_for_text("section.message.agent", "You said: first")
        .await;
    assert_eq!(browser.texts("section.message.user .text").await, ["first"]);
    // The fork's view and its button pass axe-core as every view does.
    browser.no_axe_violation("fork").await;
    let shot = browser.screenshot("fork.png", false).await;
    eprintln!("fork screenshot: {}", shot.display());
    let (_, list) = gw.get("/api/v1/conversations").await;
    let fork = list["items"][0].clone();
    assert_eq!(
        fork["forked_from"]["conversation_id"],
        conversation.as_str()
    );

    // A session begun at the desk, in this user's home for the agent.
    let state = db.state_dir().join("homes/anonymous/sdk/.node-agent-state");
    std::fs::write(
        state.join("desk-1.json"),
        json!([
            {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "hello from the desk"}},
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "You said: hello from the desk"}}
        ])
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        state.join("desk-1.meta.json"),
        json!({"sessionId": "desk-1", "cwd": work, "title": "At the desk",
               "updatedAt": "2026-12-01T10:00:00.000Z"})
        .to_string(),
    )
    .unwrap();
    browser.goto("/#/conversations").await;
    browser
        .run(json!({"do": "wait", "selector": "#new-agent option", "state": "attached"}))
        .await;
    browser.click("button", "Continue a session…").await;
    browser
        .wait_for_text("li.session[data-session=desk-1]", "At the desk")
        .await;
    // The gateway's own conversations hold theirs: opened, not taken.
    assert_eq!(
        browser
            .texts("li.session button")
            .await
            .iter()
            .filter(|t| *t == "Continue")
            .count(),
        1
    );
    browser.no_axe_violation("the agent's sessions").await;
    let shot = browser.screenshot("agent-sessions.png", true).await;
    eprintln!("sessions screenshot: {}", shot.display());
    browser.click("button", "Continue").await;
    browser.wait_for_text("#origin", "desk-1").await;
    browser
        .wait_for_text("section.message.agent", "You said: hello from the desk")
        .await;
    browser.close().await;
}
