//! Writing a run's outputs: `results.json`, `summary.md` and the three charts.

use std::fmt::Write;
use std::path::Path;

use anyhow::Context;

use crate::stats::{ClassStats, Results};
use crate::svg::{Chart, Series};

/// Durations below this print in milliseconds, and no ratio is built on them: at two decimals
/// of a second they read `0.00`, and a ratio of two such values (a warm prefix cache's 5 ms
/// against 20 ms) says nothing about queueing.
pub const TINY_S: f64 = 0.010;

/// What a ratio built on a duration under [`TINY_S`] prints instead.
pub const TINY_RATIO: &str = "n/a (<10 ms)";

/// A table cell in a column of seconds: 2 decimals (`0.29`); under 10 ms, milliseconds with
/// their unit (`4.2 ms`); `-` where unknown.
pub fn s(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| {
        if x.abs() < TINY_S {
            format!("{:.1} ms", x * 1000.0)
        } else {
            format!("{x:.2}")
        }
    })
}

/// A duration with its unit: `0.29 s`, or under 10 ms `4.2 ms`; `-` where unknown.
pub fn secs(v: Option<f64>) -> String {
    match v {
        Some(x) if x.abs() >= TINY_S => format!("{x:.2} s"),
        _ => s(v),
    }
}

/// Whether a duration is known but too small to build a ratio on.
pub fn tiny(v: Option<f64>) -> bool {
    v.is_some_and(|x| x.abs() < TINY_S)
}

/// `num / den` as `1.17x`; [`TINY_RATIO`] when either is under 10 ms; `-` where unknown.
pub fn ratio(num: Option<f64>, den: Option<f64>) -> String {
    if tiny(num) || tiny(den) {
        return TINY_RATIO.into();
    }
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => format!("{:.2}x", n / d),
        _ => "-".into(),
    }
}

/// `0.41 (1.17x)`: seconds with their ratio `x` to `base` (the floor's) beside them;
/// `0.02 (n/a (<10 ms))` when either is under 10 ms; `-` where unknown.
pub fn with_ratio(value: Option<f64>, base: Option<f64>, x: Option<f64>) -> String {
    let v = s(value);
    match x {
        Some(_) if tiny(value) || tiny(base) => format!("{v} ({TINY_RATIO})"),
        Some(x) => format!("{v} ({x:.2}x)"),
        None => v,
    }
}

/// The line of a run's small TTFT against the floor's, when the run has one.
pub fn vs_floor_line(r: &Results) -> Option<String> {
    let v = r.vs_floor.as_ref()?;
    let c = r.classes.get(&v.class);
    Some(format!(
        "{} TTFT vs the floor (the same {} clients alone), p50 / p95 / p99 s (x floor): \
         {} / {} / {}; floor {} / {} / {}.",
        v.class,
        v.class,
        with_ratio(
            c.and_then(|c| c.ttft_p50_s),
            v.floor_ttft_p50_s,
            v.ttft_p50_x
        ),
        with_ratio(
            c.and_then(|c| c.ttft_p95_s),
            v.floor_ttft_p95_s,
            v.ttft_p95_x
        ),
        with_ratio(
            c.and_then(|c| c.ttft_p99_s),
            v.floor_ttft_p99_s,
            v.ttft_p99_x
        ),
        secs(v.floor_ttft_p50_s),
        secs(v.floor_ttft_p95_s),
        secs(v.floor_ttft_p99_s),
    ))
}

/// Which prompt text the run sent: salted (and how to send it again) or the seed's own.
pub fn prompt_text_line(r: &Results) -> String {
    match r.salt {
        Some(salt) => format!(
            "Prompt text: salt {salt:#x} (fresh per run, so a second run does not replay this \
             one's prefix cache; `--seed {} --salt {salt:#x}` sends the same text again).",
            r.seed
        ),
        None => "Prompt text: the seed's own (replayed: a long-lived engine may serve it from \
                 its prefix cache)."
            .into(),
    }
}

/// The share of prompt tokens the engine served from its prefix cache.
pub fn prefix_cache_line(r: &Results) -> String {
    match r.prefix_cache {
        Some(c) => format!(
            "Prefix cache: {:.1}% of prompt tokens cached ({} of {}, {} requests reporting \
             usage; vLLM reports them with `--enable-prompt-tokens-details`).",
            c.cached_ratio * 100.0,
            c.cached_tokens,
            c.prompt_tokens,
            c.requests
        ),
        None => "Prefix cache: unknown (no response reported its prompt tokens).".into(),
    }
}

/// Classes in scenario order with their figures.
pub fn ordered(r: &Results) -> Vec<(&str, &ClassStats)> {
    r.scenario
        .classes
        .iter()
        .filter_map(|c| r.classes.get(&c.name).map(|s| (c.name.as_str(), s)))
        .collect()
}

/// The warm-up as the summary's first line tells it.
fn warmup_words(r: &Results) -> String {
    if r.warmup_s > 0.0 {
        format!(
            "warm-up {:.0} s ({} requests, not measured), ",
            r.warmup_s, r.warmup_requests
        )
    } else {
        "no warm-up, ".into()
    }
}

