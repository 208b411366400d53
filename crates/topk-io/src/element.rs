//! The element types topk files hold, and how each is spelled in `.npy`
//! headers and `.?vecs` files.
//!
//! The trait is sealed: memory-mapped views reinterpret file bytes as `T`,
//! which is sound only for plain numbers whose every bit pattern is a value.

use std::path::Path;

use ndarray_npy::WritableElement;

use crate::error::{Error, Result};
use crate::format::Format;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
    impl Sealed for u8 {}
    impl Sealed for i64 {}
    impl Sealed for u64 {}
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

    /// The value whose bytes are all zero.
    const ZERO: Self;

    /// Appends the little-endian bytes of `self`.
    fn put_le(self, out: &mut Vec<u8>);

    /// The value of `size_of::<Self>()` little-endian bytes.
    fn from_le(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $name:literal, [$($descr:literal),+], $vecs:expr) => {
        impl Element for $t {
            const NAME: &'static str = $name;
            const NPY_DESCRS: &'static [&'static str] = &[$($descr),+];
            const VECS: Option<Format> = $vecs;
            const ZERO: Self = 0 as $t;

            #[inline]
            fn put_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }

            #[inline]
            fn from_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
        }
    };
}

element!(f32, "float32", ["<f4"], Some(Format::Fvecs));
element!(i32, "int32", ["<i4"], Some(Format::Ivecs));
element!(u32, "uint32", ["<u4"], None);
element!(u8, "uint8", ["|u1", "<u1"], Some(Format::Bvecs));
element!(i64, "int64", ["<i8"], None);
element!(u64, "uint64", ["<u8"], None);

/// The expected-dtype text of messages: `float32 ('<f4')`.
pub(crate) fn describe<T: Element>() -> String {
    format!("{} ('{}')", T::NAME, T::NPY_DESCRS[0])
}

/// The bytes of a slice of elements, for reading a file straight into its
/// final buffer (the targets are little-endian, so file bytes are values).
pub(crate) fn as_bytes_mut<T: Element>(values: &mut [T]) -> &mut [u8] {
    let len = std::mem::size_of_val(values);
    // SAFETY: `T` is one of the sealed plain number types (no padding, no
    // invalid bit patterns), so every byte of the slice is initialised and
    // any bytes written through the view leave valid values. The view covers
    // exactly the slice's memory and borrows it mutably for its lifetime.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), len) }
}

/// A zeroed buffer of `count` elements, or a typed error naming the bytes
/// when the size overflows or the allocation fails.
pub(crate) fn alloc_zeroed<T: Element>(path: &Path, count: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    crate::memory::reserve(&mut v, count).map_err(|bytes| Error::OutOfMemory {
        path: path.to_owned(),
        bytes,
    })?;
    v.resize(count, T::ZERO);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_too_large_is_an_error_naming_the_bytes() {
        let p = Path::new("big.npy");
        // 2^62 values of 4 bytes do not fit in an address space.
        let e = alloc_zeroed::<f32>(p, 1 << 62).unwrap_err();
        assert!(
            matches!(e, Error::OutOfMemory { bytes, .. } if bytes == u64::MAX),
            "{e:?}"
        );
        // 4 TiB fits in addresses but not in this machine.
        let e = alloc_zeroed::<f32>(p, 1 << 40).unwrap_err();
        assert!(
            matches!(e, Error::OutOfMemory { bytes, .. } if bytes == 1 << 42),
            "{e:?}"
        );
        assert!(e.to_string().contains("4398046511104 bytes"), "{e}");
        assert_eq!(alloc_zeroed::<u8>(p, 3).unwrap(), vec![0, 0, 0]);
    }
}
