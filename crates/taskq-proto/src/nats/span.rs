//! [`Span`]: where a part of a server operation lies in the buffer it was
//! parsed from. Its own file so that the operation parser and the header
//! reader both take it from here.

/// A range of bytes in the buffer a frame was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

impl Span {
    /// The bytes of this span in `buf` (the buffer it was parsed from).
    #[inline]
    pub fn of<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.start..self.end]
    }
}
