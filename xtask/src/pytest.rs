//! `cargo xtask test`: the project's one test command. It runs every Rust
//! test (`cargo test --workspace`), then the Python package's: a venv at
//! `target/py-venv` with the exact pins of
//! `crates/topk-py/requirements-test.txt`, the extension built into it by
//! maturin, `ruff check` and `ruff format --check` over the package and
//! `examples/python`, and `pytest` over `crates/topk-py/tests` (LangChain's
//! standard vector store suite included). Only Rust and Python 3 need to be
//! on the machine.
//!
//! The extension is built with cargo's dev profile (`maturin develop`),
//! which shares the dependencies that `cargo test --workspace` has just
//! built; a release build would compile the whole tree a second time, for
//! tests that spend well under a minute in the extension.

use std::path::Path;
use std::process::Command;

use clap::Args;

use crate::util::{pinned_venv, root, run, XResult};

/// The pins of the Python test environment.
const REQUIREMENTS: &str = "crates/topk-py/requirements-test.txt";
/// The venv under `target/` that holds them.
const VENV: &str = "py-venv";
/// The Python package: its pyproject.toml, sources and tests.
const PACKAGE: &str = "crates/topk-py";

/// Flags of `cargo xtask test`.
#[derive(Args)]
pub struct TestArgs {
    /// Skip `cargo test --workspace` and run the Python part alone.
    #[arg(long)]
    pub python_only: bool,
    /// Extra arguments for pytest (after `--`), e.g. `-- -k langchain -x`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub pytest: Vec<String>,
}

fn step(what: &str) {
    eprintln!("xtask test: {what}");
}

/// Runs the Rust tests, then the Python package's lints and tests.
pub fn test_cmd(args: &TestArgs) -> XResult<()> {
    let root = root();
    if !args.python_only {
        step("cargo test --workspace");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        run(Command::new(cargo)
            .current_dir(&root)
            .args(["test", "--workspace"]))?;
    }
    step(&format!("python venv target/{VENV} from {REQUIREMENTS}"));
    let python = pinned_venv(VENV, REQUIREMENTS)?;
    let venv = root.join("target").join(VENV);
    let package = root.join(PACKAGE);

    step("building the extension into the venv (maturin develop)");
    run(venv_cmd(&venv, &python)
        .current_dir(&package)
        .args(["-m", "maturin", "develop", "--quiet"]))?;

    step("ruff check, ruff format --check (the package and examples/python)");
    for check in [&["check"][..], &["format", "--check"][..]] {
        run(venv_cmd(&venv, &python)
            .current_dir(&package)
            .args(["-m", "ruff"])
            .args(check)
            .args(["--config", "pyproject.toml", ".", "../../examples/python"]))?;
    }

    step("pytest crates/topk-py/tests");
    run(venv_cmd(&venv, &python)
        .current_dir(&package)
        .args(["-m", "pytest", "-rs", "tests"])
        .args(&args.pytest))?;
    step("done: every test passed");
    Ok(())
}

/// `python` of the venv, with the venv active (maturin installs into
/// `$VIRTUAL_ENV`; its tools are first on `$PATH`).
fn venv_cmd(venv: &Path, python: &Path) -> Command {
    let mut cmd = Command::new(python);
    let bin = venv.join("bin");
    let path = match std::env::var_os("PATH") {
        Some(old) => {
            let mut dirs = vec![bin];
            dirs.extend(std::env::split_paths(&old));
            std::env::join_paths(dirs).unwrap_or(old)
        }
        None => bin.into_os_string(),
    };
    cmd.env("VIRTUAL_ENV", venv).env("PATH", path);
    cmd
}
