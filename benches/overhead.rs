//! `cargo bench -p tutor-gateway --bench overhead`: what the gateway adds to time to first token
//! and to inter-token latency, against the same simulator reached directly, on the same load, in
//! one run. The gateway runs as its own process (the real binary) so its memory can be read from
//! `/proc`; the simulator (`fixed` profile: TTFT 50 ms, one token every `OVERHEAD_ITL_MS`, no batching) and
//! the clients share the bench process.
//!
//! The gateway runs with `policy = "fifo"` and no concurrency limit here, so the figures are the
//! proxy's own cost (parsing, classification, admission bookkeeping, relay), not queueing.
//! Where the gateway's time to the first byte goes comes from its own request log (stdout, one
//! JSON line a request, `stages_us`): parse, classify, admit, send (to vLLM's headers), first
//! upstream byte, first client byte, p50 and p99 per stage.
//! Env: `OVERHEAD_TOKENS` (default 100), `OVERHEAD_ROUNDS` (default 3), `OVERHEAD_ITL_MS`
//! (default 40: what one H100 gives each of 500 streams, 12,500 tokens/s shared; at 20 ms the
//! 500 streams would ask for 25,000 tokens/s, twice what the GPU makes).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tutor_testkit::bench::{env_or, quantile};
use tutor_testkit::send_text;

use futures::StreamExt;
use tutor_wire::sse::SseParser;
use vllm_sim::SimArgs;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// User + system CPU time of a process, seconds (Linux `/proc/PID/stat`, 100 ticks a second).
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Fields 14 and 15 of stat (utime, stime) are 12 and 13 after the command name.
    (ticks(11) + ticks(12)) / 100.0
}

#[derive(Default)]
struct Samples {
    ttft_ms: Vec<f64>,
    gap_ms: Vec<f64>,
    failed: usize,
}

/// One streamed request: client-side TTFT (send to first token chunk) and gaps between chunks.
async fn one(client: &reqwest::Client, url: &str, body: &serde_json::Value, out: &mut Samples) {
    let start = Instant::now();
    let Ok(resp) = client.post(url).json(body).send().await else {
        out.failed += 1;
        return;
    };
    let mut stream = resp.bytes_stream();
    let mut last: Option<Instant> = None;
    let mut parser = SseParser::default();
    while let Some(Ok(chunk)) = stream.next().await {
        if parser.feed(&chunk).is_err() {
            break;
        }
        let mut content = false;
        while let Some(data) = parser.pop() {
            content |= data.windows(9).any(|w| w == b"\"content\"");
        }
        if !content {
            continue;
        }
        let now = Instant::now();
        match last {
            None => out.ttft_ms.push((now - start).as_secs_f64() * 1000.0),
            Some(t) => out.gap_ms.push((now - t).as_secs_f64() * 1000.0),
        }
        last = Some(now);
    }
}

/// `concurrency` clients at once (arriving over `ramp`), one request each.
async fn round(
    client: &reqwest::Client,
    url: &str,
    concurrency: usize,
    tokens: u64,
    ramp: Duration,
) -> Samples {
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let (client, url) = (client.clone(), url.to_owned());
            let delay = ramp.mul_f64(i as f64 / concurrency as f64);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let body = serde_json::json!({
                    "messages": [{"role": "user", "content": format!("why does loop {i} never end?")}],
                    "max_tokens": tokens, "ignore_eos": true, "stream": true,
                });
                let mut s = Samples::default();
                one(&client, &url, &body, &mut s).await;
                s
            })
        })
        .collect();
    let mut all = Samples::default();
    for t in tasks {
        let s = t.await.unwrap();
        all.ttft_ms.extend(s.ttft_ms);
        all.gap_ms.extend(s.gap_ms);
        all.failed += s.failed;
    }
    all
}

/// The gateway's request log: `log.jsonl` in the bench's temporary folder.
fn request_log(dir: &tempdir::Dir) -> std::path::PathBuf {
    dir.0.join("log.jsonl")
}

/// The `stages_us` objects of the request log lines after the first `skip`.
fn stages(dir: &tempdir::Dir, skip: usize) -> Vec<serde_json::Value> {
    std::fs::read_to_string(request_log(dir))
        .unwrap_or_default()
        .lines()
        .skip(skip)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v["stages_us"].clone())
        .collect()
}

