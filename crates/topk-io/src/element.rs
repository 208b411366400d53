//! The element types topk files hold, and how each is spelled in `.npy`
//! headers and `.?vecs` files.
//!
//! The trait is sealed: memory-mapped views reinterpret file bytes as `T`,
//! which is sound only for plain numbers whose every bit pattern is a value.

use ndarray_npy::WritableElement;

use crate::format::Format;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
    impl Sealed for u8 {}
    impl Sealed for i64 {}
}

/// A number type topk reads from and writes to files.
///
/// Implemented for `f32` (vectors), `i32` and `u32` (row ids), `u8` (byte
/// vectors) and `i64` (ids as numpy's default integer).
pub trait Element: Copy + Send + Sync + 'static + WritableElement + sealed::Sealed {
    /// Name used in messages (`float32`, `int32`, ...).
    const NAME: &'static str;
    /// The `.npy` type descriptors read as this type, little-endian first.
    const NPY_DESCRS: &'static [&'static str];
    /// The `.?vecs` format holding this type, if there is one.
    const VECS: Option<Format>;

    /// Appends the little-endian bytes of `self`.
    fn put_le(self, out: &mut Vec<u8>);
}

macro_rules! element {
    ($t:ty, $name:literal, [$($descr:literal),+], $vecs:expr) => {
        impl Element for $t {
            const NAME: &'static str = $name;
            const NPY_DESCRS: &'static [&'static str] = &[$($descr),+];
            const VECS: Option<Format> = $vecs;

            #[inline]
            fn put_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    };
}

element!(f32, "float32", ["<f4"], Some(Format::Fvecs));
element!(i32, "int32", ["<i4"], Some(Format::Ivecs));
element!(u32, "uint32", ["<u4"], None);
element!(u8, "uint8", ["|u1", "<u1"], Some(Format::Bvecs));
element!(i64, "int64", ["<i8"], None);

/// The expected-dtype text of messages: `float32 ('<f4')`.
pub(crate) fn describe<T: Element>() -> String {
    format!("{} ('{}')", T::NAME, T::NPY_DESCRS[0])
}
