//! Browsers (issue 17): a real headless Chromium, on a page from another origin, opens `/answer`
//! with `EventSource` while auth is on (a token from `POST /auth/token`, fetched server side as
//! a frontend's backend would, in the query string) and reads it to `done`; a bad token, or a
//! page on an origin the gateway does not allow, gets no stream and nothing reaches a lane.
//!
//! Chromium is driven over the DevTools protocol (`--remote-debugging-port=0`, the port from
//! `DevToolsActivePort` in a temporary profile, a minimal WebSocket client below). Debian's
//! `chromium` is in `scripts/test`'s NEEDS (`CHROMIUM=/path` picks another binary).
//! `SAVE_SCREENSHOT=docs/results/browser/eventsource-done.png` saves the page after `done`.
//!
//! The demo page (issue 32, `GET /demo` with `server.demo = true`, `web/demo.html`): a student
//! types a question and sees the answer stream in with its lane and queue wait; with a course,
//! code and a traceback, the focused context too (and, when the page's own origin is not in
//! `server.cors_allow_origins`, a message saying to add it); `/demo` is 404 when off. The
//! second test leaves a screenshot in `target/tmp/demo.png` (`docs/results/demo.png`).

mod common;

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{StatusCode, Uri};
use axum::response::{Html, IntoResponse};
use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tutor_gateway::config::{Config, CourseConfig, KeyEntry};
use tutor_gateway::lane::Lane;
use tutor_gateway::prompt::focus::{FocusMode, FocusSettings};

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];
const KEY: &str = "sk-tutor-cs101-0123456789";
const PAGE: &str = include_str!("browser/eventsource.html");
/// How long a page may take to reach `done` or an error.
const PAGE_BOUND: Duration = Duration::from_secs(90);
/// Any one step of talking to Chromium (one DevTools reply, a close).
const STEP_BOUND: Duration = Duration::from_secs(60);
/// Chromium's start. The first one on a fresh machine reads ~300 MB from a cold disk and builds
/// its font cache (7-9 s here with cold caches and six busy loops on 2 cores; a fresh CI
/// container once took over 20 s): generous, since it only bounds a hang.
const LAUNCH_BOUND: Duration = Duration::from_secs(180);
/// One Chromium starts at a time, so that two cold starts do not compete for the disk.
static LAUNCHING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// --- the gateway and the frontend's pages ---------------------------------------------------

/// The frontend's web server: its port is known before the gateway starts (the gateway's CORS
/// list names its origin), its pages after (they carry a token the gateway issued).
struct Frontend {
    listener: TcpListener,
    port: u16,
}

impl Frontend {
    async fn bind() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        Frontend { listener, port }
    }

    /// `http://<host>:<port>`: `localhost` and `127.0.0.1` are two origins of one server.
    fn origin(&self, host: &str) -> String {
        format!("http://{host}:{}", self.port)
    }

    /// Serves `pages` (path → HTML) until the test ends.
    fn serve(self, pages: &[(&str, String)]) {
        let pages: Arc<HashMap<String, String>> = Arc::new(
            pages
                .iter()
                .map(|(path, html)| ((*path).to_owned(), html.clone()))
                .collect(),
        );
        let app = axum::Router::new().fallback(move |uri: Uri| {
            let pages = pages.clone();
            async move {
                match pages.get(uri.path()) {
                    Some(html) => Html(html.clone()).into_response(),
                    None => StatusCode::NOT_FOUND.into_response(),
                }
            }
        });
        tokio::spawn(async move { axum::serve(self.listener, app).await });
    }
}

/// Auth on (one key, tenant `cs101`) and CORS allowing `page_origin` only.
async fn gateway(page_origin: &str) -> Harness {
    let origin = page_origin.to_owned();
    harness(FAST, move |c| {
        with_keys(c, &[(KEY, "cs101")]);
        c.auth.token_ttl = Duration::from_secs(600);
        c.server.cors_allow_origins = vec![origin];
    })
    .await
}

/// What the frontend's backend does: trades its API key for an `EventSource` token.
async fn token(h: &Harness) -> String {
    let resp = send(client().post(h.url("/auth/token")).bearer_auth(KEY)).await;
    assert_eq!(resp.status(), 200);
    let issued = read_json(resp).await;
    assert_eq!(issued["tenant"], "cs101");
    issued["token"].as_str().unwrap().to_owned()
}

