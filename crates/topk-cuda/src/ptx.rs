//! The PTX this crate loads, generated from `kernels/*.cu` by
//! `cargo xtask ptx` and committed, plus the source hash that ties each
//! generated file to the sources and flags it came from.
//!
//! The hash lives here (not in xtask) so that the generator and the staleness
//! test compute it with the same code.

/// nvcc flags every kernel is compiled with. No fast-math: the canonical score
/// (DESIGN.md §2) needs IEEE division and square root, denormals kept and no
/// implicit contraction (the kernels write every fma explicitly).
pub const NVCC_FLAGS: &[&str] = &[
    "-ptx",
    "-arch=compute_80",
    "-O3",
    "-std=c++17",
    "-fmad=false",
    "-ftz=false",
    "-prec-div=true",
    "-prec-sqrt=true",
];

/// The kernel families, one `.cu` (and one `.ptx`) each.
pub const KERNEL_NAMES: &[&str] = &["score", "select", "filter"];

/// First-line marker of a generated PTX file, followed by the hash.
pub const HASH_MARKER: &str = "// topk kernel sources hash: ";

/// PTX of `kernels/score.cu`: scoring, norms and the gathered-ids scorer.
pub const SCORE_PTX: &str = include_str!("../../../kernels/score.ptx");
/// PTX of `kernels/select.cu`: threshold and exact selection.
pub const SELECT_PTX: &str = include_str!("../../../kernels/select.ptx");
/// PTX of `kernels/filter.cu`: tensor-core bounds and the filtered batch's
/// listing and rescoring.
pub const FILTER_PTX: &str = include_str!("../../../kernels/filter.ptx");

/// A stable 64-bit FNV-1a hash of the flags and every source file given as
/// `(file name, contents)`, in name order, as 16 hex digits.
///
/// Names take part so a renamed header changes the hash; the separators keep
/// `("ab", "c")` and `("a", "bc")` apart.
pub fn source_hash(flags: &[&str], files: &[(String, String)]) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
        h ^= 0xff;
        h = h.wrapping_mul(PRIME);
    };
    for f in flags {
        feed(f.as_bytes());
    }
    let mut sorted: Vec<&(String, String)> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, text) in sorted {
        feed(name.as_bytes());
        // Line endings must not matter (a checkout may convert them).
        feed(text.replace("\r\n", "\n").as_bytes());
    }
    format!("{h:016x}")
}

/// The hash recorded in the first line of a generated PTX file, if any.
pub fn recorded_hash(ptx: &str) -> Option<&str> {
    ptx.lines()
        .next()
        .and_then(|l| l.strip_prefix(HASH_MARKER))
        .map(|rest| rest.split_whitespace().next().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn kernel_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../kernels")
    }

    /// Every `.cu` / `.cuh` under kernels/, as the generator reads them.
    fn sources() -> Vec<(String, String)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(kernel_dir()).expect("kernels/ exists") {
            let p = e.expect("readable entry").path();
            let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
            if ext == "cu" || ext == "cuh" {
                let name = p
                    .file_name()
                    .expect("file name")
                    .to_string_lossy()
                    .into_owned();
                out.push((name, std::fs::read_to_string(&p).expect("utf-8 source")));
            }
        }
        out
    }

    #[test]
    fn embedded_ptx_matches_kernel_sources() {
        let want = source_hash(NVCC_FLAGS, &sources());
        for (name, ptx) in [
            ("score", SCORE_PTX),
            ("select", SELECT_PTX),
            ("filter", FILTER_PTX),
        ] {
            let got = recorded_hash(ptx);
            assert_eq!(
                got,
                Some(want.as_str()),
                "kernels/{name}.ptx: kernel sources changed: run `cargo xtask ptx` and commit"
            );
        }
    }

    #[test]
    fn hash_sees_names_contents_and_flags() {
        let a = vec![("a.cu".to_owned(), "x".to_owned())];
        let b = vec![("b.cu".to_owned(), "x".to_owned())];
        let c = vec![("a.cu".to_owned(), "y".to_owned())];
        assert_ne!(source_hash(&[], &a), source_hash(&[], &b));
        assert_ne!(source_hash(&[], &a), source_hash(&[], &c));
        assert_ne!(source_hash(&["-O3"], &a), source_hash(&[], &a));
        let crlf = vec![("a.cu".to_owned(), "x\r\ny".to_owned())];
        let lf = vec![("a.cu".to_owned(), "x\ny".to_owned())];
        assert_eq!(source_hash(&[], &crlf), source_hash(&[], &lf));
    }

    #[test]
    fn every_kernel_family_is_embedded() {
        assert_eq!(KERNEL_NAMES, &["score", "select", "filter"]);
        for ptx in [SCORE_PTX, SELECT_PTX, FILTER_PTX] {
            assert!(
                ptx.contains(".version 9.0"),
                "PTX ISA must be 9.0 (CUDA 13.0)"
            );
        }
    }
}
