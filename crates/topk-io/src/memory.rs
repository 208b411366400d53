//! Reserving memory for a corpus: a request larger than the machine's
//! memory and swap together is refused up front, because under Linux's
//! overcommit a `try_reserve` of terabytes can succeed and the process is
//! then killed while it fills the pages.

use std::mem::size_of;

/// The machine's memory plus swap in bytes (`MemTotal + SwapTotal` of
/// `/proc/meminfo`), or `None` where that cannot be read.
pub fn memory_and_swap() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        kib.checked_mul(1024)
    };
    let total = field("MemTotal:")?;
    Some(total.saturating_add(field("SwapTotal:").unwrap_or(0)))
}

/// Reserves room for `count` more values in `v`, or returns the bytes asked
/// for when their size overflows, exceeds the machine's memory and swap, or
/// the allocator refuses them.
pub fn reserve<T>(v: &mut Vec<T>, count: usize) -> Result<(), u64> {
    let want = (count as u64).saturating_mul(size_of::<T>() as u64);
    let bytes = count
        .checked_mul(size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or(want)?;
    if memory_and_swap().is_some_and(|have| bytes as u64 > have) {
        return Err(want);
    }
    v.try_reserve_exact(count).map_err(|_| want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_past_the_machine_is_refused_naming_its_bytes() {
        let mut v: Vec<f32> = Vec::new();
        assert_eq!(reserve(&mut v, 1 << 62), Err(u64::MAX));
        // 4 TiB: more than this machine has, whatever the overcommit mode.
        assert_eq!(reserve(&mut v, 1 << 40), Err(1 << 42));
        assert!(reserve(&mut v, 16).is_ok());
        assert!(v.capacity() >= 16);
    }

    #[test]
    fn this_machine_reports_its_memory() {
        if let Some(bytes) = memory_and_swap() {
            assert!(bytes > 1 << 20, "{bytes}");
        } else {
            assert!(!std::path::Path::new("/proc/meminfo").exists());
        }
    }
}