/// The page, opening `/answer` on the gateway with `token`.
fn page(h: &Harness, token: &str) -> String {
    let url = reqwest::Url::parse_with_params(
        &h.url("/answer"),
        &[
            ("prompt", "what is a closure?"),
            ("max_output_tokens", "24"),
            ("token", token),
        ],
    )
    .unwrap();
    PAGE.replace(
        "__ANSWER_URL__",
        &serde_json::to_string(url.as_str()).unwrap(),
    )
}

fn answer_lines(h: &Harness) -> Vec<Value> {
    let log = h.log.lock().unwrap();
    log.iter()
        .filter(|l| l["route"] == "answer")
        .cloned()
        .collect()
}

// --- Chromium ----------------------------------------------------------------------------------

fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("chromium"))
        .find(|bin| bin.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no `chromium` on PATH: this test drives a real headless browser. `scripts/test` \
                 installs it (Debian's `chromium` package is in its NEEDS; or run \
                 `apt-get install chromium`), or set CHROMIUM=/path/to/chromium"
            )
        })
}

/// A headless Chromium with a temporary profile. `close` shuts it down; drop kills its whole
/// process group if it still runs (a failed or timed-out test), then removes the profile.
struct Browser {
    child: Child,
    profile: PathBuf,
    port: u16,
    /// The browser's own DevTools endpoint (`/devtools/browser/<id>`).
    browser_path: String,
}

