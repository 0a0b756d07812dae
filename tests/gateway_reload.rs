//! Changing the configuration live (issue 18, item 1): a reload raises and lowers a lane's
//! limit under load without cutting a stream (a lowered lane admits nobody until it is under
//! its new limit), an invalid file is refused with every problem named and the old
//! configuration stays, settings that need a restart are reported and left alone, and every
//! reload is counted.

mod common;

use std::time::Duration;

use common::process::GatewayProcess;
use common::*;
use serde_json::{json, Value};
use tutor_gateway::config::Config;
use tutor_gateway::lane::Lane;
use tutor_gateway::pipeline::reload;

fn small(c: &mut Config, n: u32) {
    set_lane(c, Lane::Small, n);
}

#[tokio::test]
async fn a_reload_raises_and_lowers_a_lanes_limit_and_a_shrink_cuts_nothing() {
    // A quarter of real speed: 20 ms a token.
    let h = harness(
        &flags("--speed 0.25 --profile tiny-test --mean-output-tokens 1000000"),
        |c| {
            small(c, 2);
            // Lowered to one seat, the last of the eight waits about 20 s.
            c.lanes.small.queue.timeout = Duration::from_secs(120);
        },
    )
    .await;
    let base = (*h.gw.state.config()).clone();
    // Eight small questions, each streaming for about 5 s (250 tokens: under the small
    // lane's 256, never promoted), so all eight are in before the first two end, on a loaded
    // machine too.
    let mut streams = Vec::new();
    for i in 0..8 {
        let url = h.url("/answer");
        streams.push(tokio::spawn(async move {
            let body = json!({"prompt": format!("why does loop {i} never end"),
                              "max_output_tokens": 250});
            let resp = send(client().post(url).json(&body)).await;
            sse(&resp.text().await.unwrap())
        }));
    }
    eventually("two stream, six wait", || {
        h.in_flight(Lane::Small) == 2 && h.queued(Lane::Small) == 6
    })
    .await;
    // Raise the limit to 4: two more are admitted at once.
    let mut raised = base.clone();
    small(&mut raised, 4);
    let r = reload::apply(&h.gw.state, raised).unwrap();
    assert_eq!(r.changed, vec!["lanes"]);
    assert!(r.left_alone.is_empty());
    eventually("four stream", || h.in_flight(Lane::Small) == 4).await;
    // Lower it to 1: nobody is cut; nobody new is admitted until the lane is under 1.
    let mut lowered = base.clone();
    small(&mut lowered, 1);
    reload::apply(&h.gw.state, lowered).unwrap();
    let mut last = h.in_flight(Lane::Small);
    let mut shrank = false;
    for _ in 0..12_000 {
        let now = h.in_flight(Lane::Small);
        if last > 1 {
            assert!(
                now <= last,
                "a lane above its lowered limit admitted someone ({last} -> {now})"
            );
        }
        if now <= 1 {
            shrank = true;
        }
        last = now;
        if h.queued(Lane::Small) == 0 && now == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(shrank, "the lane came down to its new limit");
    for s in streams {
        let events = s.await.unwrap();
        assert_eq!(
            events.last().unwrap().0,
            "done",
            "no stream was cut: {events:?}"
        );
    }
    eventually("every seat back", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn an_invalid_file_is_refused_and_restart_only_settings_are_left_alone() {
    let dir = std::env::temp_dir().join(format!("tg-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.toml");
    let h = harness(&["--speed", "50", "--profile", "tiny-test"], |c| {
        c.server.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    h.gw.state.set_config_path(path.clone());
    let admin = format!("http://{}", h.gw.admin_addr.unwrap());
    let reload_now = || {
        let url = format!("{admin}/admin/reload");
        async move {
            let resp = send(client().post(url).json(&json!({}))).await;
            let status = resp.status().as_u16();
            (status, read_json(resp).await)
        }
    };
    let info = |m: &str| -> Vec<String> {
        m.lines()
            .filter(|l| l.starts_with("tutor_gateway_config_info{"))
            .map(str::to_owned)
            .collect()
    };
    let before = info(&get_text(&format!("{admin}/metrics")).await);
    assert_eq!(before.len(), 1, "{before:?}");
    // Two problems in two sections: both named, nothing applied.
    std::fs::write(
        &path,
        "[classify]\ntokenizer = \"heuristic\"\n[lanes.small]\nmax_concurrency = 0\n\
         [upstream]\nbase_url = \"ftp://nowhere\"\n",
    )
    .unwrap();
    let (status, v) = reload_now().await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["status"], "invalid");
    let problems: Vec<&str> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("lanes.small.max_concurrency")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.starts_with("upstream.base_url")),
        "{problems:?}"
    );
    let metrics = get_text(&format!("{admin}/metrics")).await;
    assert_eq!(
        info(&metrics),
        before,
        "the old configuration stays in force"
    );
    assert_eq!(
        metric(
            &metrics,
            "tutor_gateway_config_reloads_total{outcome=\"invalid\"}"
        ),
        1.0
    );
    // A valid file: the lane change applies; a new listen address is reported, not applied.
    let upstream = h.gw.state.config().upstream.base_url.clone();
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:1\"\n[classify]\ntokenizer = \"heuristic\"\n\
             [upstream]\nbase_url = \"{upstream}\"\n\
             [server]\nadmin_listen = \"127.0.0.1:0\"\nmax_body_bytes = 2048\n\
             [fields]\nmax_stop_strings = 1\n\
             [lanes.small]\nmax_concurrency = 7\nceiling = 7\n"
        ),
    )
    .unwrap();
    let (status, v) = reload_now().await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "applied");
    let changed: Vec<Value> = v["changed"].as_array().unwrap().clone();
    assert!(changed.contains(&json!("lanes")), "{v}");
    assert!(changed.contains(&json!("fields")), "{v}");
    let left_alone = v["left_alone"].as_array().unwrap();
    assert!(left_alone.contains(&json!("listen")), "{v}");
    // The routes' body limit is built in at start: named, not applied.
    assert!(left_alone.contains(&json!("server.max_body_bytes")), "{v}");
    let config = h.gw.state.config();
    assert_ne!(config.server.max_body_bytes, 2048);
    assert_eq!(config.fields.max_stop_strings, 1);
    assert_eq!(config.lanes.small.max_concurrency.get(), 7);
    assert_ne!(config.listen.port(), 1, "the listen address is left alone");
    let metrics = get_text(&format!("{admin}/metrics")).await;
    let after = info(&metrics);
    assert_eq!(after.len(), 1);
    assert_ne!(after, before, "the new configuration is named");
    assert!(after[0].contains(&config.fingerprint()), "{after:?}");
    assert_eq!(
        metric(
            &metrics,
            "tutor_gateway_config_reloads_total{outcome=\"applied\"}"
        ),
        1.0
    );
    // Answers still flow on the running listener, under the new limits.
    let resp = send(
        client()
            .post(h.url("/answer"))
            .json(&json!({"prompt": "what is a closure?", "max_output_tokens": 4})),
    )
    .await;
    assert_eq!(sse(&resp.text().await.unwrap()).last().unwrap().0, "done");
    // The public listener has no /admin routes.
    let public = send(client().post(h.url("/admin/reload"))).await;
    assert_eq!(public.status(), 404);
    h.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A gateway process started from a config file with an admin listener, `small` seats in the
/// small lane and more `[server]` lines; its file can be rewritten (`file`).
struct FromFile {
    gw: GatewayProcess,
    /// `http://127.0.0.1:<port>` of its admin listener (port 0 in the file: the process picks).
    admin: String,
    upstream: String,
    server: &'static str,
}

impl FromFile {
    /// Starts `tutor-gateway serve --config FILE` and waits until it answers.
    async fn start(tag: &str, upstream: String, server: &'static str, small: u32) -> Self {
        let gw = GatewayProcess::start(tag, &rest(server, &upstream, small), &[]).await;
        let admin = gw.admin_url().await;
        let me = FromFile {
            gw,
            admin,
            upstream,
            server,
        };
        for _ in 0..1500 {
            if client().get(me.metrics_url()).send().await.is_ok() {
                return me;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the admin listener did not come up:\n{}", me.gw.log());
    }

    /// The file's text with `small` seats in the small lane.
    fn file(&self, small: u32) -> String {
        self.gw
            .config_text(&rest(self.server, &self.upstream, small))
    }

    fn metrics_url(&self) -> String {
        format!("{}/metrics", self.admin)
    }

    async fn metrics(&self) -> String {
        get_text(&self.metrics_url()).await
    }

    /// Waits until `/metrics` satisfies `done`; false if it never does.
    async fn until(&self, done: impl Fn(&str) -> bool) -> bool {
        for _ in 0..1500 {
            if done(&self.metrics().await) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// A question answered to the end through the public listener.
    async fn answers(&self) -> bool {
        let resp = send(
            client()
                .post(format!("{}/answer", self.gw.url))
                .json(&json!({"prompt": "what is a closure?", "max_output_tokens": 4})),
        )
        .await;
        sse(&resp.text().await.unwrap()).last().unwrap().0 == "done"
    }
}

/// A [`FromFile`] config after its `listen` line.
fn rest(server: &str, upstream: &str, small: u32) -> String {
    format!(
        "[server]\nadmin_listen = \"127.0.0.1:0\"\n{server}\n\
         [telemetry]\nrequest_log = \"off\"\n[classify]\ntokenizer = \"heuristic\"\n\
         [upstream]\nbase_url = \"{upstream}\"\n\
         [lanes.small]\nmax_concurrency = {small}\nceiling = {small}\n"
    )
}

fn config_info(m: &str) -> Option<String> {
    m.lines()
        .find(|l| l.starts_with("tutor_gateway_config_info{"))
        .map(str::to_owned)
}

fn reloads(m: &str, outcome: &str) -> f64 {
    metric(
        m,
        &format!("tutor_gateway_config_reloads_total{{outcome=\"{outcome}\"}}"),
    )
}

/// SIGHUP on a gateway process re-reads its file: the new configuration is named in
/// `/metrics` and the reload counted, and the gateway keeps serving.
#[tokio::test]
async fn sighup_reloads_the_file_of_a_running_gateway() {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&flags(
        "--speed 50 --profile tiny-test",
    )))
    .await
    .unwrap();
    let gw = FromFile::start("sighup", sim.url(), "", 3).await;
    let before = config_info(&gw.metrics().await).unwrap();
    std::fs::write(&gw.gw.path, gw.file(5)).unwrap();
    gw.gw.sighup();
    // A scrape gathers the metric families one by one, so one taken during the reload may
    // show the new name before the count: wait for both, then check the count once more.
    let reloaded = gw
        .until(|m| config_info(m).is_some_and(|i| i != before) && reloads(m, "applied") >= 1.0)
        .await;
    assert!(reloaded, "the reloaded configuration is named in /metrics");
    assert_eq!(reloads(&gw.metrics().await, "applied"), 1.0);
    // Still serving, and still the same process.
    assert!(gw.answers().await);
    drop(gw);
    sim.shutdown().await;
}

/// With `server.config_watch_ms`, a change to the file is put in force without a signal (as a
/// Kubernetes ConfigMap update arrives: the mounted file is replaced); a broken file is refused
/// once, not again at every look, and the configuration in force stays.
#[tokio::test]
async fn a_watched_file_is_reloaded_when_it_changes_and_a_broken_one_is_refused_once() {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&flags(
        "--speed 50 --profile tiny-test",
    )))
    .await
    .unwrap();
    let gw = FromFile::start("watch", sim.url(), "config_watch_ms = 100", 3).await;
    let first = config_info(&gw.metrics().await).unwrap();
    // Replaced, not edited in place: a new file renamed over the old one (so the watcher never
    // reads a half-written file).
    let replace = |text: &str| {
        let next = gw.gw.dir.join("config.toml.new");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &gw.gw.path).unwrap();
    };
    replace(&gw.file(5));
    let changed = gw
        .until(|m| config_info(m).is_some_and(|i| i != first) && reloads(m, "applied") >= 1.0)
        .await;
    assert!(changed, "the changed file was put in force");
    let second = config_info(&gw.metrics().await).unwrap();
    // A broken file: refused and counted once; the configuration in force stays.
    let broken_at = std::time::Instant::now();
    replace("[lanes.small]\nmax_concurrency = 0\n");
    assert!(gw.until(|m| reloads(m, "invalid") >= 1.0).await);
    // Many looks later (ten a second) it has been tried again at most once every 20 looks
    // (`RETRY_LOOKS`, 2 s here), and nothing else was reloaded. Bounded by the time gone by:
    // a loaded machine's slow scrape is not a retry too many.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let m = gw.metrics().await;
    let retries_allowed = broken_at.elapsed().as_millis() / 2000;
    assert!(
        reloads(&m, "invalid") <= 1.0 + retries_allowed as f64,
        "refused {} times in {:?}",
        reloads(&m, "invalid"),
        broken_at.elapsed()
    );
    assert_eq!(reloads(&m, "applied"), 1.0);
    assert_eq!(config_info(&m).unwrap(), second);
    assert!(gw.answers().await);
    // Mended: put in force again.
    replace(&gw.file(3));
    assert!(gw.until(|m| reloads(m, "applied") >= 2.0).await);
    drop(gw);
    sim.shutdown().await;
}

