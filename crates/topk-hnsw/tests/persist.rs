//! Saving and loading: round trips, byte-identical deterministic builds, and
//! every kind of damaged file rejected with a typed error.

mod common;

use topk_core::{Metric, Retriever};
use topk_hnsw::{synth, Hnsw, HnswError, HnswParams, FORMAT_VERSION};

const DIM: usize = 12;

fn corpus() -> Vec<f32> {
    synth::gaussian_clusters(3_000, DIM, 16, 0.5, 99)
}

fn params(seed: u64) -> HnswParams {
    HnswParams {
        m: 8,
        ef_construction: 40,
        ef_search: 32,
        seed,
        ..HnswParams::default()
    }
}

fn small_index() -> Hnsw {
    Hnsw::build(&corpus()[..300 * DIM], DIM, Metric::Cosine, params(1)).unwrap()
}

#[test]
fn sequential_builds_are_byte_identical_for_the_same_seed() {
    let data = corpus();
    let a = Hnsw::build(&data, DIM, Metric::L2, params(42)).unwrap();
    let b = Hnsw::build(&data, DIM, Metric::L2, params(42)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (dir.path().join("a.hnsw"), dir.path().join("b.hnsw"));
    a.save(&pa).unwrap();
    b.save(&pb).unwrap();
    assert_eq!(std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
    let c = Hnsw::build(&data, DIM, Metric::L2, params(43)).unwrap();
    assert_ne!(a.to_bytes(), c.to_bytes(), "the seed must matter");
}

#[test]
fn round_trip_keeps_graph_and_answers() {
    let data = corpus();
    for metric in Metric::ALL {
        let index = Hnsw::build_parallel(&data, DIM, metric, params(5)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.hnsw");
        index.save(&path).unwrap();
        let back = Hnsw::load(&path).unwrap();
        assert_eq!(back.to_bytes(), index.to_bytes(), "{metric}");
        assert_eq!(back.params(), index.params());
        assert_eq!(back.stats(), index.stats());
        assert_eq!(
            (back.len(), back.dim(), back.metric()),
            (3_000, DIM, metric)
        );
        for q in data.chunks_exact(DIM).step_by(97) {
            let (x, y) = (index.search(q, 10).unwrap(), back.search(q, 10).unwrap());
            let bits = |v: &[topk_core::Neighbor]| {
                v.iter()
                    .map(|n| (n.index, n.score.to_bits()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&x), bits(&y), "{metric}");
        }
    }
}

#[test]
fn every_truncation_is_rejected() {
    let bytes = small_index().to_bytes();
    // Every cut inside the header, then a spread of cuts through the payload.
    let cuts = (0..120)
        .chain((120..bytes.len()).step_by(997))
        .chain([bytes.len() - 1]);
    for cut in cuts {
        let e = Hnsw::from_bytes(&bytes[..cut]).unwrap_err();
        assert!(
            matches!(e, HnswError::Truncated { got, .. } if got == cut as u64),
            "cut at {cut}: {e}"
        );
    }
}

#[test]
fn every_flipped_byte_is_rejected() {
    let bytes = small_index().to_bytes();
    let positions = (0..100)
        .chain((100..bytes.len()).step_by(331))
        .chain([bytes.len() - 1]);
    for at in positions {
        let mut bad = bytes.clone();
        bad[at] ^= 0x40;
        let e = Hnsw::from_bytes(&bad).unwrap_err();
        let expected = match at {
            0..8 => matches!(e, HnswError::BadMagic { .. }),
            8..12 => matches!(e, HnswError::UnsupportedVersion { .. }),
            12..100 => matches!(e, HnswError::ChecksumMismatch { part: "header", .. }),
            _ => matches!(
                e,
                HnswError::ChecksumMismatch {
                    part: "payload",
                    ..
                }
            ),
        };
        assert!(expected, "byte {at} flipped: {e}");
    }
}

#[test]
fn trailing_bytes_wrong_magic_and_version_are_rejected() {
    let mut bytes = small_index().to_bytes();
    bytes.extend_from_slice(&[0, 0]);
    assert!(matches!(
        Hnsw::from_bytes(&bytes),
        Err(HnswError::TrailingBytes { extra: 2, .. })
    ));
    assert!(matches!(
        Hnsw::from_bytes(b"PK\x03\x04 zip"),
        Err(HnswError::BadMagic { .. })
    ));
    assert!(matches!(
        Hnsw::from_bytes(b""),
        Err(HnswError::Truncated { got: 0, .. })
    ));
    let mut v2 = small_index().to_bytes();
    v2[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let e = Hnsw::from_bytes(&v2).unwrap_err();
    assert!(
        matches!(e, HnswError::UnsupportedVersion { found, supported } if found == FORMAT_VERSION + 1 && supported == FORMAT_VERSION),
        "{e}"
    );
    let e = Hnsw::load("/nonexistent/dir/index.hnsw").unwrap_err();
    assert!(
        matches!(e, HnswError::Io { .. }) && e.to_string().contains("/nonexistent/dir/index.hnsw"),
        "{e}"
    );
}

/// Rewrites both checksums so that only the structural checks stand between
/// a crafted file and the search.
fn reseal(bytes: &mut [u8]) {
    let crc = crc32fast::hash(&bytes[..96]);
    bytes[96..100].copy_from_slice(&crc.to_le_bytes());
    let end = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[100..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn consistent_checksums_do_not_admit_a_broken_graph() {
    let good = small_index().to_bytes();
    let n = 300usize;
    let m0 = 16usize;
    let layer0 = 100 + n;

    // A neighbour id beyond the corpus.
    let mut bad = good.clone();
    bad[layer0 + 4..layer0 + 8].copy_from_slice(&(n as u32 + 5).to_le_bytes());
    reseal(&mut bad);
    let e = Hnsw::from_bytes(&bad).unwrap_err();
    assert!(
        matches!(&e, HnswError::Corrupt { what } if what.contains("305")),
        "{e}"
    );

    // A list count above its capacity.
    let mut bad = good.clone();
    bad[layer0..layer0 + 4].copy_from_slice(&(m0 as u32 + 1).to_le_bytes());
    reseal(&mut bad);
    let e = Hnsw::from_bytes(&bad).unwrap_err();
    assert!(
        matches!(&e, HnswError::Corrupt { what } if what.contains("capacity 16")),
        "{e}"
    );

    // An entry node out of range.
    let mut bad = good.clone();
    bad[72..76].copy_from_slice(&(n as u32).to_le_bytes());
    reseal(&mut bad);
    assert!(matches!(
        Hnsw::from_bytes(&bad),
        Err(HnswError::Corrupt { .. })
    ));

    // A declared n that does not match the payload.
    let mut bad = good.clone();
    bad[24..32].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    reseal(&mut bad);
    assert!(matches!(
        Hnsw::from_bytes(&bad),
        Err(HnswError::Corrupt { .. })
    ));

    // A non-finite stored row value.
    let mut bad = good.clone();
    // The rows end where the 16-byte lifecycle section (no deletions) starts.
    let rows_at = bad.len() - 4 - 16 - n * DIM * 4;
    bad[rows_at..rows_at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    reseal(&mut bad);
    let e = Hnsw::from_bytes(&bad).unwrap_err();
    assert!(
        matches!(&e, HnswError::Corrupt { what } if what.contains("row 0")),
        "{e}"
    );

    // Unknown metric and invalid stored parameters.
    let mut bad = good.clone();
    bad[12..16].copy_from_slice(&9u32.to_le_bytes());
    reseal(&mut bad);
    assert!(
        matches!(Hnsw::from_bytes(&bad), Err(HnswError::Corrupt { what }) if what.contains("metric code 9"))
    );
    let mut bad = good;
    bad[32..40].copy_from_slice(&1u64.to_le_bytes());
    reseal(&mut bad);
    assert!(matches!(
        Hnsw::from_bytes(&bad),
        Err(HnswError::Corrupt { .. })
    ));
}

#[cfg(unix)]
#[test]
fn a_save_that_runs_out_of_space_keeps_the_previous_file() {
    const NAME: &str = "a_save_that_runs_out_of_space_keeps_the_previous_file";
    if !topk_testkit::files::full_disk_child(NAME) {
        return;
    }
    // In a child whose files stop at 512 bytes: a three-row index fits.
    let tiny = Hnsw::build(&[1.0, 0.0, 0.0, 1.0, 0.6, 0.8], 2, Metric::Dot, params(1)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index.hnsw");
    tiny.save(&path).unwrap();
    let before = std::fs::read(&path).unwrap();
    assert!(before.len() < 512, "{} bytes", before.len());
    let e = small_index().save(&path).unwrap_err();
    assert!(matches!(e, HnswError::Io { .. }), "{e}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "previous file intact"
    );
    assert_eq!(Hnsw::load(&path).unwrap().to_bytes(), tiny.to_bytes());
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "no temporary file left");
}

#[cfg(unix)]
#[test]
fn a_fifo_or_a_folder_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe.hnsw");
    topk_testkit::files::mkfifo(&fifo);
    let e = Hnsw::load(&fifo).unwrap_err();
    assert!(e.to_string().contains("is a FIFO"), "{e}");
    let e = Hnsw::load(dir.path()).unwrap_err();
    assert!(e.to_string().contains("is a directory"), "{e}");
}

/// A file that is not an index is refused from its header, before the rest
/// is read (a sparse 1 TiB file costs no memory), and the error names it.
#[test]
fn a_huge_file_of_something_else_is_refused_from_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.hnsw");
    let file = std::fs::File::create(&path).unwrap();
    if file.set_len(1 << 40).is_err() {
        eprintln!("skipped: this file system refuses a sparse 1 TiB file");
        return;
    }
    let e = Hnsw::load(&path).unwrap_err();
    assert!(
        matches!(&e, HnswError::File { source, .. } if matches!(**source, HnswError::BadMagic { .. })),
        "{e}"
    );
    assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");

    // A real header on a file longer than it declares: refused by length.
    let bytes = small_index().to_bytes();
    std::fs::write(&path, &bytes[..200]).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let e = Hnsw::load(&path).unwrap_err();
    assert!(
        matches!(&e, HnswError::File { source, .. } if matches!(**source, HnswError::TrailingBytes { .. })),
        "{e}"
    );
    // And one shorter than it declares.
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let e = Hnsw::load(&path).unwrap_err();
    assert!(
        matches!(&e, HnswError::File { source, .. } if matches!(**source, HnswError::Truncated { .. })),
        "{e}"
    );
}