impl Browser {
    async fn launch() -> Self {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let _one_at_a_time = LAUNCHING.lock().await;
        let bin = chromium();
        let profile = std::env::temp_dir().join(format!(
            "tutor-gateway-chromium-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).unwrap();
        let log = std::fs::File::create(profile.join("chromium.log")).unwrap();
        let child = Command::new(&bin)
            .args([
                "--headless",
                // Chromium's sandbox refuses to run as root (CI containers).
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-sync",
                "--no-proxy-server",
                "--hide-scrollbars",
                "--mute-audio",
                "--window-size=800,600",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            // Its own process group, so that drop ends the renderers too.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", bin.display()));
        let mut browser = Browser {
            child,
            profile,
            port: 0,
            browser_path: String::new(),
        };
        (browser.port, browser.browser_path) = browser.devtools_port().await;
        browser
    }

    /// Chromium writes the port it picked, and its endpoint, to `DevToolsActivePort`.
    async fn devtools_port(&mut self) -> (u16, String) {
        let file = self.profile.join("DevToolsActivePort");
        let start = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&file) {
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                    if let Ok(port) = port.trim().parse() {
                        return (port, path.trim().to_owned());
                    }
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "chromium exited ({status}) before it listened:\n{}",
                    self.log()
                );
            }
            assert!(
                start.elapsed() < LAUNCH_BOUND,
                "chromium did not open its DevTools port within {LAUNCH_BOUND:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The end of Chromium's own output, for failure messages.
    fn log(&self) -> String {
        let text = std::fs::read_to_string(self.profile.join("chromium.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.contains("dbus")).collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// A DevTools session on the browser's tab.
    async fn tab(&self) -> Tab {
        let targets =
            send_text(client().get(format!("http://127.0.0.1:{}/json/list", self.port))).await;
        let targets = json(&targets);
        let ws = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .unwrap_or_else(|| panic!("no page target: {targets}"))
            .to_owned();
        let mut tab = Tab::connect(&ws).await;
        // An 800x600 page whatever room the headless window keeps for itself.
        let viewport =
            json!({"width": 800, "height": 600, "deviceScaleFactor": 1, "mobile": false});
        tab.call("Emulation.setDeviceMetricsOverride", viewport)
            .await;
        tab
    }
}

impl Browser {
    /// `Browser.close`, and a wait (bounded) for Chromium to exit with its helpers; drop kills
    /// whatever is left.
    async fn close(mut self) {
        let url = format!("ws://127.0.0.1:{}{}", self.port, self.browser_path);
        let mut session = Tab::connect(&url).await;
        session
            .send(&json!({"id": 1, "method": "Browser.close"}).to_string())
            .await;
        let start = Instant::now();
        while start.elapsed() < STEP_BOUND {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            // A failed or timed-out test: kill the whole group, whose id is the child's
            // (`process_group(0)`); `sh`'s kill takes the negative id.
            let group = format!("kill -KILL -- -{} 2>/dev/null", self.child.id());
            let _ = Command::new("sh").args(["-c", &group]).status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// One DevTools WebSocket session (RFC 6455, text frames, no extensions).
struct Tab {
    io: BufReader<TcpStream>,
    next_id: u64,
}

impl Tab {
    async fn connect(ws_url: &str) -> Self {
        let rest = ws_url.strip_prefix("ws://").expect("a ws:// URL");
        let (host, path) = rest.split_once('/').unwrap();
        let stream = TcpStream::connect(host).await.unwrap();
        let mut io = BufReader::new(stream);
        let request = format!(
            "GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        io.get_mut().write_all(request.as_bytes()).await.unwrap();
        let mut status = String::new();
        bounded("the WebSocket handshake", io.read_line(&mut status)).await;
        assert!(status.starts_with("HTTP/1.1 101"), "handshake: {status}");
        loop {
            let mut line = String::new();
            bounded("the WebSocket handshake", io.read_line(&mut line)).await;
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        Tab { io, next_id: 0 }
    }

    async fn send(&mut self, text: &str) {
        let data = text.as_bytes();
        let mask = [0x5a, 0x17, 0xc3, 0x09];
        let mut frame = vec![0x81u8]; // FIN, text
        match data.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= 0xffff => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        frame.extend_from_slice(&mask);
        frame.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.io.get_mut().write_all(&frame).await.unwrap();
    }

    /// The next whole message.
    async fn recv(&mut self) -> std::io::Result<String> {
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            self.io.read_exact(&mut head).await?;
            let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
            let mut len = u64::from(head[1] & 0x7f);
            if len == 126 {
                len = u64::from(self.io.read_u16().await?);
            } else if len == 127 {
                len = self.io.read_u64().await?;
            }
            let mut mask = [0u8; 4];
            let masked = head[1] & 0x80 != 0;
            if masked {
                self.io.read_exact(&mut mask).await?;
            }
            let mut payload = vec![0u8; usize::try_from(len).unwrap()];
            self.io.read_exact(&mut payload).await?;
            if masked {
                payload
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, b)| *b ^= mask[i % 4]);
            }
            match opcode {
                0..=2 => {
                    message.extend_from_slice(&payload);
                    if fin {
                        return String::from_utf8(message).map_err(std::io::Error::other);
                    }
                }
                8 => return Err(std::io::Error::other("DevTools closed the connection")),
                _ => {} // ping, pong: Chromium's DevTools server sends none
            }
        }
    }

    /// A DevTools command's result (events in between are skipped).
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.try_call(method, params)
            .await
            .unwrap_or_else(|error| panic!("{method}: {error}"))
    }

    /// A DevTools command's result, or its error.
    async fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({"id": id, "method": method, "params": params}).to_string();
        self.send(&message).await;
        loop {
            let reply = json(&bounded(method, self.recv()).await);
            if reply["id"] == id {
                return match reply.get("error") {
                    Some(error) => Err(error.clone()),
                    None => Ok(reply["result"].clone()),
                };
            }
        }
    }

    /// What a user sees on the page: its status line, the answer, the stream's request id.
    async fn page_state(&mut self) -> Value {
        let expression = r#"(() => {
            const $ = (id) => document.getElementById(id);
            if (!$("status")) return null;
            return {
                href: location.href,
                origin: location.origin,
                status: $("status").textContent,
                answer: $("answer").textContent,
                token_events: Number($("count").textContent),
                request_id: $("request-id").textContent,
                finish: $("finish").textContent,
                text: document.body.innerText,
            };
        })()"#;
        let params = json!({"expression": expression, "returnByValue": true});
        // Null while the page is still loading (no document yet, or a context just replaced).
        match self.try_call("Runtime.evaluate", params).await {
            Ok(result) => result["result"]["value"].clone(),
            Err(_) => Value::Null,
        }
    }

    /// Opens `url` and waits until its page says `done` or `error…`; that page's state.
    async fn visit(&mut self, url: &str, browser: &Browser) -> Value {
        self.call("Page.navigate", json!({"url": url})).await;
        let start = Instant::now();
        loop {
            let state = self.page_state().await;
            let status = state["status"].as_str().unwrap_or_default();
            if state["href"] == url && (status == "done" || status.starts_with("error")) {
                return state;
            }
            assert!(
                start.elapsed() < PAGE_BOUND,
                "{url} did not finish within {PAGE_BOUND:?}: {state}\nchromium:\n{}",
                browser.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The page as a PNG.
    async fn screenshot(&mut self) -> Vec<u8> {
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64_decode(shot["data"].as_str().unwrap());
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        png
    }
}

async fn bounded<T>(what: &str, step: impl std::future::Future<Output = std::io::Result<T>>) -> T {
    match tokio::time::timeout(STEP_BOUND, step).await {
        Ok(result) => result.unwrap_or_else(|e| panic!("{what}: {e}")),
        Err(_) => panic!("{what}: no answer from chromium within {STEP_BOUND:?}"),
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | value(c) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

fn save_screenshot(png: &[u8]) {
    let Some(path) = std::env::var_os("SAVE_SCREENSHOT") else {
        return;
    };
    let path = Path::new(&path);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(path, png).unwrap();
    eprintln!("screenshot: {} ({} bytes)", path.display(), png.len());
}

// --- the tests ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_page_on_another_origin_reads_an_answer_to_done_with_an_eventsource_token() {
    let frontend = Frontend::bind().await;
    // The page is on `localhost:<one port>`, the gateway on `127.0.0.1:<another>`.
    let origin = frontend.origin("localhost");
    let h = gateway(&origin).await;
    let token = token(&h).await;
    frontend.serve(&[("/", page(&h, &token))]);

    let browser = Browser::launch().await;
    let mut tab = browser.tab().await;
    let url = format!("{origin}/");
    let state = tab.visit(&url, &browser).await;

    // What the student sees: the streamed answer, then `done`.
    assert_eq!(
        state["status"],
        "done",
        "{state}\nchromium:\n{}",
        browser.log()
    );
    assert_eq!(state["origin"], origin.as_str());
    let answer = state["answer"].as_str().unwrap();
    assert!(!answer.trim().is_empty(), "no streamed text: {state}");
    assert!(state["token_events"].as_u64().unwrap() >= 1, "{state}");
    assert!(
        state["finish"]
            .as_str()
            .unwrap()
            .contains("last event id: end"),
        "{state}"
    );
    save_screenshot(&tab.screenshot().await);

    // The gateway's side: the stream the page read was this tenant's, and the token in the URL
    // never reached the request log.
    let request_id = state["request_id"].as_str().unwrap().to_owned();
    assert!(!request_id.is_empty(), "{state}");
    eventually("the request log line", || {
        answer_lines(&h)
            .iter()
            .any(|l| l["request_id"] == request_id.as_str())
    })
    .await;
    let lines = answer_lines(&h);
    let line = lines
        .iter()
        .find(|l| l["request_id"] == request_id.as_str())
        .unwrap();
    assert_eq!(line["tenant"], "cs101", "{line}");
    assert_eq!(line["outcome"], "ok", "{line}");
    assert!(line["output_tokens"].as_u64().unwrap() >= 1, "{line}");
    assert!(!line.to_string().contains(&token));
    // `close()` on `done`: the browser did not start a second generation.
    assert_eq!(lines.len(), 1, "{lines:?}");
    drop(tab);
    browser.close().await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_bad_token_or_a_foreign_origin_gets_the_page_no_stream() {
    let frontend = Frontend::bind().await;
    let allowed = frontend.origin("localhost");
    // The same server under another name: an origin the gateway's CORS list does not have.
    let foreign = frontend.origin("127.0.0.1");
    let h = gateway(&allowed).await;
    let token = token(&h).await;
    // A token whose signature does not match (its last hex digit changed).
    let mut forged = token.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == '0' { '1' } else { '0' });
    frontend.serve(&[("/bad-token", page(&h, &forged)), ("/", page(&h, &token))]);

    let browser = Browser::launch().await;
    let mut tab = browser.tab().await;
    for url in [format!("{allowed}/bad-token"), format!("{foreign}/")] {
        let state = tab.visit(&url, &browser).await;
        assert!(
            state["status"].as_str().unwrap().starts_with("error"),
            "{url}: {state}"
        );
        assert_eq!(state["answer"], "", "{url}: {state}");
        assert_eq!(state["token_events"], 0, "{url}: {state}");
        assert_eq!(state["request_id"], "", "{url}: {state}");
    }
    drop(tab);
    browser.close().await;
    // Refused at the door: nothing was admitted, generated or logged as an answer.
    let m = h.metrics_text().await;
    assert_eq!(family_total(&m, "tutor_gateway_requests_total"), 0.0, "{m}");
    assert!(answer_lines(&h).is_empty());
    h.shutdown().await;
}

// --- the demo page (issue 32) ------------------------------------------------------------------

/// The longest answer the demo tests ask for.
const DEMO_MAX_TOKENS: &str = "24";

/// A gateway with `server.demo` on (shipped config otherwise), a focusing course `py101`, and
/// `tweak` given the gateway's own origin, known before it starts (the listener is bound first).
async fn demo_gateway(tweak: impl FnOnce(&mut Config, &str)) -> Harness {
    demo_gateway_on(FAST, tweak).await
}

/// [`demo_gateway`] with the simulator started with `sim_args`.
async fn demo_gateway_on(sim_args: &[&str], tweak: impl FnOnce(&mut Config, &str)) -> Harness {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(sim_args))
        .await
        .expect("sim starts");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let mut config = Config::default();
    config.upstream.base_url = sim.url();
    config.server.demo = true;
    let focus = FocusSettings {
        mode: FocusMode::Auto,
        // A parse time limit a debug build on a busy machine never reaches.
        timeout: Duration::from_secs(30),
        ..FocusSettings::default()
    };
    let course = CourseConfig::new(
        "py101",
        "2026.1",
        "You are a patient Python tutor. Give hints before answers.",
        "",
        "",
        None,
    )
    .with_focus(focus);
    config.courses.insert("py101".into(), course);
    tweak(&mut config, &origin);
    let tasks = tokio_util::task::TaskTracker::new();
    let (request_log, log) = tutor_gateway::telemetry::RequestLog::memory();
    let state = tutor_gateway::server::build_state_with_log(config, tasks.clone(), request_log)
        .expect("gateway state");
    let gw = tutor_gateway::server::serve_state(state, tasks, listener).expect("gateway starts");
    assert_eq!(gw.url(), origin);
    Harness { sim, gw, log }
}

/// What the student fills in on the demo page; empty fields are left alone.
#[derive(Default)]
struct Ask<'a> {
    question: &'a str,
    course: &'a str,
    path: &'a str,
    code: &'a str,
    trace: &'a str,
}

/// A code file and its traceback (the focusing corpus' library case: a 350-line file whose
/// crash needs three of its functions).
fn library_case() -> (String, String) {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/focus/py_long_library_fines");
    let case: toml::Value =
        toml::from_str(&std::fs::read_to_string(dir.join("case.toml")).unwrap()).unwrap();
    (
        std::fs::read_to_string(dir.join("library.py")).unwrap(),
        case["trace"].as_str().unwrap().to_owned(),
    )
}

impl Tab {
    /// Runs `expression` in the page; its value.
    async fn eval(&mut self, expression: &str) -> Value {
        let params = json!({"expression": expression, "returnByValue": true});
        let result = self.call("Runtime.evaluate", params).await;
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// What the demo page shows (null while it is loading).
    async fn demo_state(&mut self) -> Value {
        let expression = r#"(() => {
            const $ = (id) => document.getElementById(id);
            if (document.readyState !== "complete" || !$("status")) return null;
            const shown = {};
            for (const id of ["status", "lane", "queue-wait", "estimate", "focus", "finish",
                              "request-id", "notice", "error", "answer"]) {
                shown[id] = $(id).textContent;
            }
            shown.href = location.href;
            shown.sending = $("send").disabled;
            return shown;
        })()"#;
        let params = json!({"expression": expression, "returnByValue": true});
        match self.try_call("Runtime.evaluate", params).await {
            Ok(result) => result["result"]["value"].clone(),
            Err(_) => Value::Null,
        }
    }

    /// Opens the demo page at `url`, fills it in as a student would (the question typed, the
    /// rest pasted), presses Ask and waits (bounded) until it says `done` or `error…`.
    async fn ask_demo(&mut self, url: &str, ask: &Ask<'_>, browser: &Browser) -> Value {
        self.send_demo(url, ask, browser).await;
        self.until_ended(url, browser).await
    }

    /// Polls the demo page until it says `done` or `error…`; that state.
    async fn until_ended(&mut self, url: &str, browser: &Browser) -> Value {
        self.until(url, browser, |s| {
            let status = s["status"].as_str().unwrap_or_default();
            status == "done" || status.starts_with("error")
        })
        .await
    }

    /// [`Tab::ask_demo`] up to pressing Ask.
    async fn send_demo(&mut self, url: &str, ask: &Ask<'_>, browser: &Browser) {
        self.call("Page.navigate", json!({"url": url})).await;
        self.until(url, browser, |s| s["status"] == "ready").await;
        self.eval(r#"document.getElementById("question").focus()"#)
            .await;
        self.call("Input.insertText", json!({"text": ask.question}))
            .await;
        let paste = json!({
            "course": ask.course,
            "path": ask.path,
            "code": ask.code,
            "trace": ask.trace,
            "max-tokens": DEMO_MAX_TOKENS,
        });
        self.eval(&format!(
            r#"(() => {{
                const fields = {paste};
                for (const [id, value] of Object.entries(fields)) {{
                    if (value) document.getElementById(id).value = value;
                }}
                if (fields.code || fields.trace) document.getElementById("more").open = true;
                document.getElementById("send").click();
            }})()"#
        ))
        .await;
    }

    /// Polls the demo page until `done` holds for what it shows; that state.
    async fn until(
        &mut self,
        url: &str,
        browser: &Browser,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let start = Instant::now();
        loop {
            let state = self.demo_state().await;
            if state["href"] == url && done(&state) {
                return state;
            }
            assert!(
                start.elapsed() < PAGE_BOUND,
                "{url} did not get there within {PAGE_BOUND:?}: {state}\nchromium:\n{}",
                browser.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The README's two browser snippets ("The `/answer` stream", "In a browser"): `EventSource`,
/// then `fetch`.
fn readme_snippets() -> (String, String) {
    let readme = include_str!("../README.md");
    let section = &readme[readme
        .find("**In a browser.**")
        .expect("the README's snippets")..];
    let mut blocks = section
        .split("```js\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap().to_owned());
    (blocks.next().unwrap(), blocks.next().unwrap())
}

impl Tab {
    /// Runs a README snippet on a fresh demo page at `url` (for its `#answer` and `#status`, and
    /// its origin) and waits until its status says `done…` or `error…`.
    async fn run_snippet(&mut self, url: &str, script: &str, browser: &Browser) -> Value {
        self.call("Page.navigate", json!({"url": url})).await;
        self.until(url, browser, |s| s["status"] == "ready").await;
        self.eval(script).await;
        self.until(url, browser, |s| {
            let status = s["status"].as_str().unwrap_or_default();
            status.starts_with("done") || status.starts_with("error")
        })
        .await
    }
}

/// The demo page says `done` with an answer shown.
fn answered(state: &Value, browser: &Browser) {
    assert_eq!(
        state["status"],
        "done",
        "{state}\nchromium:\n{}",
        browser.log()
    );
    assert!(
        !state["answer"].as_str().unwrap().trim().is_empty(),
        "{state}"
    );
}

/// The request log line of `request_id`, once written.
async fn logged(h: &Harness, request_id: &str) -> Value {
    eventually("the request log line", || {
        answer_lines(h)
            .iter()
            .any(|l| l["request_id"] == request_id)
    })
    .await;
    answer_lines(h)
        .into_iter()
        .find(|l| l["request_id"] == request_id)
        .unwrap()
}

#[tokio::test]
async fn the_demo_page_streams_an_answer_with_its_lane_and_queue_wait() {
    // Nothing configured but `server.demo`: a question alone goes as GET, which needs no CORS
    // entry for the page's own origin.
    let h = demo_gateway(|_, _| {}).await;
    let url = h.url("/demo");
    let browser = Browser::launch().await;
    let mut tab = browser.tab().await;
    let question = "Why does my while loop never end?";
    let ask = Ask {
        question,
        ..Ask::default()
    };
    let state = tab.ask_demo(&url, &ask, &browser).await;

    // What the student sees: the answer streamed in, the lane, the queue wait, no focusing.
    assert_eq!(
        state["status"],
        "done",
        "{state}\nchromium:\n{}",
        browser.log()
    );
    assert_eq!(state["error"], "", "{state}");
    assert!(
        !state["answer"].as_str().unwrap().trim().is_empty(),
        "{state}"
    );
    assert_eq!(state["lane"], "small", "{state}");
    let wait = state["queue-wait"].as_str().unwrap();
    let ms: f64 = wait
        .strip_suffix(" ms")
        .unwrap_or("x")
        .parse()
        .unwrap_or(-1.0);
    assert!(ms >= 0.0, "queue wait {wait:?}: {state}");
    assert_eq!(state["focus"], "none (no code sent)", "{state}");
    assert!(
        state["finish"].as_str().unwrap().contains("tokens out"),
        "{state}"
    );
    assert_eq!(state["sending"], false, "the button is back: {state}");

    // A pre-empted answer's notice (`jobs.preempt_notice`: a second `meta` with only
    // `{"preempted": n}`, as the relay writes it) is a notice; what the page showed stays.
    tab.eval(r#"on.meta({"preempted": 1})"#).await;
    let noticed = tab.demo_state().await;
    assert!(
        noticed["notice"]
            .as_str()
            .unwrap()
            .contains("Paused 1 time"),
        "{noticed}"
    );
    for shown in [
        "lane",
        "queue-wait",
        "estimate",
        "request-id",
        "focus",
        "status",
    ] {
        assert_eq!(noticed[shown], state[shown], "{shown}: {noticed}");
    }

    // The gateway's side: that stream, this question, answered in full once.
    let line = logged(&h, state["request-id"].as_str().unwrap()).await;
    assert_eq!(line["outcome"], "ok", "{line}");
    assert_eq!(line["lane"], "small", "{line}");
    let out = line["output_tokens"].as_u64().unwrap();
    assert!((1..=24).contains(&out), "{line}");
    assert_eq!(answer_lines(&h).len(), 1);

    // The README's EventSource snippet, as written, reads a whole answer and closes.
    let (event_source, _) = readme_snippets();
    let state = tab
        .run_snippet(&url, &format!("{{\n{event_source}\n}}"), &browser)
        .await;
    let status = state["status"].as_str().unwrap();
    assert!(status.starts_with("done: "), "{state}");
    assert!(
        !state["answer"].as_str().unwrap().trim().is_empty(),
        "{state}"
    );
    eventually("the snippet's request logged", || {
        answer_lines(&h).len() == 2
    })
    .await;
    assert!(answer_lines(&h).iter().all(|l| l["outcome"] == "ok"));
    drop(tab);
    browser.close().await;
    h.shutdown().await;
}

#[tokio::test]
async fn the_demo_page_sends_code_and_a_traceback_and_shows_the_focused_context() {
    let (code, trace) = library_case();
    let ask = Ask {
        question: "Why does printing the fines crash?",
        course: "py101",
        path: "library.py",
        code: &code,
        trace: &trace,
    };
    let browser = Browser::launch().await;
    let mut tab = browser.tab().await;

    // The page's own origin not listed: its POST (which carries an Origin) is refused at the
    // door, and the page says what to configure.
    let closed = demo_gateway(|_, _| {}).await;
    let url = closed.url("/demo");
    let state = tab.ask_demo(&url, &ask, &browser).await;
    let error = state["error"].as_str().unwrap();
    assert_eq!(state["status"], "error: origin_not_allowed", "{state}");
    assert!(error.contains("server.cors_allow_origins"), "{state}");
    assert!(error.contains(closed.gw.url().as_str()), "{state}");
    assert_eq!((&state["answer"], &state["lane"]), (&json!(""), &json!("")));
    let m = closed.metrics_text().await;
    assert_eq!(family_total(&m, "tutor_gateway_requests_total"), 0.0, "{m}");
    closed.shutdown().await;

    // Listed: the course request streams, and the page shows what focusing sent.
    let h = demo_gateway(|c, origin| c.server.cors_allow_origins = vec![origin.to_owned()]).await;
    let url = h.url("/demo");
    let state = tab.ask_demo(&url, &ask, &browser).await;
    answered(&state, &browser);
    let focus = state["focus"].as_str().unwrap();
    assert!(focus.starts_with("focused, "), "{state}");
    for function in ["days_between", "LoanService.overdue_fines", "main"] {
        assert!(focus.contains(function), "{function}: {state}");
    }
    assert!(!state["lane"].as_str().unwrap().is_empty(), "{state}");
    let line = logged(&h, state["request-id"].as_str().unwrap()).await;
    assert_eq!(line["outcome"], "ok", "{line}");
    assert_eq!(line["lane"], state["lane"], "{line}");

    // The README's fetch snippet, as written, POSTs a course request and reads it to `done`.
    let (_, fetch) = readme_snippets();
    let script = format!(
        "(async () => {{\n\
         const answer = document.getElementById(\"answer\"), status = document.getElementById(\"status\");\n\
         const code = {code}, stack_trace = {trace};\n{fetch}\n}})()\n\
         .catch((e) => {{ document.getElementById(\"status\").textContent = \"error: \" + e; }});",
        code = json!(code),
        trace = json!(trace),
    );
    let snippet = tab.run_snippet(&url, &script, &browser).await;
    let status = snippet["status"].as_str().unwrap();
    assert!(status.starts_with("done: "), "{snippet}");
    assert!(
        !snippet["answer"].as_str().unwrap().trim().is_empty(),
        "{snippet}"
    );
    // Back to the page's own answer for the screenshot.
    let again = tab.ask_demo(&url, &ask, &browser).await;
    assert_eq!(again["status"], "done", "{again}");

    // The screenshot in docs/results/demo.png: copied by hand from here.
    let viewport = json!({"width": 900, "height": 700, "deviceScaleFactor": 1, "mobile": false});
    tab.call("Emulation.setDeviceMetricsOverride", viewport)
        .await;
    tab.eval("window.scrollTo(0, document.body.scrollHeight)")
        .await;
    let png = tab.screenshot().await;
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("demo.png");
    std::fs::write(&shot, png).unwrap();
    eprintln!("screenshot: {}", shot.display());
    drop(tab);
    browser.close().await;
    h.shutdown().await;
}

/// A review that waits too long for the large lane's seat moves to a background job
/// (`jobs.divert_large_after_ms`): the page says so, follows the job's events and shows its
/// answer to the end.
#[tokio::test]
async fn the_demo_page_follows_a_review_that_moved_to_a_job() {
    // A fifth of real time (about 25 ms a token): the review that holds the seat is still
    // streaming when the page asks, however slow the machine; the dropped one frees it.
    let sim = [
        "--speed",
        "0.2",
        "--profile",
        "tiny-test",
        "--mean-output-tokens",
        "1000000",
    ];
    let h = demo_gateway_on(&sim, |c, origin| {
        c.server.cors_allow_origins = vec![origin.to_owned()];
        set_lane(c, Lane::Large, 1);
        c.jobs.divert_large_after = Some(Duration::from_millis(150));
    })
    .await;
    let holder = client()
        .post(h.url("/answer"))
        .json(&json!({"prompt": words(5500, "holder"), "max_output_tokens": 2000}))
        .send()
        .await
        .unwrap();
    assert_eq!(holder.status(), 200);
    eventually("the first review holds the seat", || {
        h.in_flight(Lane::Large) == 1
    })
    .await;

    let url = h.url("/demo");
    let browser = Browser::launch().await;
    let mut tab = browser.tab().await;
    let code = words(5500, "review");
    let ask = Ask {
        question: "Please review this module.",
        course: "py101",
        code: &code,
        ..Ask::default()
    };
    tab.send_demo(&url, &ask, &browser).await;
    let moved = tab
        .until(&url, &browser, |s| {
            s["notice"]
                .as_str()
                .is_some_and(|n| n.contains("background job"))
                || s["status"].as_str().is_some_and(|t| t.starts_with("error"))
        })
        .await;
    assert!(
        moved["notice"].as_str().unwrap().contains("background job"),
        "{moved}"
    );
    assert_eq!(
        moved["answer"], "",
        "nothing answered before its seat: {moved}"
    );
    // The seat comes back; the job runs and the page shows its answer from the job's events.
    drop(holder);
    let state = tab.until_ended(&url, &browser).await;
    answered(&state, &browser);
    let finish = state["finish"].as_str().unwrap();
    assert!(
        finish.contains(&format!("{DEMO_MAX_TOKENS} tokens out")),
        "{state}"
    );
    assert_eq!(state["error"], "", "{state}");
    drop(tab);
    browser.close().await;
    h.shutdown().await;
}

#[tokio::test]
async fn demo_is_404_unless_turned_on_and_is_served_under_a_strict_policy() {
    // Off (the shipped default), even with [auth] on: 404, not 401.
    let off = harness(FAST, |c| {
        c.auth.enabled = true;
        c.auth.keys = vec![KeyEntry {
            sha256: tutor_gateway::sign::sha256_hex(KEY.as_bytes()),
            tenant: "cs101".into(),
        }];
    })
    .await;
    assert!(!off.gw.state.config().server.demo);
    let resp = client().get(off.url("/demo")).send().await.unwrap();
    // As any path not served: the error in the OpenAI shape, not an empty body.
    let err = assert_error(resp, 404, "not_found").await;
    assert!(!err.to_string().contains("<html"));
    off.shutdown().await;

    // On, with [auth] on: the page loads without a key (it holds nothing); /answer still asks.
    let on = demo_gateway(|c, _| {
        c.auth.enabled = true;
        c.auth.keys = vec![KeyEntry {
            sha256: tutor_gateway::sign::sha256_hex(KEY.as_bytes()),
            tenant: "cs101".into(),
        }];
    })
    .await;
    let resp = client().get(on.url("/demo")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    assert_eq!(header("content-type"), "text/html; charset=utf-8");
    assert_eq!(header("x-content-type-options"), "nosniff");
    let csp = header("content-security-policy");
    assert!(
        csp.starts_with("default-src 'none'; script-src 'sha256-"),
        "{csp}"
    );
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(!csp.contains("unsafe"), "{csp}");
    assert!(resp
        .text()
        .await
        .unwrap()
        .contains("<title>Tutor gateway demo</title>"));
    let answer = client()
        .get(on.url("/answer?prompt=hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 401);
    on.shutdown().await;
}
