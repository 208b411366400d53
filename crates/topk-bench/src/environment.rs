//! The record of where a campaign ran: CPU, GPU, driver, CUDA, clocks as read
//! (not locked), commit, date and the bandwidths the floors use.
//!
//! Everything is read from the machine at run time; a fact that cannot be
//! read (no `nvidia-smi`, no git checkout) is recorded as `null`, never guessed.

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::error::Result;
use crate::membw::HostBandwidth;

/// What `nvidia-smi` reports for the first GPU.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GpuSmi {
    /// Product name.
    pub name: Option<String>,
    /// Driver version.
    pub driver: Option<String>,
    /// CUDA version the driver supports (from the banner).
    pub cuda: Option<String>,
    /// Total memory, MiB.
    pub memory_mib: Option<String>,
    /// SM clock at the time of reading, MHz.
    pub clock_sm_mhz: Option<String>,
    /// Memory clock at the time of reading, MHz.
    pub clock_mem_mhz: Option<String>,
    /// Maximum SM clock, MHz.
    pub clock_sm_max_mhz: Option<String>,
    /// Maximum memory clock, MHz.
    pub clock_mem_max_mhz: Option<String>,
    /// Power limit, W.
    pub power_limit_w: Option<String>,
    /// Persistence mode.
    pub persistence_mode: Option<String>,
}

/// The environment of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    /// UTC date and time the record was taken, `YYYY-MM-DDTHH:MM:SSZ`.
    pub date_utc: String,
    /// Commit of the code (env `TOPK_COMMIT`, else `git rev-parse HEAD`).
    pub commit: Option<String>,
    /// CPU model name from `/proc/cpuinfo`.
    pub cpu_model: Option<String>,
    /// Logical CPUs available to this process.
    pub cpu_threads: usize,
    /// Threads in rayon's pool (what the CPU paths use).
    pub rayon_threads: usize,
    /// Total memory from `/proc/meminfo`, KiB.
    pub mem_total_kib: Option<u64>,
    /// Kernel release from `/proc/sys/kernel/osrelease`.
    pub kernel: Option<String>,
    /// Load average when the record was taken (the machine may be shared).
    pub loadavg: Option<String>,
    /// Load average when the run finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loadavg_end: Option<String>,
    /// GPU facts from `nvidia-smi`, when it is present.
    pub gpu: Option<GpuSmi>,
    /// GPU facts from the engine itself (CUDA builds with a device).
    pub device: Option<serde_json::Value>,
    /// Device-to-device copy bandwidth, bytes/s, read + write counted.
    pub d2d_bytes_per_s: Option<f64>,
    /// Host memory bandwidth measured in the same run.
    pub host_bandwidth: Option<HostBandwidth>,
    /// Whether this build has the CUDA paths.
    pub cuda_build: bool,
    /// topk version.
    pub topk_version: &'static str,
    /// The command line that produced the results.
    pub command: String,
}

impl Environment {
    /// Reads what the machine tells without measuring anything.
    pub fn read() -> Environment {
        Environment {
            date_utc: utc_now(),
            commit: commit(),
            cpu_model: cpu_model(),
            cpu_threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            rayon_threads: rayon::current_num_threads(),
            mem_total_kib: mem_total_kib(),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            loadavg: read_trimmed("/proc/loadavg"),
            loadavg_end: None,
            gpu: nvidia_smi(),
            device: None,
            d2d_bytes_per_s: None,
            host_bandwidth: None,
            cuda_build: cfg!(feature = "cuda"),
            topk_version: env!("CARGO_PKG_VERSION"),
            command: std::env::args().collect::<Vec<_>>().join(" "),
        }
    }

    /// Records the load average now, as the end-of-run figure.
    pub fn mark_end(&mut self) {
        self.loadavg_end = read_trimmed("/proc/loadavg");
    }

    /// Writes `environment.json` (pretty-printed) into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join("environment.json");
        let text = serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".to_owned());
        crate::record::write_whole(&path, (text + "\n").as_bytes())
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

fn mem_total_kib() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn commit() -> Option<String> {
    if let Ok(c) = std::env::var("TOPK_COMMIT") {
        if !c.trim().is_empty() {
            return Some(c.trim().to_owned());
        }
    }
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn nvidia_smi() -> Option<GpuSmi> {
    let fields = "name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,persistence_mode";
    let out = Command::new("nvidia-smi")
        .args([
            &format!("--query-gpu={fields}"),
            "--format=csv,noheader,nounits",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next()?;
    let mut v = first.split(',').map(|s| {
        let s = s.trim();
        (!s.is_empty() && s != "[N/A]").then(|| s.to_owned())
    });
    let mut next = || v.next().flatten();
    let mut smi = GpuSmi {
        name: next(),
        driver: next(),
        cuda: None,
        memory_mib: next(),
        clock_sm_mhz: next(),
        clock_mem_mhz: next(),
        clock_sm_max_mhz: next(),
        clock_mem_max_mhz: next(),
        power_limit_w: next(),
        persistence_mode: next(),
    };
    // The CUDA version appears only in the banner of the plain command.
    if let Ok(banner) = Command::new("nvidia-smi").output() {
        let b = String::from_utf8_lossy(&banner.stdout);
        smi.cuda = b
            .split("CUDA Version:")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(|s| s.trim_end_matches('|').to_owned());
    }
    Some(smi)
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_utc(secs)
}

/// Today's UTC date as `YYYY-MM-DD` (names of results folders).
pub fn utc_date() -> String {
    utc_now()[..10].to_owned()
}

/// Formats seconds since the Unix epoch as an ISO 8601 UTC timestamp.
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm), valid for any date after 1970.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_timestamps() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_798_761_599), "2026-12-31T23:59:59Z");
    }

    #[test]
    fn environment_serialises() {
        let env = Environment::read();
        let dir = tempfile::tempdir().unwrap();
        env.write(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join("environment.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(v["cpu_threads"].as_u64().unwrap() >= 1);
        assert!(v.get("commit").is_some() && v.get("gpu").is_some());
    }
}
