//! Host-side costs of staging a batch of host queries, on the machine that
//! runs it: the input check over the caller's buffer, the copy into pinned
//! memory, the check over the pinned copy just written (as the engine does
//! it), the copy split over threads, and the host-to-device copy of the
//! pinned buffer, for Q = 256 queries at D = 384 / 768 / 1024. Prints one
//! JSON line per D with the minimum over 200 trials of each, in µs.
//!
//! Usage: `stage_probe [--q Q]`

use std::time::Instant;

use cust::memory::{CopyDestination, DeviceBuffer, LockedBuffer};
use rayon::prelude::*;
use topk_core::validate;

fn best(trials: usize, mut f: impl FnMut()) -> f64 {
    let mut b = f64::MAX;
    for _ in 0..trials {
        let t = Instant::now();
        f();
        b = b.min(t.elapsed().as_secs_f64() * 1e6);
    }
    b
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let q: usize = args
        .iter()
        .position(|a| a == "--q")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let _ctx = cust::quick_init()?;
    for d in [384usize, 768, 1024] {
        let n = q * d;
        let user: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let mut pinned = LockedBuffer::new(&0.0f32, n)?;
        let mut dev = DeviceBuffer::from_slice(&user)?;
        let trials = 200;
        let check = best(trials, || {
            validate::queries_rowmajor(&user, d).expect("valid");
        });
        let copy = best(trials, || pinned.as_mut_slice().copy_from_slice(&user));
        let copy_check = best(trials, || {
            let piece = (256 * 1024 / 4 / d).max(1) * d;
            for (i, (dst, src)) in pinned
                .as_mut_slice()
                .chunks_mut(piece)
                .zip(user.chunks(piece))
                .enumerate()
            {
                dst.copy_from_slice(src);
                validate::queries_from(dst, d, i * piece / d).expect("valid");
            }
        });
        let par_copy_check = best(trials, || {
            let piece = (64 * 1024 / 4 / d).max(1) * d;
            pinned
                .as_mut_slice()
                .par_chunks_mut(piece)
                .zip(user.par_chunks(piece))
                .enumerate()
                .try_for_each(|(i, (dst, src))| {
                    dst.copy_from_slice(src);
                    validate::queries_from(dst, d, i * piece / d)
                })
                .expect("valid");
        });
        let h2d = best(trials, || dev.copy_from(&pinned).expect("h2d"));
        println!(
            "{}",
            serde_json::json!({"q": q, "d": d, "bytes": n * 4, "check_us": check, "copy_us": copy,
                "copy_check_pieces_us": copy_check, "parallel_copy_check_us": par_copy_check,
                "h2d_sync_us": h2d, "threads": rayon::current_num_threads()})
        );
    }
    Ok(())
}
