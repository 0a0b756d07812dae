//! `matrix`: the same scenario against each combination of `--max-num-seqs` and
//! `--max-num-batched-tokens`, restarting the engine from a command template for each cell
//! (real `vllm serve` or `vllm-sim` alike), optionally scraping a DCGM exporter during the run.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::client::{Api, Target};
use crate::prompt::PromptBuilder;
use crate::runner::{run, RunOptions};
use crate::scenario::{parse_duration, Scenario};
use crate::stats::Results;

/// The engine started for each cell and the grid swept (`tutor-load matrix` flags).
#[derive(Debug, Clone, clap::Args)]
pub struct Sweep {
    /// Engine command template with {seqs}, {batched}, {port}.
    #[arg(long)]
    pub engine_cmd: String,
    /// Target URL template.
    #[arg(long, default_value = "http://127.0.0.1:{port}")]
    pub target: String,
    /// API of the target.
    #[arg(long, value_enum, default_value = "chat")]
    pub api: Api,
    /// `model` on the chat API.
    #[arg(long)]
    pub model: Option<String>,
    /// Engine port.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// --max-num-seqs values.
    #[arg(long, value_delimiter = ',', default_value = "64,96,128")]
    pub seqs: Vec<u32>,
    /// --max-num-batched-tokens values.
    #[arg(long, value_delimiter = ',', default_value = "8192,12288,16384")]
    pub batched: Vec<u32>,
    /// Longest wait for the engine's /health.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub ready_timeout: Duration,
    /// DCGM exporter metrics URL.
    #[arg(long)]
    pub dcgm_url: Option<String>,
}

/// Settings of a matrix run.
#[derive(Debug, Clone)]
pub struct MatrixOptions {
    /// The engine and the grid (the `matrix` command's flags).
    pub sweep: Sweep,
    /// The load and its run options.
    pub scenario: Scenario,
    /// Window, drain, seed, progress of each cell.
    pub run: RunOptions,
    /// Output folder (one sub-folder per cell).
    pub out: PathBuf,
}

/// One cell's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// `--max-num-seqs`.
    pub seqs: u32,
    /// `--max-num-batched-tokens`.
    pub batched: u32,
    /// p95 TTFT per class (scenario order).
    pub ttft_p95_s: Vec<(String, Option<f64>)>,
    /// Output tokens/s.
    pub output_tokens_per_s: f64,
    /// Failed requests.
    pub errors: u64,
    /// Mean of `DCGM_FI_DEV_GPU_UTIL` samples (percent), when scraped.
    pub gpu_util_mean: Option<f64>,
    /// Largest `DCGM_FI_DEV_FB_USED` sample (MiB), when scraped.
    pub fb_used_max_mib: Option<f64>,
}

/// Fills the template's placeholders.
pub fn fill(template: &str, seqs: u32, batched: u32, port: u16) -> String {
    template
        .replace("{seqs}", &seqs.to_string())
        .replace("{batched}", &batched.to_string())
        .replace("{port}", &port.to_string())
}

/// Sum over GPUs of the `metric` samples in a Prometheus text page.
pub fn scrape_value(page: &str, metric: &str) -> Option<f64> {
    tutor_wire::prom::family_sum(page, metric)
}

async fn stop(mut child: Child) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    if tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

async fn wait_ready(
    http: &reqwest::Client,
    base: &str,
    child: &mut Child,
    limit: Duration,
) -> anyhow::Result<()> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Some(st) = child.try_wait()? {
            bail!("engine exited before it was ready: {st}");
        }
        if let Ok(r) = http.get(format!("{base}/health")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("engine not ready at {base}/health within {limit:?}")
}

