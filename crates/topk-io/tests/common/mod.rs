//! Helpers shared by topk-io's test files.

/// A version-1 `.npy` file with the given header dictionary and data bytes,
/// padded the way numpy pads (total header a multiple of 64 bytes).
pub fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut header = dict.to_owned();
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}
