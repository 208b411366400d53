//! `cargo xtask lifecycle-bench`: the CPU lifecycle benchmark of topk against
//! faiss-cpu and hnswlib, into `bench/results/<machine>/<date>-<commit>/lifecycle/`.
//!
//! One data set per dimension is written once (`bench/cpu/lifecycle_anchors.py
//! gen`, under `target/lifecycle-data/`) and read by both engines: topk's
//! `lifecycle_bench` example and the Python anchors, each a long-lived
//! process answering one JSON command per line. Every measurement is sent to
//! both in turn (A, B, then B, A in the next round), so a change of load on
//! this shared machine falls on both; the figures are medians over the
//! rounds with their spread. Then the save / open timing of a large index
//! (`lifecycle_bench persist`), the id check of topk's exact answers against
//! faiss's, and `table.md` with the plots.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{json, Value};

use crate::util::{
    anchor_venv, cargo_target_dir, results_dir, root, run, short_commit, today, XResult,
};

/// Flags of `cargo xtask lifecycle-bench`.
#[derive(clap::Args)]
pub struct LifecycleArgs {
    /// Results folder [default: bench/results/<machine>/<date>-<commit>/lifecycle].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Small sizes for a smoke run, into target/bench/lifecycle-<date>-quick.
    #[arg(long)]
    quick: bool,
    /// Corpus rows of the search and add / remove measurements.
    #[arg(long, default_value_t = 200_000)]
    n: usize,
    /// Dimensions of the exact search measurements, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [384, 1024])]
    dims: Vec<usize>,
    /// The dimension of the graph and add / remove measurements (one of
    /// --dims; 0 skips them).
    #[arg(long, default_value_t = 384)]
    graph_dim: usize,
    /// Rounds of every measurement, per engine.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Minimum seconds of calls per engine, round and search case.
    #[arg(long, default_value_t = 0.3)]
    min_time: f64,
    /// Rows of the save / open index (0 skips it).
    #[arg(long, default_value_t = 1_000_000)]
    persist_n: usize,
    /// Dimension of the save / open index.
    #[arg(long, default_value_t = 1024)]
    persist_d: usize,
    /// Threads of both engines [default: every core].
    #[arg(long)]
    threads: Option<usize>,
}

/// HNSW parameters of the graph measurements (the same for both libraries).
const M: usize = 16;
const EF_CONSTRUCTION: usize = 200;
const EF: usize = 64;
const SEED: u64 = 100;

/// The filters of every search case: unfiltered, then the selectivities of
/// the data set (percent of the corpus allowed).
const SELECTIVITIES: [Option<&str>; 5] = [None, Some("100"), Some("10"), Some("1"), Some("0.1")];

/// One add / remove series per round: (target, kind, batch, rows, seconds).
const SERIES: [(&str, &str, usize, usize, f64); 10] = [
    ("flat", "add", 1, 1_000, 3.0),
    ("flat", "add", 100, 2_000, 3.0),
    ("flat", "add", 10_000, 20_000, 3.0),
    ("flat", "remove", 1, 1_000, 3.0),
    ("flat", "remove", 100, 2_000, 3.0),
    ("flat", "remove", 10_000, 20_000, 3.0),
    ("graph", "add", 1, 300, 5.0),
    ("graph", "add", 100, 1_000, 5.0),
    ("graph", "remove", 1, 300, 5.0),
    ("graph", "remove", 100, 1_000, 5.0),
];

/// Fresh rows one round's series may add to one target.
const ROWS_PER_ROUND: usize = 23_000;

/// A long-lived engine process answering one JSON command per line.
struct Engine {
    /// "topk" or "anchors".
    name: &'static str,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Engine {
    /// Starts `cmd` and waits for its `{"ready": true}` line.
    fn start(name: &'static str, mut cmd: Command) -> XResult<Engine> {
        let shown = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("could not start {shown}: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut engine = Engine {
            name,
            child,
            stdin,
            stdout,
        };
        engine.read()?;
        Ok(engine)
    }

    fn read(&mut self) -> XResult<Value> {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .map_err(|e| format!("{}: {e}", self.name))?;
        if n == 0 {
            return Err(format!("{} exited before answering", self.name));
        }
        serde_json::from_str(&line).map_err(|e| format!("{}: bad reply {line:?}: {e}", self.name))
    }

    fn call(&mut self, cmd: &Value) -> XResult<Value> {
        writeln!(self.stdin, "{cmd}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("{}: {e}", self.name))?;
        self.read()
    }

    /// Sends `quit` and waits for the process to end.
    fn quit(mut self) -> XResult<()> {
        writeln!(self.stdin, "{}", json!({ "op": "quit" })).map_err(|e| e.to_string())?;
        drop(self.stdin);
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("{} ended with {status}", self.name));
        }
        Ok(())
    }
}

