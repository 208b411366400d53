//! The PTX this crate loads, generated from `kernels/*.cu` by
//! `cargo xtask ptx` and committed, plus the source hash that ties each
//! generated file to the sources and flags it came from.
//!
//! The hash lives here (not in xtask) so that the generator and the staleness
//! test compute it with the same code.

/// nvcc flags every kernel is compiled with. No fast-math: the canonical score
/// (docs/CONTRACTS.md §2) needs IEEE division and square root, denormals kept and no
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

/// The kernel builds, one `.ptx` each: every family (`kernels/<family>.cu`)
/// as `<family>`, and each family of [`ROW_FAMILIES`] again per half-width
/// storage type as `<family>.<dtype>` ([`ROW_DTYPES`]).
pub const KERNEL_NAMES: &[&str] = &[
    "norms",
    "score_single",
    "score_batch",
    "score_ids",
    "select",
    "filter",
    "filter90",
    "rows",
    "walk",
    "norms.f16",
    "score_single.f16",
    "score_batch.f16",
    "score_ids.f16",
    "filter.f16",
    "filter90.f16",
    "rows.f16",
    "norms.bf16",
    "score_single.bf16",
    "score_batch.bf16",
    "score_ids.bf16",
    "filter.bf16",
    "filter90.bf16",
    "rows.bf16",
];

/// The families whose kernels read stored corpus rows: built once per
/// storage type, the rows' type set by `TOPK_ROW_DTYPE` (kernels/common.cuh).
pub const ROW_FAMILIES: &[&str] = &[
    "norms",
    "score_single",
    "score_batch",
    "score_ids",
    "filter",
    "filter90",
    "rows",
];

/// The half-width storage types the row families are built for: the name
/// suffix and the define.
pub const ROW_DTYPES: &[(&str, &str)] = &[
    ("f16", "-DTOPK_ROW_DTYPE=1"),
    ("bf16", "-DTOPK_ROW_DTYPE=2"),
];

/// The family (`.cu` file stem) of a build name: `score_single.f16` is
/// `score_single`.
pub fn family_of(name: &str) -> &str {
    name.split_once('.').map_or(name, |(family, _)| family)
}

/// The build name of `family` for rows stored as `dtype` ("f32", "f16",
/// "bf16"): the family itself for f32 or a family that reads no rows.
pub fn build_name(family: &str, dtype: &str) -> String {
    if dtype == "f32" || !ROW_FAMILIES.contains(&family) {
        family.to_owned()
    } else {
        format!("{family}.{dtype}")
    }
}

/// Families built for one architecture's own instructions instead of
/// [`NVCC_FLAGS`]' `-arch` (`wgmma` needs `sm_90a`); their PTX loads only on
/// a device of that compute capability.
pub const ARCH_FAMILIES: &[(&str, &str)] = &[("filter90", "-arch=compute_90a")];

/// The nvcc flags of one build: [`NVCC_FLAGS`], with its family's own
/// `-arch` where [`ARCH_FAMILIES`] names one, and its storage type's define.
pub fn family_flags(name: &str) -> Vec<&'static str> {
    let family = family_of(name);
    let arch = ARCH_FAMILIES
        .iter()
        .find(|(f, _)| *f == family)
        .map(|&(_, arch)| arch);
    let mut flags: Vec<&'static str> = NVCC_FLAGS
        .iter()
        .map(|&f| match arch {
            Some(a) if f.starts_with("-arch=") => a,
            _ => f,
        })
        .collect();
    if let Some((_, define)) = name
        .split_once('.')
        .and_then(|(_, dtype)| ROW_DTYPES.iter().find(|(d, _)| *d == dtype))
    {
        flags.push(define);
    }
    flags
}

/// Every flag that goes into the sources hash: [`NVCC_FLAGS`], then each
/// [`ARCH_FAMILIES`] entry.
pub fn hashed_flags() -> Vec<String> {
    let mut flags: Vec<String> = NVCC_FLAGS.iter().map(|f| (*f).to_owned()).collect();
    flags.extend(ARCH_FAMILIES.iter().map(|(n, a)| format!("{n}:{a}")));
    flags.extend(ROW_DTYPES.iter().map(|(n, d)| format!("{n}:{d}")));
    flags
}

/// First-line marker of a generated PTX file, followed by the hash.
pub const HASH_MARKER: &str = "// topk kernel sources hash: ";

