//! The memory of a numpy array (or any object with the buffer protocol), borrowed
//! for one call without copying.
//!
//! The buffer protocol joined the limited API only in CPython 3.11, so pyo3 offers no
//! `PyBuffer` to an abi3 module built for 3.9. `PyObject_GetBuffer` and
//! `PyBuffer_Release` are exported by every CPython 3 with the `Py_buffer` layout
//! below (the layout 3.11 made stable is the one 3.3 introduced), so this module
//! declares them itself.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void, CStr};
use switchyard::collective::DType;

/// CPython's `Py_buffer`.
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut pyo3::ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(
        obj: *mut pyo3::ffi::PyObject,
        view: *mut RawBuffer,
        flags: c_int,
    ) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// `PyBUF_FORMAT | PyBUF_STRIDES`: the format and the layout, read-only allowed, so
/// that this module can say what is wrong with an array instead of numpy.
const PYBUF_RECORDS_RO: c_int = 0x0004 | 0x0010 | 0x0008;

/// A borrowed buffer: released when dropped (the GIL is taken for that).
pub(crate) struct View {
    raw: RawBuffer,
}

// SAFETY: the view only holds a reference on the exporting object and pointers into
// its memory; it is released under the GIL (see `Drop`), and the memory is only
// touched by the call that borrowed it.
unsafe impl Send for View {}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("len", &self.raw.len)
            .field("readonly", &(self.raw.readonly != 0))
            .finish()
    }
}

impl View {
    /// Borrows `obj`'s memory, which must be C-contiguous, and writable unless
    /// `read_only_ok`; `call` names the call in the errors.
    pub(crate) fn borrow(obj: &Bound<'_, PyAny>, call: &str, read_only_ok: bool) -> PyResult<View> {
        let mut raw = std::mem::MaybeUninit::<RawBuffer>::zeroed();
        // SAFETY: `obj` is a live object (we hold the GIL) and `raw` has room for a
        // `Py_buffer`; on success the view is ours to release.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), raw.as_mut_ptr(), PYBUF_RECORDS_RO) };
        if rc != 0 {
            let cause = PyErr::take(obj.py());
            let what = obj
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string());
            let err = PyValueError::new_err(format!(
                "{call}: a {what} has no buffer (pass a numpy array)"
            ));
            err.set_cause(obj.py(), cause);
            return Err(err);
        }
        // SAFETY: PyObject_GetBuffer filled it in.
        let view = View {
            raw: unsafe { raw.assume_init() },
        };
        if view.raw.readonly != 0 && !read_only_ok {
            return Err(PyValueError::new_err(format!(
                "{call}: the array is read-only, and the result is written into it (pass a writable array, e.g. a.copy())"
            )));
        }
        if !view.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "{call}: the array is not C-contiguous, and it is used in place without a copy (pass np.ascontiguousarray(a))"
            )));
        }
        Ok(view)
    }

    /// Whether the elements lie one after the other in C order.
    fn is_c_contiguous(&self) -> bool {
        let r = &self.raw;
        if r.strides.is_null() || r.ndim == 0 || r.len == 0 {
            return true;
        }
        let ndim = usize::try_from(r.ndim).unwrap_or(0);
        // SAFETY: with PyBUF_STRIDES, shape and strides have `ndim` entries.
        let (shape, strides) = unsafe {
            (
                std::slice::from_raw_parts(r.shape, ndim),
                std::slice::from_raw_parts(r.strides, ndim),
            )
        };
        let mut expected = r.itemsize;
        for (&n, &stride) in shape.iter().zip(strides).rev() {
            if n > 1 && stride != expected {
                return false;
            }
            expected *= n;
        }
        true
    }

    /// Whether the buffer may not be written.
    pub(crate) fn is_read_only(&self) -> bool {
        self.raw.readonly != 0
    }

    /// The element type, from the buffer's format and item size.
    pub(crate) fn dtype(&self, call: &str) -> PyResult<DType> {
        let format = self.format();
        dtype_of(&format, self.raw.itemsize).ok_or_else(|| {
            PyValueError::new_err(format!(
                "{call}: arrays of format {format:?} ({} bytes each) are not supported: use float16, float32, float64, int32, int64, uint32, uint64 or uint8 (or uint16 holding bfloat16 bits, with dtype=\"bfloat16\")",
                self.raw.itemsize
            ))
        })
    }

    /// The element type a reduction reads the buffer as: its own ([`View::dtype`]),
    /// or the one `named` (only `"bfloat16"`, numpy having no such type), which needs
    /// 2-byte integers holding the bits (uint16, int16).
    pub(crate) fn reduced_as(&self, call: &str, named: Option<&str>) -> PyResult<DType> {
        match named {
            None => self.dtype(call),
            Some("bfloat16") if self.is_two_byte_integer() => Ok(DType::BF16),
            Some("bfloat16") => Err(PyValueError::new_err(format!(
                "{call}: dtype=\"bfloat16\" reads the array's memory as bfloat16 bits and needs a uint16 array, not one of {} bytes per element in format {:?} (convert with bits = (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16), which truncates, or pass an ml_dtypes.bfloat16 array)",
                self.raw.itemsize,
                self.format()
            ))),
            Some(other) => Err(PyValueError::new_err(format!(
                "{call}: dtype={other:?} is not supported: the only dtype to name is \"bfloat16\" (other types come from the array itself)"
            ))),
        }
    }

    /// The element type a call that only moves elements (allgather) gives the
    /// buffer: its own ([`View::dtype`]), or for 2-byte integers (uint16, int16,
    /// among them bfloat16 bits) [`DType::BF16`], which moves the same bytes.
    pub(crate) fn moved_as(&self, call: &str) -> PyResult<DType> {
        if self.is_two_byte_integer() {
            return Ok(DType::BF16);
        }
        self.dtype(call)
    }

    /// Whether the elements are 2-byte integers.
    fn is_two_byte_integer(&self) -> bool {
        self.raw.itemsize == 2 && matches!(format_code(&self.format()), Some(b'H' | b'h'))
    }

    /// The buffer's struct-module format ("B" when the exporter gives none).
    fn format(&self) -> String {
        if self.raw.format.is_null() {
            return "B".to_string();
        }
        // SAFETY: a non-null format is a NUL-terminated string owned by the view.
        unsafe { CStr::from_ptr(self.raw.format) }
            .to_string_lossy()
            .into_owned()
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        let len = usize::try_from(self.raw.len).unwrap_or(0);
        if len == 0 {
            return &[];
        }
        // SAFETY: the exporter keeps `len` bytes at `buf` until the view is released.
        unsafe { std::slice::from_raw_parts(self.raw.buf.cast::<u8>(), len) }
    }

    /// The bytes, to write. Only for a view that is not read-only.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        debug_assert!(!self.is_read_only());
        let len = usize::try_from(self.raw.len).unwrap_or(0);
        if len == 0 {
            return &mut [];
        }
        // SAFETY: as `bytes`, and the exporter allows writing (checked at borrow);
        // `&mut self` keeps this the only Rust reference to the memory.
        unsafe { std::slice::from_raw_parts_mut(self.raw.buf.cast::<u8>(), len) }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: the view was filled in by PyObject_GetBuffer and is released once.
        Python::with_gil(|_| unsafe { PyBuffer_Release(&mut self.raw) });
    }
}

