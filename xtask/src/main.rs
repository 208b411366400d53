//! Project automation: `cargo xtask <command>`.
//!
//! Everything the project needs beyond `cargo build`/`cargo test` lives here
//! rather than in shell scripts, so it runs the same on every machine with Rust.
//! Each command is its own module; `main` only dispatches.

use std::process::ExitCode;

mod util;

const HELP: &str = "\
cargo xtask <command>

commands:
  anchor-venv   create target/anchor-venv with the pinned numpy / faiss-cpu / hnswlib
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{HELP}");
        return ExitCode::FAILURE;
    };
    let result = match cmd.as_str() {
        "anchor-venv" => util::anchor_venv().map(|p| println!("{}", p.display())),
        "help" | "-h" | "--help" => {
            print!("{HELP}");
            Ok(())
        }
        other => Err(format!("unknown xtask command `{other}`\n\n{HELP}")),
    };
    let _ = rest;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}
