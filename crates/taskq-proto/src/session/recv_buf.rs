//! The receive buffer: bytes read from a peer and not yet consumed, grown only
//! when a frame needs more room and never past a cap set by the limits.

/// The first size of a receive buffer; it grows only when a frame needs more.
pub const INITIAL_RECV: usize = 4096;

/// Bytes received and not yet consumed, with room to read more into.
///
/// The reader asks for [`spare`](RecvBuf::spare) room, reads into it and says
/// how much arrived with [`filled`](RecvBuf::filled); the parser looks at
/// [`data`](RecvBuf::data) and [`consume`](RecvBuf::consume)s whole frames.
/// Consumed bytes stay in place until the next [`spare`](RecvBuf::spare), so a
/// parsed frame may keep borrowing them. The buffer never grows past its cap:
/// a frame that does not fit is the peer's fault and the answer is
/// [`Full`].
#[derive(Debug, Clone)]
pub struct RecvBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    cap: usize,
}

/// A receive buffer at its cap holds no whole frame: the peer sent more than
/// the limits allow in one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl RecvBuf {
    /// An empty buffer of `initial` bytes (at most `cap`) that grows up to `cap`.
    pub fn new(initial: usize, cap: usize) -> RecvBuf {
        RecvBuf {
            buf: vec![0; initial.min(cap).max(1)],
            start: 0,
            end: 0,
            cap: cap.max(1),
        }
    }

    /// The bytes received and not yet consumed.
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// How many bytes are waiting.
    #[inline]
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// True when nothing is waiting.
    #[inline]
    pub fn is_empty(&self) -> bool {
        // `consume` moves both ends to the front whenever they meet.
        self.end == 0
    }

    /// The whole buffer from the first unconsumed byte: what a frame parsed from
    /// [`data`](RecvBuf::data) borrows, even after [`consume`](RecvBuf::consume).
    #[inline]
    pub(crate) fn from(&self, at: usize) -> &[u8] {
        &self.buf[at..]
    }

    /// Where the unconsumed bytes start in the buffer.
    #[inline]
    pub(crate) fn start(&self) -> usize {
        self.start
    }

    /// Marks the first `n` waiting bytes as used. When none are left the next
    /// read starts at the front again.
    #[inline]
    pub fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len());
        self.start += n.min(self.len());
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Drops everything waiting.
    pub fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Room to read into: moves waiting bytes to the front or grows (doubling,
    /// never past the cap) when the buffer is full. [`Full`] when it is at its
    /// cap with no byte consumed.
    #[inline]
    pub fn spare(&mut self) -> Result<&mut [u8], Full> {
        if self.end == self.buf.len() {
            self.make_room()?;
        }
        Ok(&mut self.buf[self.end..])
    }

    /// The whole spare room when nothing is waiting: the hot path's read, which
    /// needs neither a move nor a growth check.
    #[inline]
    pub(crate) fn empty_spare(&mut self) -> &mut [u8] {
        debug_assert!(self.is_empty());
        &mut self.buf
    }

    /// Says that `n` bytes were read into the room [`spare`](RecvBuf::spare) gave.
    #[inline]
    pub fn filled(&mut self, n: usize) {
        debug_assert!(self.end + n <= self.buf.len());
        self.end = (self.end + n).min(self.buf.len());
    }

    /// The buffer's current size (for tests of its growth).
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    #[cold]
    fn make_room(&mut self) -> Result<(), Full> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            return Ok(());
        }
        if self.buf.len() >= self.cap {
            return Err(Full);
        }
        let grown = self
            .buf
            .len()
            .saturating_mul(2)
            .max(INITIAL_RECV)
            .min(self.cap);
        self.buf.resize(grown, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_and_no_further() {
        let mut b = RecvBuf::new(4, 10);
        b.spare().unwrap()[..4].copy_from_slice(b"abcd");
        b.filled(4);
        // Full at 4 bytes: grows (to the cap, since INITIAL_RECV is larger).
        assert_eq!(b.spare().unwrap().len(), 6);
        b.filled(6);
        assert_eq!(b.spare(), Err(Full));
        assert_eq!(b.capacity(), 10);
        // Consuming makes room by moving the rest to the front.
        b.consume(3);
        assert_eq!(b.spare().unwrap().len(), 3);
        assert_eq!(&b.data()[..1], b"d");
    }

    #[test]
    fn draining_resets_to_the_front() {
        let mut b = RecvBuf::new(8, 8);
        b.spare().unwrap()[..2].copy_from_slice(b"hi");
        b.filled(2);
        b.consume(2);
        assert!(b.is_empty());
        assert_eq!(b.spare().unwrap().len(), 8);
    }
}
