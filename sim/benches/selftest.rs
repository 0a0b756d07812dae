//! `cargo bench -p vllm-sim --bench selftest`: is the simulator ever the bottleneck?
//!
//! 1. Calibration (virtual time, deterministic): `llama-3.1-8b-h100` against published figures.
//! 2. `fixed` profile, 2,000 concurrent streams over HTTP on loopback: do tokens arrive on time?
//! 3. The seed's request mix at speed 1 on `llama-3.1-8b-h100`: does the scheduler loop run on
//!    time (step lateness p99)?
//!
//! Bounded: about 40 s in all. Set `SELFTEST_STREAMS` / `SELFTEST_MIX_SECS` to change sizes and
//! `SELFTEST_ONLY=1|2|3` to run one part.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tutor_testkit::bench::env_or;

use futures::StreamExt;
use tutor_wire::sse::SseParser;
use vllm_sim::engine::offline::{run_closed_loop, ClosedLoop};
use vllm_sim::engine::scheduler::SchedulerConfig;
use vllm_sim::profile::LLAMA_31_8B_H100;
use vllm_sim::SimArgs;

/// The `q` quantile of `v`; 0 for an empty sample (printed as such).
fn quantile(v: &mut [f64], q: f64) -> f64 {
    tutor_wire::stats::quantile(v, q).unwrap_or(0.0)
}

fn calibration() {
    println!("## 1. Calibration of llama-3.1-8b-h100 (virtual time, 120 s closed loop)\n");
    println!("| concurrency | prompt | output | output tok/s | mean TTFT ms | mean ITL ms | preemptions |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (c, p, o) in [
        (1, 1000, 100),
        (64, 500, 500),
        (256, 500, 500),
        (512, 300, 300),
        (1024, 200, 200),
    ] {
        let cfg = SchedulerConfig::closed_loop(1024, LLAMA_31_8B_H100.default_gpu_blocks);
        let r = run_closed_loop(
            LLAMA_31_8B_H100,
            cfg,
            ClosedLoop {
                concurrency: c,
                prompt_tokens: p,
                output_tokens: o,
                duration: Duration::from_secs(120),
            },
        );
        println!(
            "| {c} | {p} | {o} | {:.0} | {:.1} | {:.2} | {} |",
            r.output_tokens_per_s, r.mean_ttft_ms, r.mean_itl_ms, r.preemptions
        );
    }
    println!();
}

fn body(words: usize, salt: u64, max_tokens: u32) -> serde_json::Value {
    let mut s = format!("request {salt}:");
    for i in 0..words {
        s.push_str([" cat", " dog", " map", " key", " fn", " let"][(i + salt as usize) % 6]);
    }
    serde_json::json!({
        "messages": [{"role": "user", "content": s}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
    })
}

/// Streams one request; returns (ttft, gaps between chunks) in milliseconds.
async fn one_stream(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> Option<(f64, Vec<f64>)> {
    let start = Instant::now();
    let resp = client.post(url).json(body).send().await.ok()?;
    let mut stream = resp.bytes_stream();
    let mut last: Option<Instant> = None;
    let mut ttft = 0.0;
    let mut gaps = Vec::new();
    let mut parser = SseParser::default();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.ok()?;
        let now = Instant::now();
        parser.feed(&chunk).ok()?;
        // Count gaps between token events (the role chunk comes with the first token).
        let events = std::iter::from_fn(|| parser.pop())
            .filter(|data| data.starts_with(b"{"))
            .count();
        if events == 0 {
            continue;
        }
        match last {
            None => ttft = (now - start).as_secs_f64() * 1000.0,
            Some(t) => gaps.push((now - t).as_secs_f64() * 1000.0),
        }
        last = Some(now);
    }
    Some((ttft, gaps))
}

async fn fixed_streams() {
    let streams = env_or::<usize>("SELFTEST_STREAMS", 2000);
    let args = SimArgs::for_test(&[
        "--profile",
        "fixed",
        "--fixed-ttft-ms",
        "50",
        "--fixed-itl-ms",
        "20",
    ]);
    let sim = vllm_sim::start(&args).await.unwrap();
    let url = format!("{}/v1/chat/completions", sim.url());
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(streams)
        .build()
        .unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            // Clients arrive over one second, as a real ramp would, not in one SYN burst.
            let delay = Duration::from_secs(1).mul_f64(i as f64 / streams as f64);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                one_stream(&client, &url, &body(50, i as u64, 100)).await
            })
        })
        .collect();
    let mut ttfts = Vec::new();
    let mut gaps = Vec::new();
    let mut failed = 0;
    let mut peak = 0;
    for t in tasks {
        match t.await.unwrap() {
            Some((ttft, g)) => {
                ttfts.push(ttft);
                gaps.extend(g);
            }
            None => failed += 1,
        }
    }
    let elapsed = started.elapsed();
    let snap = sim.engine.snapshot();
    peak = peak.max(snap.max_running_seen);
    println!("## 2. fixed profile, {streams} concurrent streams (TTFT 50 ms, ITL 20 ms, 100 tokens each, arriving over 1 s)\n");
    println!("| measure | p50 | p99 | max |\n|---|---:|---:|---:|");
    let (mut t2, mut g2) = (ttfts.clone(), gaps.clone());
    println!(
        "| client TTFT ms | {:.1} | {:.1} | {:.1} |",
        quantile(&mut t2, 0.5),
        quantile(&mut t2, 0.99),
        quantile(&mut t2, 1.0)
    );
    println!(
        "| client gap between chunks ms | {:.1} | {:.1} | {:.1} |",
        quantile(&mut g2, 0.5),
        quantile(&mut g2, 0.99),
        quantile(&mut g2, 1.0)
    );
    println!(
        "| sim token emission lateness ms | {:.2} | {:.2} | {:.2} |",
        snap.lateness.p50_ms, snap.lateness.p99_ms, snap.lateness.max_ms
    );
    println!(
        "\npeak concurrent streams in the engine: {peak}; failed: {failed}; wall time {:.2} s (ideal {:.2} s)\n",
        elapsed.as_secs_f64(),
        1.0 + 0.05 + 99.0 * 0.02
    );
    sim.shutdown().await;
}

