//! `topk_demo`: the smoke story of exact top-K retrieval, and a small tool
//! that searches `.npy` / `.fvecs` files and writes `.jsonl` or `.npy` results.
//!
//! Run `topk_demo --help` for the options. The report goes to stdout, timings
//! to stderr through `tracing` (info level unless `RUST_LOG` says otherwise),
//! and any error to stderr as `error: <message>` with exit status 1 (a
//! command line that does not parse: clap's message and status 2).
//!
//! `--out` files are written completely or not at all, before the report: a
//! stdout that closes early (`| head`) or fails (`> /dev/full`) only cuts the
//! report short (the latter with a warning on stderr); the results (and the
//! index file of an `index` command) are kept and the exit status stays 0.

mod cli;
mod error;
mod index_cmd;
mod output;
mod progress;
mod run;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};
use tracing_subscriber::EnvFilter;

use crate::error::DemoError;

fn main() -> ExitCode {
    let matches = cli::Args::command().get_matches();
    let args = match cli::Args::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let result = match &args.command {
        Some(cli::Command::Index(cmd)) => index_flags(cmd, &matches)
            .and_then(|()| index_cmd::run(cmd, progress::Progress::new(args.no_progress))),
        None => hnsw_flags_need_hnsw(&args, &matches).and_then(|()| run::run(&args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed stderr leaves nowhere to report to; the status still says it.
            let _ = writeln!(std::io::stderr(), "error: {}", error::full_message(&e));
            ExitCode::FAILURE
        }
    }
}

/// Refuses the search story's flags typed beside an `index` command (only
/// `--no-progress` is shared, before or after the command), and the HNSW
/// build flags of `index build` typed with an exact backend.
fn index_flags(cmd: &cli::IndexCommand, matches: &ArgMatches) -> Result<(), DemoError> {
    let Some(("index", index)) = matches.subcommand() else {
        return Ok(());
    };
    let command = index.subcommand_name().unwrap_or_default().to_owned();
    for arg in cli::Args::command().get_arguments() {
        let id = arg.get_id().as_str();
        if id == "no_progress" || matches.value_source(id) != Some(ValueSource::CommandLine) {
            continue;
        }
        let flag = arg
            .get_long()
            .map_or_else(|| id.to_owned(), |l| format!("--{l}"));
        return Err(DemoError::FlagWithCommand { flag, command });
    }
    if let (cli::IndexCommand::Build { backend, .. }, Some(("build", build))) =
        (cmd, index.subcommand())
    {
        let backend = topk::IndexBackend::from(*backend);
        if backend != topk::IndexBackend::Hnsw {
            if let Some(flag) = typed_hnsw_flag(build) {
                return Err(DemoError::HnswOnlyFlag {
                    flag,
                    backend: backend.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// The first of `--m`, `--ef-construction`, `--ef` typed on the command line.
fn typed_hnsw_flag(matches: &ArgMatches) -> Option<&'static str> {
    [
        ("m", "--m"),
        ("ef_construction", "--ef-construction"),
        ("ef", "--ef"),
    ]
    .into_iter()
    .find(|(id, _)| matches.value_source(id) == Some(ValueSource::CommandLine))
    .map(|(_, flag)| flag)
}

/// Refuses `--m`, `--ef-construction`, `--ef` or `--recall-sample` typed
/// with another backend than HNSW (silently ignoring them would hide a
/// mistake), and a `--recall-sample` of 0.
fn hnsw_flags_need_hnsw(args: &cli::Args, matches: &ArgMatches) -> Result<(), DemoError> {
    if args.backend == topk::Backend::Hnsw {
        return match args.recall_sample {
            Some(0) => Err(DemoError::RecallSampleZero),
            _ => Ok(()),
        };
    }
    if args.recall_sample.is_some() {
        return Err(DemoError::RecallNeedsHnsw {
            backend: args.backend.to_string(),
        });
    }
    match typed_hnsw_flag(matches) {
        Some(flag) => Err(DemoError::HnswOnlyFlag {
            flag,
            backend: args.backend.to_string(),
        }),
        None => Ok(()),
    }
}
