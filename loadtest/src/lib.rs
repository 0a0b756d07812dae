//! tutor-load: the load generator and reports of tutor-gateway (issue 7; M5-M7, M9, M16).
//!
//! - [`scenario`]: scenario TOML (classes, shares or concurrency, open or closed loop, seed).
//! - [`prompt`]: seeded prompt text of an exact token length; [`draw`]: seeded request sizes,
//!   start offsets and think times.
//! - [`client`]: one streamed request (`/answer` or `/v1/chat/completions`), timed client side.
//! - [`runner`]: drives a scenario for a bounded time, with a progress line; [`record`]: what a
//!   run produced.
//! - [`stats`]: quantiles and `results.json`; [`report`] and [`svg`]: summary and charts.
//! - [`compare`]: the M7 verdict and SLO checks; [`matrix`]: the vLLM flag grid (M9);
//!   [`experiment`]: FIFO vs lanes through the real gateway (M16) per [`preset`] and
//!   [`engine`] setting, read against the [`floor`] (small clients alone); [`exp_report`]: its
//!   reports.
//! - [`openloop`]: the open-loop experiment (`experiment --arrivals poisson`): Poisson
//!   arrivals at fractions of FIFO's measured capacity, against the floor and the engine bound.
#![forbid(unsafe_code)]

pub mod arrivals;
pub mod client;
pub mod compare;
pub mod draw;
pub mod engine;
pub mod exp_report;
pub mod experiment;
pub mod floor;
pub mod matrix;
pub mod openloop;
pub mod preset;
pub mod prompt;
pub mod record;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod stats;
pub mod steps;
pub mod svg;