async fn seed_mix() {
    let secs = env_or::<u64>("SELFTEST_MIX_SECS", 20);
    let args = SimArgs::for_test(&["--profile", "llama-3.1-8b-h100", "--max-num-seqs", "256"]);
    let sim = vllm_sim::start(&args).await.unwrap();
    let url = Arc::new(format!("{}/v1/chat/completions", sim.url()));
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(secs);
    // 100 closed-loop clients; each request drawn from the seed's mix: 70% 300 in / 120 out,
    // 25% 2,000 in / 300 out, 5% 8,000 in / 500 out.
    let tasks: Vec<_> = (0..100u64)
        .map(|c| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                let mut ttfts = Vec::new();
                while Instant::now() < deadline {
                    let k = (c * 7919 + n * 104_729) % 100;
                    let (inp, out) = match k {
                        0..70 => (300, 120),
                        70..95 => (2000, 300),
                        _ => (8000, 500),
                    };
                    if let Some((ttft, _)) =
                        one_stream(&client, &url, &body(inp, c * 1000 + n, out)).await
                    {
                        ttfts.push((inp, ttft));
                    }
                    n += 1;
                }
                ttfts
            })
        })
        .collect();
    let mut small = Vec::new();
    let mut all = 0;
    for t in tasks {
        for (inp, ttft) in t.await.unwrap() {
            all += 1;
            if inp == 300 {
                small.push(ttft);
            }
        }
    }
    let snap = sim.engine.snapshot();
    println!("## 3. Seed mix at speed 1, llama-3.1-8b-h100, 100 closed-loop clients, {secs} s\n");
    println!(
        "| steps | requests done | small p50 TTFT ms | step lateness p50 ms | p99 ms | max ms |\n|---:|---:|---:|---:|---:|---:|"
    );
    println!(
        "| {} | {all} | {:.1} | {:.3} | {:.3} | {:.3} |\n",
        snap.steps,
        quantile(&mut small, 0.5),
        snap.lateness.p50_ms,
        snap.lateness.p99_ms,
        snap.lateness.max_ms
    );
    sim.shutdown().await;
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let only = std::env::var("SELFTEST_ONLY").unwrap_or_default();
    let run = |part: &str| only.is_empty() || only == part;
    if run("1") {
        calibration();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if run("2") {
        rt.block_on(fixed_streams());
    }
    if run("3") {
        rt.block_on(seed_mix());
    }
}
