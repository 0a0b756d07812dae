//! `--tokenizer PATH` loads a real HuggingFace `tokenizer.json` (trained here, not downloaded).

mod common;

use common::*;
use serde_json::Value;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, TokenizerBuilder};

fn train(dir: &std::path::Path) -> std::path::PathBuf {
    let corpus = dir.join("corpus.txt");
    let mut text = String::new();
    for i in 0..200 {
        text.push_str(&format!(
            "fn main() {{ let x{i} = vec![1, 2, 3]; println!(\"{{}}\", x{i}.len()); }}\n\
             Why does this TypeScript error happen? The type string is not assignable to number.\n"
        ));
    }
    std::fs::write(&corpus, text).unwrap();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(400)
        .min_frequency(2)
        .special_tokens(vec![AddedToken::from("<|bos|>", true)])
        .build();
    let mut tok = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        ByteLevel,
        PostProcessorWrapper,
        ByteLevel,
    >::new()
    .with_model(BPE::default())
    .with_pre_tokenizer(Some(ByteLevel::default()))
    .with_decoder(Some(ByteLevel::default()))
    .build()
    .unwrap();
    tok.train_from_files(&mut trainer, vec![corpus.to_string_lossy().into_owned()])
        .unwrap();
    let path = dir.join("tokenizer.json");
    tok.save(&path, false).unwrap();
    path
}

#[tokio::test]
async fn tokenize_and_usage_count_with_the_real_tokenizer() {
    let dir = std::env::temp_dir().join(format!("vllm-sim-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = train(&dir);
    let expected = tokenizers::Tokenizer::from_file(&path)
        .unwrap()
        .encode("Why does this TypeScript error happen?", true)
        .unwrap()
        .len();
    let s = sim(&[
        "--tokenizer",
        path.to_str().unwrap(),
        "--speed",
        "50",
        "--profile",
        "tiny-test",
    ])
    .await;
    let v: Value = send_json(
        client()
            .post(format!("{}/tokenize", s.url()))
            .json(&serde_json::json!({"prompt": "Why does this TypeScript error happen?"})),
    )
    .await;
    assert_eq!(v["count"], expected);
    assert_ne!(
        expected,
        vllm_sim::tokenizer::heuristic_ids("Why does this TypeScript error happen?", true).len(),
        "the test would not tell the tokenizers apart"
    );
    let v: Value = send_json(client().post(format!("{}/v1/completions", s.url())).json(
        &serde_json::json!({"prompt": "Why does this TypeScript error happen?", "max_tokens": 3}),
    ))
    .await;
    assert_eq!(v["usage"]["prompt_tokens"], expected);
    s.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
