//! `cargo bench -p tutor-gateway --bench prefix`: TTFT on the seed mix with a shared 1,500-token
//! course prefix, with and without canonical prompt assembly, side by side in one run (issue 8).
//!
//! Both phases go through an in-process gateway (shipped config) to a fresh in-process simulator
//! (`llama-3.1-8b-h100`, prefix caching on, `--enable-prompt-tokens-details`), with the same
//! closed-loop load: `PREFIX_CLIENTS` clients (default 24) for `PREFIX_SECS` seconds (default
//! 15) per phase, at simulator speed `PREFIX_SPEED` (default 8). Each request is the course's
//! prefix, then student material drawn from the seed mix (70% 300 in / 120 out, 25% 2,000 / 300,
//! 5% 8,000 / 500; `ignore_eos`, so outputs are exact).
//!
//! - `canonical`: the prefix as the gateway's course assembly builds it ([`Course`]: stable
//!   system message, tools as canonical JSON), the gateway's tool canonicalization on.
//! - `as sent`: the same text with a timestamp line first in the system message and the tool
//!   schemas with keys in a random order per request, canonicalization off.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tutor_testkit::bench::{env_or, quantile, shuffled};

use futures::StreamExt;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};
use tokio_util::task::TaskTracker;
use tutor_gateway::config::Config;
use tutor_gateway::prompt::Course;
use tutor_gateway::telemetry::RequestLog;
use tutor_testkit::words;
use tutor_wire::sse::SseParser;
use vllm_sim::SimArgs;

fn tools() -> Value {
    let tool = |name: &str| {
        json!({"type": "function", "function": {"name": name, "description": "A course tool.",
            "parameters": {"type": "object", "required": ["path"],
                "properties": {"path": {"type": "string", "description": "file"},
                               "args": {"type": "string", "description": "arguments"}}}}})
    };
    json!([tool("run_tests"), tool("lint"), tool("explain_error")])
}

/// The course: about 1,500 heuristic tokens with its tools.
fn course() -> Course {
    Course::build(
        "py101",
        "2026.1",
        &words(1150, "You are a patient Python tutor."),
        &words(60, "Rubric:"),
        &words(40, "Safety:"),
        Some(tools()),
    )
}

struct Sample {
    small: bool,
    ttft_ms: f64,
    prompt: u64,
    cached: u64,
}

async fn one(client: &reqwest::Client, url: &str, body: &Value) -> Option<Sample> {
    let start = Instant::now();
    let resp = client.post(url).json(body).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let mut stream = resp.bytes_stream();
    let (mut ttft, mut prompt, mut cached) = (None, 0, 0);
    let mut parser = SseParser::default();
    while let Some(chunk) = stream.next().await {
        parser.feed(&chunk.ok()?).ok()?;
        while let Some(data) = parser.pop() {
            let Ok(v) = serde_json::from_slice::<Value>(&data) else {
                continue;
            };
            if ttft.is_none() && v["choices"].as_array().is_some_and(|c| !c.is_empty()) {
                ttft = Some(start.elapsed().as_secs_f64() * 1000.0);
            }
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                prompt = u["prompt_tokens"].as_u64().unwrap_or(0);
                cached = u["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0);
            }
        }
    }
    Some(Sample {
        small: false,
        ttft_ms: ttft?,
        prompt,
        cached,
    })
}

async fn phase(canonical: bool, secs: f64, speed: f64, clients: u64) -> Vec<Sample> {
    let speed = speed.to_string();
    let sim = vllm_sim::start(&SimArgs::for_test(&[
        "--profile",
        "llama-3.1-8b-h100",
        "--speed",
        &speed,
        "--enable-prompt-tokens-details",
    ]))
    .await
    .unwrap();
    let mut config = Config::default();
    config.upstream.base_url = sim.url();
    config.prefix_cache.canonicalize_tools = canonical;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tasks = TaskTracker::new();
    let state = tutor_gateway::server::build_state_with_log(config, tasks.clone(), RequestLog::Off)
        .unwrap();
    let gw = tutor_gateway::server::serve_state(state, tasks, listener).unwrap();
    let url = Arc::new(format!("{}/v1/chat/completions", gw.url()));
    let course = Arc::new(course());
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let (client, url, course) = (client.clone(), url.clone(), course.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(c);
                let mut out = Vec::new();
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let k = (c * 7919 + n * 104_729) % 100;
                    let (inp, max) = match k {
                        0..70 => (300, 120),
                        70..95 => (2000, 300),
                        _ => (8000, 500),
                    };
                    let student = json!({"role": "user",
                        "content": words(inp, &format!("student {c}-{n}:"))});
                    let mut messages = course.messages(&[student]);
                    let tools = if canonical {
                        course.tools.clone().unwrap()
                    } else {
                        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
                        let sys = format!(
                            "Current time: {}.{:03}\n{}",
                            now.as_secs(),
                            now.subsec_millis(),
                            course.system_prompt
                        );
                        messages[0] = json!({"role": "system", "content": sys});
                        shuffled(&tools(), &mut rng)
                    };
                    let body = json!({"messages": messages, "tools": tools, "max_tokens": max,
                        "ignore_eos": true, "stream": true,
                        "stream_options": {"include_usage": true}});
                    if let Some(mut s) = one(&client, &url, &body).await {
                        s.small = inp == 300;
                        out.push(s);
                    }
                    n += 1;
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    gw.shutdown().await;
    sim.shutdown().await;
    all
}

fn main() {
    let secs = env_or("PREFIX_SECS", 15.0);
    let speed = env_or("PREFIX_SPEED", 8.0);
    let clients = env_or("PREFIX_CLIENTS", 24.0) as u64;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "\n## Prefix cache: seed mix with a shared ~1,500-token course prefix\n\n\
         llama-3.1-8b-h100 at speed {speed}, {clients} closed-loop clients, {secs} s per phase, \
         through the gateway (shipped config). TTFT in simulated-speed milliseconds \
         (multiply by {speed} for H100 time).\n"
    );
    println!(
        "| assembly | requests | cached/prompt tokens | TTFT p50 ms | TTFT p95 ms | 300-in p50 ms | 300-in p95 ms |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    );
    for (name, canonical) in [
        ("canonical", true),
        ("as sent (timestamp, shuffled tools)", false),
    ] {
        let samples = rt.block_on(phase(canonical, secs, speed, clients));
        let mut all: Vec<f64> = samples.iter().map(|s| s.ttft_ms).collect();
        let mut small: Vec<f64> = samples
            .iter()
            .filter(|s| s.small)
            .map(|s| s.ttft_ms)
            .collect();
        let prompt: u64 = samples.iter().map(|s| s.prompt).sum();
        let cached: u64 = samples.iter().map(|s| s.cached).sum();
        println!(
            "| {name} | {} | {:.3} | {:.1} | {:.1} | {:.1} | {:.1} |",
            samples.len(),
            cached as f64 / prompt.max(1) as f64,
            quantile(&mut all, 0.5),
            quantile(&mut all, 0.95),
            quantile(&mut small, 0.5),
            quantile(&mut small, 0.95),
        );
    }
    println!();
}
