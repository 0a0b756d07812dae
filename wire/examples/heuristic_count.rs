//! Prints `path<TAB>count` for each file named in argv (or, with no arguments, one path a line
//! on stdin): the number of tokens the heuristic of `tutor_wire::tokens` gives the file's text,
//! without BOS. Used by `scripts/heuristic-fit/` to compare the heuristic with real tokenizers.
//!
//! `cargo run -q -p tutor-wire --example heuristic_count -- FILE...`

use std::io::{BufRead, Write};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        for line in std::io::stdin().lock().lines() {
            let line = line?;
            if !line.is_empty() {
                paths.push(line);
            }
        }
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for path in paths {
        let text = std::fs::read_to_string(&path)?;
        let count = tutor_wire::tokens::heuristic_ids(&text, false).len();
        writeln!(out, "{path}\t{count}")?;
    }
    out.flush()?;
    Ok(())
}
