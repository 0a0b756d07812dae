//! Like with like against the bundled simulator (prefix caching on, cached tokens reported):
//! two runs with the same seed and fresh salts send the same sizes but other text, so the
//! second is not served from the first one's cache; replaying the seed's text is, and
//! `compare` refuses that pair unless told to compare anyway.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Parser;
use tutor_load::arrivals::Stream;
use tutor_load::client::{Api, Target};
use tutor_load::compare::{compare, Rules};
use tutor_load::draw::open_sizes;
use tutor_load::prompt::PromptBuilder;
use tutor_load::runner::{run, RunOptions};
use tutor_load::scenario::Scenario;
use tutor_load::stats::Results;
use vllm_sim::tokenizer::PromptTokenizer;

/// One open-loop run (arrival times and sizes fixed by the seed) with `salt`.
async fn one_run(target: &Target, salt: Option<u64>) -> Results {
    let scenario = Scenario::parse(
        "name='cache'\nseed=11\n[load]\nmode='open'\nrate=20\n[[class]]\nname='q'\n\
         input_tokens=600\noutput_tokens=4\nshare=1\ndistribution='uniform'\n",
    )
    .unwrap();
    let opts = RunOptions {
        warmup: Duration::ZERO,
        duration: Duration::from_millis(1500),
        drain: Duration::from_secs(60),
        seed: 11,
        progress_every_s: 0,
    };
    let prompts = PromptBuilder::new(PromptTokenizer::Heuristic).salted(salt);
    let data = run(&scenario, target, &prompts, &opts).await;
    let mut r = Results::build(&scenario, target, opts.seed, opts.window_s(), &data);
    r.salt = salt;
    assert_eq!(r.errors, 0, "{:?}", r.errors_by_code);
    assert!(r.requests >= 5, "{} requests", r.requests);
    // Every arrival of the seed's schedule is sent once with its prompt (written ahead of the
    // clock), and each says how late it went.
    let mut scheduled = BTreeMap::new();
    for a in Stream::new(&scenario, 20.0, opts.seed).take_while(|a| a.at_s < 1.5) {
        *scheduled
            .entry(open_sizes(&scenario, a.class, a.index, opts.seed).0)
            .or_insert(0) += 1;
    }
    assert_eq!(sizes(&r), scheduled, "the schedule's arrivals, each once");
    assert!(r.records.iter().all(|l| l.lag_s.is_some_and(|s| s >= 0.0)));
    assert!(r.send_lag.is_some());
    r
}

/// Prompt tokens of every request, as a multiset.
fn sizes(r: &Results) -> BTreeMap<u32, usize> {
    let mut m = BTreeMap::new();
    for l in &r.records {
        *m.entry(l.prompt_tokens.expect("usage reports prompt tokens"))
            .or_insert(0) += 1;
    }
    m
}

fn ratio(r: &Results) -> f64 {
    r.prefix_cache.expect("cache figures").cached_ratio
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn salted_runs_miss_the_cache_replayed_ones_hit_it_and_compare_says_so() {
    let args = vllm_sim::SimArgs::try_parse_from([
        "vllm-sim",
        "--port",
        "0",
        "--speed",
        "20",
        "--enable-prompt-tokens-details",
    ])
    .unwrap();
    let sim = vllm_sim::start(&args).await.unwrap();
    let target = Target::new(&sim.url(), Api::Chat, None).unwrap();

    let first = one_run(&target, Some(1)).await;
    let second = one_run(&target, Some(2)).await;
    assert_eq!(sizes(&first), sizes(&second), "the seed fixes the sizes");
    assert!(
        ratio(&first) < 0.05 && ratio(&second) < 0.05,
        "{:?} {:?}",
        first.prefix_cache,
        second.prefix_cache
    );
    let v = compare(&first, &second, &Rules::default());
    assert!(!v.refused, "{}", v.text);

    // The first run's text again (--salt 1): the same sizes, now from the cache.
    let again = one_run(&target, Some(1)).await;
    assert_eq!(sizes(&first), sizes(&again));
    assert!(ratio(&again) > 0.5, "{:?}", again.prefix_cache);
    let v = compare(&first, &again, &Rules::default());
    assert!(v.refused, "{}", v.text);
    assert!(v.text.contains("REFUSED"), "{}", v.text);
    let v = compare(
        &first,
        &again,
        &Rules {
            allow_cache_mismatch: true,
            ..Rules::default()
        },
    );
    assert!(!v.refused && v.text.contains("WARNING: cache mismatch"));
    sim.shutdown().await;
}