const STAGES: [&str; 6] = [
    "parse_us",
    "classify_us",
    "admit_us",
    "send_us",
    "first_upstream_byte_us",
    "first_client_byte_us",
];

fn start_gateway(upstream: &str) -> (Child, String, tempdir::Dir) {
    let dir = tempdir::Dir::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = format!(
        "listen = \"127.0.0.1:{port}\"\n[upstream]\nbase_url = \"{upstream}\"\n\
         [classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"fifo\"\n"
    );
    let path = dir.0.join("config.toml");
    std::fs::write(&path, config).unwrap();
    let log = std::fs::File::create(request_log(&dir)).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
        .args(["serve", "--config", path.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::from(log))
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the gateway binary");
    (child, format!("http://127.0.0.1:{port}"), dir)
}

mod tempdir {
    /// A temporary folder removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            let p = std::env::temp_dir().join(format!("tutor-overhead-{}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// `tutor_gateway_relay_seconds` buckets from a scrape: (upper bound in seconds, cumulative
/// count), in order.
fn relay_buckets(text: &str) -> Vec<(f64, f64)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("tutor_gateway_relay_seconds_bucket{le=\""))
        .filter_map(|rest| {
            let (le, value) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, value.trim().parse().ok()?))
        })
        .collect()
}

/// The bucket bound at or under which a `q` share of the observations between two scrapes fall.
fn relay_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let was = before
                .iter()
                .find(|(b, _)| b == le)
                .map_or(0.0, |(_, n)| *n);
            (*le, n - was)
        })
        .collect();
    let total = counts.last()?.1;
    (total > 0.0)
        .then(|| {
            counts
                .iter()
                .find(|(_, n)| *n >= q * total)
                .map(|(le, _)| *le)
        })
        .flatten()
}

async fn scrape(client: &reqwest::Client, gw: &str) -> Vec<(f64, f64)> {
    let text = send_text(client.get(format!("{gw}/metrics"))).await;
    relay_buckets(&text)
}

