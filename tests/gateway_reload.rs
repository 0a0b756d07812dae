//! Changing the configuration live (issue 18, item 1): a reload raises and lowers a lane's
//! limit under load without cutting a stream (a lowered lane admits nobody until it is under
//! its new limit), an invalid file is refused with every problem named and the old
//! configuration stays, settings that need a restart are reported and left alone, and every
//! reload is counted.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tutor_gateway::config::Config;
use tutor_gateway::lane::Lane;
use tutor_gateway::pipeline::reload;

/// Real time (about 5 ms a token): streams last long enough to reload under them.
const SLOW: &str = "--speed 1 --profile tiny-test --mean-output-tokens 1000000";

fn small(c: &mut Config, n: u32) {
    set_lane(c, Lane::Small, n);
}

#[tokio::test]
async fn a_reload_raises_and_lowers_a_lanes_limit_and_a_shrink_cuts_nothing() {
    let h = harness(&flags(SLOW), |c| small(c, 2)).await;
    let base = (*h.gw.state.config()).clone();
    // Eight small questions, each streaming for about a second.
    let mut streams = Vec::new();
    for i in 0..8 {
        let url = h.url("/answer");
        streams.push(tokio::spawn(async move {
            let body = json!({"prompt": format!("why does loop {i} never end"),
                              "max_output_tokens": 200});
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
    for _ in 0..3000 {
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
             [server]\nadmin_listen = \"127.0.0.1:0\"\n\
             [lanes.small]\nmax_concurrency = 7\nceiling = 7\n"
        ),
    )
    .unwrap();
    let (status, v) = reload_now().await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "applied");
    let changed: Vec<Value> = v["changed"].as_array().unwrap().clone();
    assert!(changed.contains(&json!("lanes")), "{v}");
    assert!(
        v["left_alone"]
            .as_array()
            .unwrap()
            .contains(&json!("listen")),
        "{v}"
    );
    let config = h.gw.state.config();
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

/// SIGHUP on a gateway process re-reads its file: the new configuration is named in
/// `/metrics` and the reload counted, and the gateway keeps serving.
#[tokio::test]
async fn sighup_reloads_the_file_of_a_running_gateway() {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&flags(
        "--speed 50 --profile tiny-test",
    )))
    .await
    .unwrap();
    let (port, admin) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("tg-sighup-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.toml");
    let file = |small: u32| {
        format!(
            "listen = \"127.0.0.1:{port}\"\n[server]\nadmin_listen = \"127.0.0.1:{admin}\"\n\
             [telemetry]\nrequest_log = \"off\"\n[classify]\ntokenizer = \"heuristic\"\n\
             [upstream]\nbase_url = \"{}\"\n\
             [lanes.small]\nmax_concurrency = {small}\nceiling = {small}\n",
            sim.url()
        )
    };
    std::fs::write(&path, file(3)).unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = Kill(
        std::process::Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
            .args(["serve", "--config"])
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let metrics_url = format!("http://127.0.0.1:{admin}/metrics");
    let mut before = None;
    for _ in 0..500 {
        if let Ok(r) = client().get(&metrics_url).send().await {
            before = Some(r.text().await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let info = |m: &str| {
        m.lines()
            .find(|l| l.starts_with("tutor_gateway_config_info{"))
            .map(str::to_owned)
    };
    let before = info(&before.expect("the gateway came up")).unwrap();
    std::fs::write(&path, file(5)).unwrap();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    // A scrape gathers the metric families one by one, so one taken during the reload may
    // show the new name before the count: wait for both, then check the count once more.
    let applied = |m: &str| metric(m, "tutor_gateway_config_reloads_total{outcome=\"applied\"}");
    let mut reloaded = false;
    for _ in 0..500 {
        let m = get_text(&metrics_url).await;
        if info(&m).is_some_and(|i| i != before) && applied(&m) >= 1.0 {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reloaded, "the reloaded configuration is named in /metrics");
    let m = get_text(&metrics_url).await;
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_config_reloads_total{outcome=\"applied\"}"
        ),
        1.0
    );
    // Still serving, and still the same process.
    let resp = send(
        client()
            .post(format!("http://127.0.0.1:{port}/answer"))
            .json(&json!({"prompt": "what is a closure?", "max_output_tokens": 4})),
    )
    .await;
    assert_eq!(sse(&resp.text().await.unwrap()).last().unwrap().0, "done");
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
    sim.shutdown().await;
}
