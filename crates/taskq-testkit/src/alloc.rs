//! A counting global allocator, for the tests that prove "no allocation in
//! steady state". A test binary installs it with
//! `#[global_allocator] static A: CountingAllocator = CountingAllocator;`
//! and reads [`total`] (every thread) or [`in_this_thread`] (only the caller).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Forwards to the system allocator and counts every allocation and
/// reallocation (frees are not counted).
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAllocator;

static TOTAL: AtomicU64 = AtomicU64::new(0);
static ON_THREADS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    // Const-initialised and without a destructor, so reading it never allocates.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    TOTAL.fetch_add(1, Ordering::Relaxed);
    if COUNTING.with(Cell::get) {
        ON_THREADS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; the bookkeeping touches only atomics and a const thread-local.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations by every thread since the program started (only meaningful
/// when [`CountingAllocator`] is the global allocator).
pub fn total() -> u64 {
    TOTAL.load(Ordering::SeqCst)
}

/// Runs `f` and returns its result with the allocations this thread made meanwhile.
pub fn in_this_thread<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ON_THREADS.load(Ordering::SeqCst);
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, ON_THREADS.load(Ordering::SeqCst) - before)
}