/// The Markdown summary of one run.
pub fn summary_md(r: &Results) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# {} against {} (`{:?}` API)\n",
        r.scenario.name, r.target, r.api
    );
    let _ = writeln!(
        o,
        "Seed {}, {}window {:.0} s (wall {:.0} s with drain), {} requests, {} errors, {} skipped; \
         **{:.0} output tokens/s**.\n",
        r.seed,
        warmup_words(r),
        r.duration_s,
        r.wall_s,
        r.requests,
        r.errors,
        r.skipped,
        r.output_tokens_per_s
    );
    let _ = writeln!(o, "{}\n", prompt_text_line(r));
    let _ = writeln!(o, "{}\n", prefix_cache_line(r));
    if let Some(lag) = r.send_lag {
        let _ = writeln!(
            o,
            "Sent late against the arrival schedule (this tool's own lag; every time below is \
             measured from the send): p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms.\n",
            lag.p50_s * 1000.0,
            lag.p95_s * 1000.0,
            lag.max_s * 1000.0
        );
    }
    o.push_str("| class | requests | ok | errors | cut | TTFT p50 s | p95 s | p99 s | e2e p50 s | e2e p95 s | TPOT p50 ms | ITL p95 ms | out tok/s |\n");
    o.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (name, c) in ordered(r) {
        let ms = |v: Option<f64>| v.map_or("-".into(), |x| format!("{:.1}", x * 1000.0));
        let _ = writeln!(
            o,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |",
            c.requests,
            c.ok,
            c.errors,
            c.cut,
            s(c.ttft_p50_s),
            s(c.ttft_p95_s),
            s(c.ttft_p99_s),
            s(c.e2e_p50_s),
            s(c.e2e_p95_s),
            ms(c.tpot_p50_s),
            ms(c.itl_p95_s),
            c.output_tokens_per_s
        );
    }
    if let Some(line) = vs_floor_line(r) {
        let _ = writeln!(o, "\n{line}");
    }
    if !r.errors_by_code.is_empty() {
        o.push_str("\nErrors by code: ");
        let e: Vec<String> = r
            .errors_by_code
            .iter()
            .map(|(k, v)| format!("`{k}` {v}"))
            .collect();
        o.push_str(&e.join(", "));
        o.push('\n');
    }
    o.push_str("\nTTFT: send to first token event, client side (includes any gateway queue). \
                e2e: send to end of stream. `cut`: still running at the hard deadline.\n\n\
                ![TTFT CDF](ttft_cdf.svg)\n![TTFT over time](ttft_over_time.svg)\n![Throughput](throughput.svg)\n");
    o
}

/// The three charts: (file name, SVG).
pub fn charts(r: &Results, slo_s: f64) -> Vec<(&'static str, String)> {
    let mut cdf = Chart {
        title: format!("TTFT CDF per class ({})", r.scenario.name),
        x_label: "time to first token (s, log scale)".into(),
        y_label: "fraction of requests".into(),
        x_marker: Some((slo_s, format!("SLO {slo_s} s"))),
        x_log: true,
        ..Default::default()
    };
    let mut over = Chart {
        title: "TTFT over time".into(),
        x_label: "time of first token (s from start)".into(),
        y_label: "TTFT (s, log scale)".into(),
        y_marker: Some((slo_s, format!("SLO {slo_s} s"))),
        y_log: true,
        ..Default::default()
    };
    for c in &r.scenario.classes {
        let mut v: Vec<f64> = r
            .records
            .iter()
            .filter(|x| x.class == c.name)
            .filter_map(|x| x.ttft_s)
            .collect();
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let points = v
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, (i + 1) as f64 / n))
            .collect();
        cdf.series.push(Series {
            name: c.name.clone(),
            points,
            dots: false,
        });
        let points = r
            .records
            .iter()
            .filter(|x| x.class == c.name)
            .filter_map(|x| x.ttft_s.map(|t| (x.start_s + t, t)))
            .collect();
        over.series.push(Series {
            name: c.name.clone(),
            points,
            dots: true,
        });
    }
    let tp = Chart {
        title: format!("Output tokens/s (avg {:.0})", r.output_tokens_per_s),
        x_label: "time (s from start)".into(),
        y_label: "output tokens/s".into(),
        series: vec![Series {
            name: "all classes".into(),
            points: r
                .throughput_timeline
                .iter()
                .enumerate()
                .map(|(i, &v)| (i as f64 + 0.5, v))
                .collect(),
            dots: false,
        }],
        ..Default::default()
    };
    vec![
        ("ttft_cdf.svg", cdf.render()),
        ("ttft_over_time.svg", over.render()),
        ("throughput.svg", tp.render()),
    ]
}

/// Writes results.json, summary.md and the charts into `dir`.
pub fn write_all(dir: &Path, r: &Results, slo_s: f64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(r)?)?;
    std::fs::write(dir.join("summary.md"), summary_md(r))?;
    for (name, svg) in charts(r, slo_s) {
        std::fs::write(dir.join(name), svg)?;
    }
    Ok(())
}