/// Runs every cell and returns them with a Markdown table.
pub async fn run_matrix(
    opts: &MatrixOptions,
    prompts: &PromptBuilder,
) -> anyhow::Result<(Vec<Cell>, String)> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let mut cells = vec![];
    for &seqs in &opts.sweep.seqs {
        for &batched in &opts.sweep.batched {
            let cmd = fill(&opts.sweep.engine_cmd, seqs, batched, opts.sweep.port);
            let base = fill(&opts.sweep.target, seqs, batched, opts.sweep.port);
            eprintln!("== cell seqs={seqs} batched={batched}: {cmd}");
            let mut child = Command::new("sh")
                .arg("-c")
                .arg(format!("exec {cmd}"))
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {cmd}"))?;
            if let Err(e) = wait_ready(&http, &base, &mut child, opts.sweep.ready_timeout).await {
                stop(child).await;
                return Err(e);
            }
            let target = Target::new(&base, opts.sweep.api, opts.sweep.model.clone())?;
            let scraper = opts.sweep.dcgm_url.clone().map(|url| {
                let http = http.clone();
                let from = Instant::now() + opts.run.warmup;
                let until = from + opts.run.duration;
                tokio::spawn(async move {
                    let (mut util, mut fb) = (vec![], vec![]);
                    // The window's GPU, not the warm-up's.
                    tokio::time::sleep_until(from).await;
                    while Instant::now() < until {
                        if let Ok(r) = http.get(&url).send().await {
                            let page = r.text().await.unwrap_or_default();
                            util.extend(scrape_value(&page, "DCGM_FI_DEV_GPU_UTIL"));
                            fb.extend(scrape_value(&page, "DCGM_FI_DEV_FB_USED"));
                        }
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                    (util, fb)
                })
            });
            let data = run(&opts.scenario, &target, prompts, &opts.run).await;
            let r = Results::build(
                &opts.scenario,
                &target,
                opts.run.seed,
                opts.run.window_s(),
                &data,
            );
            stop(child).await;
            crate::report::write_all(
                &opts.out.join(crate::engine::cell_name(seqs, batched)),
                &r,
                2.0,
            )?;
            let (util, fb) = match scraper {
                Some(h) => h.await.unwrap_or_default(),
                None => (vec![], vec![]),
            };
            cells.push(Cell {
                seqs,
                batched,
                ttft_p95_s: crate::report::ordered(&r)
                    .iter()
                    .map(|(n, c)| (n.to_string(), c.ttft_p95_s))
                    .collect(),
                output_tokens_per_s: r.output_tokens_per_s,
                errors: r.errors,
                gpu_util_mean: (!util.is_empty())
                    .then(|| util.iter().sum::<f64>() / util.len() as f64),
                fb_used_max_mib: fb.iter().copied().reduce(f64::max),
            });
        }
    }
    let table = table(&cells);
    std::fs::write(
        opts.out.join("matrix.json"),
        serde_json::to_string_pretty(&cells)?,
    )?;
    std::fs::write(opts.out.join("matrix.md"), &table)?;
    Ok((cells, table))
}

/// One Markdown table: a row per cell.
pub fn table(cells: &[Cell]) -> String {
    let mut o = String::from("| max-num-seqs | max-num-batched-tokens |");
    let classes: Vec<&str> = cells
        .first()
        .map(|c| c.ttft_p95_s.iter().map(|(n, _)| n.as_str()).collect())
        .unwrap_or_default();
    for n in &classes {
        let _ = write!(o, " {n} p95 TTFT s |");
    }
    o.push_str(" out tok/s | errors | GPU util % | FB used MiB |\n|---:|---:|");
    o.push_str(&"---:|".repeat(classes.len() + 4));
    o.push('\n');
    for c in cells {
        let _ = write!(o, "| {} | {} |", c.seqs, c.batched);
        for (_, v) in &c.ttft_p95_s {
            let _ = write!(o, " {} |", crate::report::s(*v));
        }
        let opt = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.0}"));
        let _ = writeln!(
            o,
            " {:.0} | {} | {} | {} |",
            c.output_tokens_per_s,
            c.errors,
            opt(c.gpu_util_mean),
            opt(c.fb_used_max_mib)
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_and_dcgm_pages() {
        assert_eq!(
            fill(
                "vllm-sim --port {port} --max-num-seqs {seqs} --max-num-batched-tokens {batched}",
                64,
                8192,
                9001
            ),
            "vllm-sim --port 9001 --max-num-seqs 64 --max-num-batched-tokens 8192"
        );
        let page = "# HELP DCGM_FI_DEV_GPU_UTIL x\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 87\nDCGM_FI_DEV_FB_USED{gpu=\"0\"} 70000\nDCGM_FI_DEV_GPU_UTIL_X 1\n";
        assert_eq!(scrape_value(page, "DCGM_FI_DEV_GPU_UTIL"), Some(87.0));
        assert_eq!(scrape_value(page, "DCGM_FI_DEV_FB_USED"), Some(70000.0));
        assert_eq!(scrape_value(page, "DCGM_FI_DEV_FB_FREE"), None);
    }
}