/// A watched file naming another file that is not there yet (a key or a tokenizer that another
/// volume mounts later) is refused, and tried again every `RETRY_LOOKS` looks while it does not
/// change: once that file is there, it is put in force without an edit (it was refused until
/// the file itself changed).
#[tokio::test]
async fn a_watched_file_refused_for_a_file_it_names_is_tried_again_until_that_file_is_there() {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&flags(
        "--speed 50 --profile tiny-test",
    )))
    .await
    .unwrap();
    let gw = FromFile::start("watch-retry", sim.url(), "config_watch_ms = 100", 3).await;
    let key = gw.gw.dir.join("vllm-key");
    let text = gw.file(5).replace(
        "[upstream]\n",
        &format!("[upstream]\napi_key_file = \"{}\"\n", key.display()),
    );
    let next = gw.gw.dir.join("config.toml.new");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, &gw.gw.path).unwrap();
    assert!(gw.until(|m| reloads(m, "invalid") >= 1.0).await);
    assert_eq!(reloads(&gw.metrics().await, "applied"), 0.0);
    // The key comes: the unchanged file is put in force.
    std::fs::write(&key, "sk-vllm-mounted-later\n").unwrap();
    assert!(
        gw.until(|m| reloads(m, "applied") >= 1.0).await,
        "the file was never tried again:\n{}",
        gw.gw.log()
    );
    assert!(gw.answers().await);
    drop(gw);
    sim.shutdown().await;
}