async fn bench() {
    let tokens = env_or::<u64>("OVERHEAD_TOKENS", 100);
    let itl_ms = env_or::<u64>("OVERHEAD_ITL_MS", 40).to_string();
    let rounds = env_or::<u64>("OVERHEAD_ROUNDS", 3);
    let sim = vllm_sim::start(&SimArgs::for_test(&[
        "--profile",
        "fixed",
        "--fixed-ttft-ms",
        "50",
        "--fixed-itl-ms",
        &itl_ms,
    ]))
    .await
    .unwrap();
    let (mut child, gw, dir) = start_gateway(&sim.url());
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(2048)
        .build()
        .unwrap();
    for _ in 0..100 {
        if client.get(format!("{gw}/healthz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let direct = format!("{}/v1/chat/completions", sim.url());
    let proxied = format!("{gw}/v1/chat/completions");
    // Warm both paths (connections, allocator) before measuring.
    round(&client, &direct, 500, 5, Duration::from_millis(500)).await;
    round(&client, &proxied, 500, 5, Duration::from_millis(500)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_idle = rss_kib(child.id());

    println!("## Proxy overhead: gateway vs direct to vllm-sim (fixed profile, TTFT 50 ms, ITL {itl_ms} ms, {tokens} tokens)\n");
    println!(
        "| concurrency | path | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | failed |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let mut rss_peak = rss_idle;
    let mut added = Vec::new();
    let mut cpu_per_chunk: Vec<(usize, f64)> = Vec::new();
    let mut relay: Vec<(usize, Option<f64>, Option<f64>)> = Vec::new();
    let mut breakdown: Vec<(usize, Vec<serde_json::Value>)> = Vec::new();
    for concurrency in [1usize, 500] {
        let relay_before = scrape(&client, &gw).await;
        let logged_before = stages(&dir, 0).len();
        let ramp = if concurrency == 1 {
            Duration::ZERO
        } else {
            Duration::from_millis(500)
        };
        let (mut d, mut g) = (Samples::default(), Samples::default());
        let (mut cpu_used, mut chunks_relayed) = (0.0, 0usize);
        for _ in 0..rounds {
            // Alternate direct and proxied rounds so both see the same machine state.
            let s = round(&client, &direct, concurrency, tokens, ramp).await;
            d.ttft_ms.extend(s.ttft_ms);
            d.gap_ms.extend(s.gap_ms);
            d.failed += s.failed;
            let pid = child.id();
            let sampler = tokio::spawn(async move {
                let mut peak = 0;
                for _ in 0..40 {
                    peak = peak.max(rss_kib(pid));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                peak
            });
            let cpu_before = cpu_secs(pid);
            let s = round(&client, &proxied, concurrency, tokens, ramp).await;
            cpu_used += cpu_secs(pid) - cpu_before;
            chunks_relayed += s.gap_ms.len() + s.ttft_ms.len();
            if concurrency == 500 {
                rss_peak = rss_peak.max(sampler.await.unwrap());
            } else {
                sampler.abort();
            }
            g.ttft_ms.extend(s.ttft_ms);
            g.gap_ms.extend(s.gap_ms);
            g.failed += s.failed;
        }
        let row = |name: &str, s: &mut Samples| -> [f64; 4] {
            let q = [
                quantile(&mut s.ttft_ms, 0.5),
                quantile(&mut s.ttft_ms, 0.99),
                quantile(&mut s.gap_ms, 0.5),
                quantile(&mut s.gap_ms, 0.99),
            ];
            println!(
                "| {concurrency} | {name} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
                q[0], q[1], q[2], q[3], s.failed
            );
            q
        };
        let qd = row("direct", &mut d);
        let qg = row("gateway", &mut g);
        added.push((
            concurrency,
            qg[0] - qd[0],
            qg[1] - qd[1],
            qg[2] - qd[2],
            qg[3] - qd[3],
        ));
        cpu_per_chunk.push((concurrency, cpu_used * 1e6 / chunks_relayed.max(1) as f64));
        let relay_after = scrape(&client, &gw).await;
        breakdown.push((concurrency, stages(&dir, logged_before)));
        relay.push((
            concurrency,
            relay_quantile(&relay_before, &relay_after, 0.5),
            relay_quantile(&relay_before, &relay_after, 0.99),
        ));
    }
    println!("\n| concurrency | added TTFT p50 ms | added TTFT p99 ms | added ITL p50 us | added ITL p99 us |");
    println!("|---:|---:|---:|---:|---:|");
    for (c, t50, t99, i50, i99) in added {
        println!(
            "| {c} | {t50:.3} | {t99:.3} | {:.0} | {:.0} |",
            i50 * 1000.0,
            i99 * 1000.0
        );
    }
    println!(
        "\nIn-gateway relay time per write (`tutor_gateway_relay_seconds`, bucket upper bounds):\n"
    );
    println!("| concurrency | p50 <= us | p99 <= us |");
    println!("|---:|---:|---:|");
    let us = |v: Option<f64>| v.map_or("-".to_owned(), |s| format!("{:.0}", s * 1e6));
    for (c, p50, p99) in relay {
        println!("| {c} | {} | {} |", us(p50), us(p99));
    }
    println!("\nWhere the gateway's time to the first byte goes (its request log, `stages_us`; p50 / p99 us; `admit` is queueing, `first_upstream_byte` is the engine):\n");
    println!(
        "| concurrency | requests | {} |",
        STAGES.map(|s| s.trim_end_matches("_us")).join(" | ")
    );
    println!("|---:|---:|{}", "---:|".repeat(STAGES.len()));
    for (c, lines) in &breakdown {
        let cells: Vec<String> = STAGES
            .iter()
            .map(|s| {
                let mut v: Vec<f64> = lines.iter().filter_map(|l| l[*s].as_f64()).collect();
                if v.is_empty() {
                    return "-".to_owned();
                }
                format!(
                    "{:.0} / {:.0}",
                    quantile(&mut v, 0.5),
                    quantile(&mut v, 0.99)
                )
            })
            .collect();
        println!("| {c} | {} | {} |", lines.len(), cells.join(" | "));
    }
    for (c, us) in cpu_per_chunk {
        println!("\ngateway CPU at concurrency {c}: {us:.1} us per relayed chunk (user + system, whole process)");
    }
    println!(
        "\ngateway RSS: {} KiB idle, {} KiB peak at 500 streams: {:.1} KiB per active stream\n",
        rss_idle,
        rss_peak,
        (rss_peak.saturating_sub(rss_idle)) as f64 / 500.0
    );
    let _ = child.kill();
    let _ = child.wait();
    sim.shutdown().await;
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench());
}
