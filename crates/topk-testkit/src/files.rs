//! Editing files the way a writer would, to make valid-looking bad files,
//! and writes that fail as on a full disk.

/// The standard CRC-32 (IEEE 802.3, reflected, polynomial `0xEDB88320`),
/// bit by bit: an independent check of the writers' checksums.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Makes a FIFO at `path` (`mkfifo`), for the tests that a reader refuses
/// it without blocking.
#[cfg(unix)]
pub fn mkfifo(path: &std::path::Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// The variable that marks the child process of [`full_disk_child`].
const FULL_DISK_CHILD: &str = "TOPK_TEST_FULL_DISK_CHILD";

/// Runs test `test` (its full name in this test binary) again in a child
/// process whose files cannot grow past 512 bytes: the shell's `ulimit -f 1`
/// with `SIGXFSZ` ignored, so a write past it fails with `EFBIG` as on a
/// full disk. Returns `true` in the child, which then does the whole
/// scenario (small files still fit); returns `false` in the parent once the
/// child has run that test and passed, and panics with the child's output
/// otherwise.
///
/// ```no_run
/// #[test]
/// fn a_save_that_runs_out_of_space_keeps_the_previous_file() {
///     if !topk_testkit::files::full_disk_child("a_save_that_runs_out_of_space_keeps_the_previous_file") {
///         return; // the child passed
///     }
///     // ... a small save that fits, a large one that must fail cleanly
/// }
/// ```
#[cfg(unix)]
pub fn full_disk_child(test: &str) -> bool {
    if std::env::var_os(FULL_DISK_CHILD).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    // An ignored signal stays ignored across exec.
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"trap '' XFSZ; ulimit -f 1 && exec "$0" "$@""#)
        .arg(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(FULL_DISK_CHILD, "1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the full-disk child of {test} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_check_value_of_crc32() {
        assert_eq!(super::crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(super::crc32(b""), 0);
    }
}
