//! The engine's sizing rules (batch scratch beside the corpus).

use super::*;

/// Device bytes of an engine's slots with `scratch` bytes of batch
/// scratch.
fn slots(capacity: usize, d: usize, scratch: usize, c: &CudaConfig) -> usize {
    let mut c = c.clone();
    c.tuning.batch_scratch = scratch;
    Engine::shape_for(capacity, d, Dtype::F32, &c, false).bytes() * c.streams
}

#[test]
fn batch_scratch_falls_back_to_what_fits_beside_the_corpus() {
    // 300k rows: chunks of 256, 192 and 64 queries at the three sizes.
    let (n, d) = (300_000, 1024);
    let c = CudaConfig::default();
    let fixed = n * d * 4 + n * 4;
    let full = slots(n, d, c.tuning.batch_scratch, &c);
    let earlier = slots(n, d, 256 << 20, &c);
    let least = slots(n, d, 0, &c);
    assert!(
        full > earlier && earlier > least,
        "{full} {earlier} {least}"
    );
    let fit = |available| {
        Engine::fitting_scratch(n, d, Dtype::F32, &c, false, fixed, available).map(|(s, shape)| {
            assert!(shape.bytes() * c.streams + fixed <= available);
            (s, shape.sizes.chunk)
        })
    };
    // Room for the default: 256-query chunks.
    assert_eq!(fit(fixed + full), Some((c.tuning.batch_scratch, 256)));
    // One byte short: the earlier default.
    assert_eq!(fit(fixed + full - 1), Some((256 << 20, 192)));
    assert_eq!(fit(fixed + earlier), Some((256 << 20, 192)));
    // Then the smallest chunks, then nothing.
    assert_eq!(fit(fixed + earlier - 1), Some((0, 64)));
    assert_eq!(fit(fixed + least - 1), None);
    // A configured scratch below the fallbacks is never raised.
    let mut small = c.clone();
    small.tuning.batch_scratch = 1 << 20;
    let got = Engine::fitting_scratch(n, d, Dtype::F32, &small, false, fixed, usize::MAX);
    assert_eq!(got.map(|(s, _)| s), Some(1 << 20));
    // Sizes that overflow are refused, not wrapped.
    assert!(Engine::fitting_scratch(n, d, Dtype::F32, &c, false, usize::MAX, usize::MAX).is_none());
}