/// Reloads run one at a time (SIGHUP, `POST /admin/reload` and the file watcher each start
/// one), and each reads the file when its turn comes. Two at once used to each read the file
/// and swap in what they built: a slow one (loading a tokenizer) that read an older file
/// swapped it in last, over a newer one, and stayed in force.
#[tokio::test]
async fn a_reload_waits_for_the_one_in_progress_and_reads_the_file_when_its_turn_comes() {
    let dir = std::env::temp_dir().join(format!("tg-reload-turns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.toml");
    let h = harness(&["--speed", "50", "--profile", "tiny-test"], |_| {}).await;
    h.gw.state.set_config_path(path.clone());
    let file = |small: u32| {
        format!(
            "[classify]\ntokenizer = \"heuristic\"\n[upstream]\nbase_url = \"{}\"\n\
             [lanes.small]\nmax_concurrency = {small}\n",
            h.sim.url()
        )
    };
    std::fs::write(&path, file(3)).unwrap();
    let small_seats = || h.gw.state.config().lanes.small.max_concurrency.get();

    // A reload in progress (its turn held here); another one starts meanwhile.
    let in_progress = h.gw.state.reload_lock();
    let state = h.gw.state.clone();
    let next = std::thread::spawn(move || reload::reload(&state, false));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!next.is_finished(), "the second reload waits for its turn");
    // The file changes before its turn: it reads the file as it is then.
    std::fs::write(&path, file(5)).unwrap();
    drop(in_progress);
    next.join().unwrap().expect("the reload is applied");
    assert_eq!(small_seats(), 5);
    h.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `server.max_requests_in_flight` needs a restart: a reload leaves its running value, and the
/// per-tenant limit derived from it (a quarter, by default) follows the running value too, not
/// the file's (it was a quarter of the file's 4: one request per tenant, while the gateway
/// still took 4,096). A per-tenant limit the file sets is applied.
#[tokio::test]
async fn a_request_cap_left_alone_keeps_the_per_tenant_limit_derived_from_it() {
    let h = harness(&["--speed", "50", "--profile", "tiny-test"], |_| {}).await;
    let running = h.gw.state.config().server.clone();
    let file = |server: &str| {
        Config::from_toml_str(&format!(
            "[classify]\ntokenizer = \"heuristic\"\n[upstream]\nbase_url = \"{}\"\n\
             [server]\n{server}\n",
            h.sim.url()
        ))
        .unwrap()
    };
    let r = reload::apply(&h.gw.state, file("max_requests_in_flight = 4")).unwrap();
    assert!(
        r.left_alone.contains(&"server.max_requests_in_flight"),
        "{r:?}"
    );
    let now = h.gw.state.config().server.clone();
    assert_eq!(now.max_requests_in_flight, running.max_requests_in_flight);
    assert_eq!(
        now.max_requests_in_flight_per_tenant,
        running.max_requests_in_flight / 4
    );
    reload::apply(
        &h.gw.state,
        file("max_requests_in_flight = 4\nmax_requests_in_flight_per_tenant = 3"),
    )
    .unwrap();
    assert_eq!(
        h.gw.state.config().server.max_requests_in_flight_per_tenant,
        3
    );
    h.shutdown().await;
}

/// A file that holds under its own `admission.policy` (strict: no seats rule) but not under the
/// running one a reload keeps (lanes: the reservations within `admission.seats`) is refused:
/// it used to pass, the running policy was kept, and reservations above the engine's seats
/// went live (a lane below its reservation always gets a seat).
#[tokio::test]
async fn a_reload_whose_lanes_break_the_running_policys_seats_rule_is_refused() {
    let h = harness(&["--speed", "50", "--profile", "tiny-test"], |_| {}).await;
    let running = h.gw.state.config();
    assert_eq!(
        running.admission.policy,
        tutor_gateway::config::Policy::Lanes
    );
    let seats = running.admission.seats.get();
    let file = Config::from_toml_str(&format!(
        "[classify]\ntokenizer = \"heuristic\"\n[upstream]\nbase_url = \"{}\"\n\
         [admission]\npolicy = \"strict\"\nseats = {seats}\n\
         [lanes.small]\nmax_concurrency = {seats}\nceiling = {seats}\n",
        h.sim.url()
    ))
    .expect("valid on its own");
    let err = reload::apply(&h.gw.state, file).unwrap_err();
    let problems: Vec<String> = match &err {
        reload::ReloadError::Invalid(e) => e.issues().iter().map(|i| i.to_string()).collect(),
        other => panic!("{other}"),
    };
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("admission.seats") && p.contains("admission.policy")),
        "{problems:?}"
    );
    assert_eq!(
        h.gw.state.config().lanes.small.max_concurrency,
        running.lanes.small.max_concurrency,
        "the running lanes stay"
    );
    h.shutdown().await;
}