/// PTX of `kernels/norms.cu`: canonical norms and the mapped query fetch.
pub const NORMS_PTX: &str = include_str!("../../../kernels/norms.ptx");
/// PTX of `kernels/score_single.cu`: the single-query scoring kernel and
/// the one-launch search.
pub const SCORE_SINGLE_PTX: &str = include_str!("../../../kernels/score_single.ptx");
/// PTX of `kernels/score_batch.cu`: the batch scoring kernels.
pub const SCORE_BATCH_PTX: &str = include_str!("../../../kernels/score_batch.ptx");
/// PTX of `kernels/score_ids.cu`: scores of listed (query, row) pairs.
pub const SCORE_IDS_PTX: &str = include_str!("../../../kernels/score_ids.ptx");
/// PTX of `kernels/select.cu`: threshold and exact selection.
pub const SELECT_PTX: &str = include_str!("../../../kernels/select.ptx");
/// PTX of `kernels/filter.cu`: tensor-core bounds and the filtered batch's
/// listing and rescoring.
pub const FILTER_PTX: &str = include_str!("../../../kernels/filter.ptx");

/// PTX of `kernels/filter90.cu`: the filtered batch's lower bounds from
/// Hopper's warpgroup tensor-core products (`sm_90a` only).
pub const FILTER90_PTX: &str = include_str!("../../../kernels/filter90.ptx");

/// PTX of `kernels/rows.cu`: moving, overwriting and hiding rows of the
/// mutable resident corpus, and scoring a list of rows.
pub const ROWS_PTX: &str = include_str!("../../../kernels/rows.ptx");

/// PTX of `kernels/walk.cu`: the graph walk, every query's HNSW search in
/// one launch.
pub const WALK_PTX: &str = include_str!("../../../kernels/walk.ptx");

/// Every build's PTX, in [`KERNEL_NAMES`] order (the half-width builds of
/// the row families are the same kernels over 16-bit rows).
pub const ALL_PTX: &[(&str, &str)] = &[
    ("norms", NORMS_PTX),
    ("score_single", SCORE_SINGLE_PTX),
    ("score_batch", SCORE_BATCH_PTX),
    ("score_ids", SCORE_IDS_PTX),
    ("select", SELECT_PTX),
    ("filter", FILTER_PTX),
    ("filter90", FILTER90_PTX),
    ("rows", ROWS_PTX),
    ("walk", WALK_PTX),
    ("norms.f16", include_str!("../../../kernels/norms.f16.ptx")),
    (
        "score_single.f16",
        include_str!("../../../kernels/score_single.f16.ptx"),
    ),
    (
        "score_batch.f16",
        include_str!("../../../kernels/score_batch.f16.ptx"),
    ),
    (
        "score_ids.f16",
        include_str!("../../../kernels/score_ids.f16.ptx"),
    ),
    (
        "filter.f16",
        include_str!("../../../kernels/filter.f16.ptx"),
    ),
    (
        "filter90.f16",
        include_str!("../../../kernels/filter90.f16.ptx"),
    ),
    ("rows.f16", include_str!("../../../kernels/rows.f16.ptx")),
    (
        "norms.bf16",
        include_str!("../../../kernels/norms.bf16.ptx"),
    ),
    (
        "score_single.bf16",
        include_str!("../../../kernels/score_single.bf16.ptx"),
    ),
    (
        "score_batch.bf16",
        include_str!("../../../kernels/score_batch.bf16.ptx"),
    ),
    (
        "score_ids.bf16",
        include_str!("../../../kernels/score_ids.bf16.ptx"),
    ),
    (
        "filter.bf16",
        include_str!("../../../kernels/filter.bf16.ptx"),
    ),
    (
        "filter90.bf16",
        include_str!("../../../kernels/filter90.bf16.ptx"),
    ),
    ("rows.bf16", include_str!("../../../kernels/rows.bf16.ptx")),
];

/// The PTX of build `name` ([`KERNEL_NAMES`]).
pub fn ptx_of(name: &str) -> Option<&'static str> {
    ALL_PTX
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, ptx)| ptx)
}

