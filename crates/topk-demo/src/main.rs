//! `topk_demo`: the smoke story of exact top-K retrieval, and a small tool
//! that searches `.npy` / `.fvecs` files and writes `.jsonl` or `.npy` results.
//!
//! Run `topk_demo --help` for the options. The report goes to stdout, timings
//! to stderr through `tracing` (info level unless `RUST_LOG` says otherwise),
//! and any error to stderr as `error: <message>` with exit status 1.

mod backend;
mod cli;
mod error;
mod run;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    match run::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error::full_message(&e));
            ExitCode::FAILURE
        }
    }
}