/// The type code of a struct-module format in native byte order and alignment:
/// '@' or no prefix, or '=' / '<' on a little-endian machine, which is every machine
/// this runs on.
fn format_code(format: &str) -> Option<u8> {
    match format.as_bytes() {
        [c] => Some(*c),
        [b'@' | b'=' | b'<', c] if cfg!(target_endian = "little") => Some(*c),
        [b'@', c] => Some(*c),
        _ => None,
    }
}

/// The element type of a struct-module format code with item size `itemsize`
/// (numpy's float16 is 'e').
fn dtype_of(format: &str, itemsize: isize) -> Option<DType> {
    // Native byte order and alignment only: '@' or no prefix, or '=' / '<' on a
    // little-endian machine, which is every machine this runs on.
    let code = format_code(format)?;
    if (code, itemsize) == (b'e', 2) {
        return Some(DType::F16);
    }
    let float = matches!(code, b'f' | b'd');
    let signed = matches!(code, b'b' | b'h' | b'i' | b'l' | b'q');
    let unsigned = matches!(code, b'B' | b'H' | b'I' | b'L' | b'Q');
    match (itemsize, float, signed, unsigned) {
        (4, true, _, _) => Some(DType::F32),
        (8, true, _, _) => Some(DType::F64),
        (4, _, true, _) => Some(DType::I32),
        (8, _, true, _) => Some(DType::I64),
        (1, _, _, true) => Some(DType::U8),
        (4, _, _, true) => Some(DType::U32),
        (8, _, _, true) => Some(DType::U64),
        _ => None,
    }
}