/// A stable 64-bit FNV-1a hash of the flags and every source file given as
/// `(file name, contents)`, in name order, as 16 hex digits.
///
/// Names take part so a renamed header changes the hash; the separators keep
/// `("ab", "c")` and `("a", "bc")` apart.
pub fn source_hash<F: AsRef<str>>(flags: &[F], files: &[(String, String)]) -> String {
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
        feed(f.as_ref().as_bytes());
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

    /// Every `.cu` / `.cuh` under kernels/, embedded at build time (so the
    /// test passes from any working directory). A file missing here changes
    /// the hash, so the staleness test below also fails when a new source
    /// is not listed.
    const KERNEL_SOURCES: &[(&str, &str)] = &[
        ("bounds.cuh", include_str!("../../../kernels/bounds.cuh")),
        ("common.cuh", include_str!("../../../kernels/common.cuh")),
        ("filter.cu", include_str!("../../../kernels/filter.cu")),
        ("filter90.cu", include_str!("../../../kernels/filter90.cu")),
        ("norms.cu", include_str!("../../../kernels/norms.cu")),
        ("pairs.cuh", include_str!("../../../kernels/pairs.cuh")),
        ("prune.cuh", include_str!("../../../kernels/prune.cuh")),
        ("rows.cu", include_str!("../../../kernels/rows.cu")),
        (
            "score_batch.cu",
            include_str!("../../../kernels/score_batch.cu"),
        ),
        (
            "score_ids.cu",
            include_str!("../../../kernels/score_ids.cu"),
        ),
        (
            "score_single.cu",
            include_str!("../../../kernels/score_single.cu"),
        ),
        ("select.cu", include_str!("../../../kernels/select.cu")),
        ("select.cuh", include_str!("../../../kernels/select.cuh")),
        ("shapes.cuh", include_str!("../../../kernels/shapes.cuh")),
        ("stage.cuh", include_str!("../../../kernels/stage.cuh")),
        ("walk.cu", include_str!("../../../kernels/walk.cu")),
    ];

    /// The sources as the generator hashes them.
    fn sources() -> Vec<(String, String)> {
        KERNEL_SOURCES
            .iter()
            .map(|&(name, text)| (name.to_owned(), text.to_owned()))
            .collect()
    }

    #[test]
    fn embedded_ptx_matches_kernel_sources() {
        let want = source_hash(&hashed_flags(), &sources());
        for &(name, ptx) in ALL_PTX {
            let got = recorded_hash(ptx);
            assert_eq!(
                got,
                Some(want.as_str()),
                "kernels/{name}.ptx: kernel sources changed: run `cargo xtask ptx` and commit"
            );
        }
    }

    #[test]
    fn every_row_family_has_every_storage_build() {
        for family in ROW_FAMILIES {
            assert!(KERNEL_NAMES.contains(family), "{family}");
            for (dtype, define) in ROW_DTYPES {
                let name = build_name(family, dtype);
                assert_eq!(name, format!("{family}.{dtype}"));
                assert!(KERNEL_NAMES.contains(&name.as_str()), "{name}");
                assert_eq!(family_of(&name), *family);
                assert!(family_flags(&name).contains(define), "{name}");
                let ptx = ptx_of(&name).expect("embedded");
                assert!(ptx.contains(&format!("from kernels/{family}.cu")), "{name}");
            }
            assert_eq!(build_name(family, "f32"), *family);
        }
        assert_eq!(build_name("select", "f16"), "select");
        assert_eq!(family_flags("score_single").len(), NVCC_FLAGS.len());
        assert_eq!(
            KERNEL_NAMES.len(),
            9 + ROW_FAMILIES.len() * ROW_DTYPES.len()
        );
    }

    #[test]
    fn hash_sees_names_contents_and_flags() {
        let a = vec![("a.cu".to_owned(), "x".to_owned())];
        let b = vec![("b.cu".to_owned(), "x".to_owned())];
        let c = vec![("a.cu".to_owned(), "y".to_owned())];
        let none: &[&str] = &[];
        assert_ne!(source_hash(none, &a), source_hash(none, &b));
        assert_ne!(source_hash(none, &a), source_hash(none, &c));
        assert_ne!(source_hash(&["-O3"], &a), source_hash::<&str>(&[], &a));
        let crlf = vec![("a.cu".to_owned(), "x\r\ny".to_owned())];
        let lf = vec![("a.cu".to_owned(), "x\ny".to_owned())];
        assert_eq!(source_hash(none, &crlf), source_hash(none, &lf));
    }

    #[test]
    fn every_kernel_family_is_embedded() {
        let names: Vec<&str> = ALL_PTX.iter().map(|&(name, _)| name).collect();
        assert_eq!(KERNEL_NAMES, names.as_slice());
        for &(_, ptx) in ALL_PTX {
            assert!(
                ptx.contains(".version 9.0"),
                "PTX ISA must be 9.0 (CUDA 13.0)"
            );
        }
        for &(name, ptx) in ALL_PTX {
            let arch = family_flags(name)
                .into_iter()
                .find_map(|f| f.strip_prefix("-arch=compute_"))
                .unwrap_or("");
            assert!(
                ptx.contains(&format!(".target sm_{arch}")),
                "kernels/{name}.ptx: built for sm_{arch}"
            );
        }
    }
}