/// The label of an engine's answer to `cmd` in the raw records: topk, or
/// the anchor library that answered.
fn label(engine: &str, cmd: &Value) -> &'static str {
    if engine == "topk" {
        return "topk";
    }
    let graph = matches!(cmd["op"].as_str(), Some("build_graph" | "graph"))
        || cmd["target"].as_str() == Some("graph");
    if graph {
        "hnswlib"
    } else {
        "faiss"
    }
}

/// `cmd` wrapped in `/usr/bin/time -v -o <log>` where GNU time is installed,
/// so that every run leaves its peak memory beside the results.
fn timed(program: &Path, log: &Path) -> Command {
    let time = Path::new("/usr/bin/time");
    if time.exists() {
        let mut cmd = Command::new(time);
        cmd.arg("-v").arg("-o").arg(log).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// The output of `cmd`, trimmed, or `unknown`.
fn output(cmd: &mut Command) -> String {
    match cmd.output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        _ => "unknown".to_owned(),
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn write(path: &Path, text: &str) -> XResult<()> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs the benchmark.
pub fn lifecycle_cmd(args: &LifecycleArgs) -> XResult<()> {
    let quick = args.quick;
    let (n, dims, graph_dim, persist_n, persist_d, rounds) = if quick {
        (20_000, vec![64], 64, 20_000, 128, 2)
    } else {
        (
            args.n,
            args.dims.clone(),
            args.graph_dim,
            args.persist_n,
            args.persist_d,
            args.rounds,
        )
    };
    if rounds == 0 {
        return Err("--rounds must be at least 1".to_owned());
    }
    let out = match &args.out {
        Some(o) => o.clone(),
        None if quick => root().join(format!("target/bench/lifecycle-{}-quick", today())),
        None => results_dir().join("lifecycle"),
    };
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let python = anchor_venv()?;
    let script = root().join("bench/cpu/lifecycle_anchors.py");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    run(Command::new(cargo).current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "topk-index",
        "--example",
        "lifecycle_bench",
    ]))?;
    // A private copy, so that a concurrent build cannot swap it mid-run.
    let built = cargo_target_dir().join("release/examples/lifecycle_bench");
    let bin_dir = root().join("target/xtask-bench");
    std::fs::create_dir_all(&bin_dir).map_err(|e| format!("{}: {e}", bin_dir.display()))?;
    let bin = bin_dir.join("lifecycle_bench");
    std::fs::copy(&built, &bin)
        .map_err(|e| format!("{} → {}: {e}", built.display(), bin.display()))?;

    // The commit measured: the binary is built from the tree as it is now.
    let commit = short_commit();
    let load_start = load_average();
    eprintln!("load average before the run: {load_start}");
    let extra = rounds * ROWS_PER_ROUND + 1_000;
    let mut raw = String::new();
    let mut checks = Vec::new();
    for &d in &dims {
        let data = root().join(format!("target/lifecycle-data/n{n}-d{d}-e{extra}"));
        if !data.join("manifest.json").exists() {
            run(Command::new(&python)
                .arg(&script)
                .arg("gen")
                .arg("--dir")
                .arg(&data)
                .args(["--n", &n.to_string(), "--d", &d.to_string()])
                .args(["--extra", &extra.to_string()]))?;
        }
        let _ = std::fs::remove_dir_all(data.join("results"));
        let mut topk_cmd = timed(&bin, &out.join(format!("time-v-topk-d{d}.txt")));
        topk_cmd
            .arg("serve")
            .arg("--dir")
            .arg(&data)
            .env("RAYON_NUM_THREADS", threads.to_string());
        let mut anchor_cmd = timed(&python, &out.join(format!("time-v-anchors-d{d}.txt")));
        anchor_cmd
            .arg(&script)
            .arg("serve")
            .arg("--dir")
            .arg(&data)
            .args(["--threads", &threads.to_string()])
            .env("OMP_NUM_THREADS", threads.to_string());
        let mut engines = [
            Engine::start("topk", topk_cmd)?,
            Engine::start("anchors", anchor_cmd)?,
        ];
        // Sends `cmd` to both engines, in turn (the order flips with the
        // round), and records both replies.
        let mut both = |engines: &mut [Engine; 2], cmd: &Value, round: usize| -> XResult<()> {
            let order = if round.is_multiple_of(2) {
                [0, 1]
            } else {
                [1, 0]
            };
            for i in order {
                let e = &mut engines[i];
                let reply = e.call(cmd)?;
                let rec = json!({
                    "engine": label(e.name, cmd),
                    "d": d,
                    "n": n,
                    "round": round,
                    "cmd": cmd,
                    "reply": reply,
                });
                raw.push_str(&rec.to_string());
                raw.push('\n');
            }
            Ok(())
        };
        eprintln!("D = {d}: exact search");
        both(&mut engines, &json!({ "op": "setup_exact" }), 0)?;
        for k in [10, 100] {
            for q in [1, 64] {
                for sel in SELECTIVITIES {
                    for round in 0..rounds {
                        let cmd = json!({
                            "op": "exact", "k": k, "q": q, "sel": sel,
                            "min_time_s": args.min_time,
                            "save_ids": round == 0 && q == 64,
                        });
                        both(&mut engines, &cmd, round)?;
                    }
                }
            }
        }
        if d == graph_dim {
            eprintln!("D = {d}: graph builds");
            let build = json!({
                "op": "build_graph", "m": M, "ef_construction": EF_CONSTRUCTION,
                "ef": EF, "seed": SEED,
            });
            both(&mut engines, &build, 0)?;
            eprintln!("D = {d}: filtered graph search");
            for sel in SELECTIVITIES {
                for round in 0..rounds {
                    let cmd = json!({
                        "op": "graph", "k": 10, "sel": sel, "min_time_s": args.min_time,
                    });
                    both(&mut engines, &cmd, round)?;
                }
            }
            eprintln!("D = {d}: add / remove");
            for round in 0..rounds {
                for (target, kind, batch, rows, budget) in SERIES {
                    let cmd = json!({
                        "op": "mutate", "target": target, "kind": kind, "batch": batch,
                        "rows": rows, "budget_s": budget,
                    });
                    both(&mut engines, &cmd, round)?;
                }
                for target in ["flat", "graph"] {
                    both(
                        &mut engines,
                        &json!({ "op": "end_round", "target": target }),
                        round,
                    )?;
                }
            }
        }
        let [a, b] = engines;
        a.quit()?;
        b.quit()?;
        let check = out.join(format!("check-d{d}.json"));
        run(Command::new(&python)
            .arg(&script)
            .arg("check")
            .arg("--dir")
            .arg(&data)
            .arg("--out")
            .arg(&check))?;
        checks.push(check);
    }
    let raw_path = out.join("raw.jsonl");
    write(&raw_path, &raw)?;

    let persist_path = out.join("persist.json");
    if persist_n > 0 {
        eprintln!("save / open of {persist_n} x {persist_d}");
        let tmp = root().join("target/lifecycle-persist");
        let o = timed(&bin, &out.join("time-v-persist.txt"))
            .arg("persist")
            .arg("--dir")
            .arg(&tmp)
            .args(["--n", &persist_n.to_string(), "--d", &persist_d.to_string()])
            .args(["--rounds", &rounds.to_string()])
            .env("RAYON_NUM_THREADS", threads.to_string())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("could not start {}: {e}", bin.display()))?;
        if !o.status.success() {
            return Err(format!("lifecycle_bench persist failed with {}", o.status));
        }
        write(&persist_path, &String::from_utf8_lossy(&o.stdout))?;
        let _ = std::fs::remove_dir_all(&tmp);
    }
    let load_end = load_average();

    let versions = output(Command::new(&python).args([
        "-c",
        "import json, platform, numpy, faiss, importlib.metadata as m; \
         print(json.dumps({'python': platform.python_version(), 'numpy': numpy.__version__, \
         'faiss-cpu': faiss.__version__, 'hnswlib': m.version('hnswlib'), \
         'matplotlib': m.version('matplotlib')}))",
    ]));
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo.lines().next().unwrap_or_default().to_owned();
    let env = json!({
        "date_utc": output(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])),
        "commit": commit,
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map_or(1, usize::from),
        "threads": threads,
        "memory": mem,
        "kernel": output(Command::new("uname").arg("-r")),
        "rustc": output(Command::new("rustc").arg("-V")),
        "anchors": serde_json::from_str::<Value>(&versions).unwrap_or(Value::String(versions)),
        "load_average_start": load_start,
        "load_average_end": load_end,
        "params": {
            "n": n, "dims": dims, "graph_dim": graph_dim, "rounds": rounds,
            "min_time_s": args.min_time, "m": M, "ef_construction": EF_CONSTRUCTION,
            "ef": EF, "seed": SEED, "persist_n": persist_n, "persist_d": persist_d,
        },
    });
    let env_text = serde_json::to_string_pretty(&env).map_err(|e| e.to_string())?;
    write(&out.join("environment.json"), &env_text)?;
    let command: Vec<String> = std::env::args().skip(1).collect();
    write(
        &out.join("command.txt"),
        &format!("cargo xtask {}\n", command.join(" ")),
    )?;

    let mut report = Command::new(&python);
    report
        .arg(&script)
        .arg("report")
        .arg("--raw")
        .arg(&raw_path)
        .arg("--out")
        .arg(&out)
        .args(["--threads", &threads.to_string()])
        .arg("--check")
        .args(&checks);
    if persist_n > 0 {
        report.arg("--persist").arg(&persist_path);
    }
    run(&mut report)?;
    eprintln!("lifecycle benchmark in {}", out.display());
    Ok(())
}
